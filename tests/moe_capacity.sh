#!/usr/bin/env bash
# moe_capacity.sh PARALLAX — token dropping by a capacity factor (docs/moe.md, "Token
# dropping") through the command line: `plan --moe-capacity-factor` writes it as the model's
# moe.capacity_factor (the one field every reader takes, no second copy in the plan); `run`
# drops the copies past capacity and says how many, per MoE layer, on the terminal and in
# run.json; memory per category equals the prediction.
#
# The figures, by hand: tiny-moe (8 experts, top-2, 3 MoE layers) at 2 ranks, ep 2, forced
# balance, capacity factor 0.5. A micro-batch of N tokens on a rank sends each expert
# N x 2 / 8 = N/4 copies, of which it keeps ceil(0.5 x N/4) = N/8: N/8 x 8 = N copies dropped.
# Summed over the ranks' micro-batches that is every token of the step, 8 x 64 = 512 per MoE
# layer and step, whatever the micro-batch size: 2 steps x 3 layers x 512 = 3072 in all.
set -u
px=${1:?usage: moe_capacity.sh path/to/parallax}
dir=$(mktemp -d /tmp/px-capacity.XXXXXX)
trap 'rm -rf "$dir"' EXIT
export PARALLAX_UNCALIBRATED=1
fails=0
fail() { echo "FAILED: $*"; fails=$((fails + 1)); }

"$px" plan --model tiny-moe --cluster local --gpus 2 --gbs 8 --ep 2 --moe-force-balance \
  --moe-capacity-factor 0.5 -o "$dir/p.json" >"$dir/plan.out" 2>&1 || fail "plan: $(tail -3 "$dir/plan.out")"
python3 - "$dir/p.json" <<'PY' || fail "the plan does not carry the capacity factor as the model's"
import json, sys
p = json.load(open(sys.argv[1]))
assert p["model"]["moe"]["capacity_factor"] == 0.5, p["model"]["moe"]
assert "moe_capacity_factor" not in json.dumps(p), "a second copy of the capacity factor"
PY
"$px" run "$dir/p.json" --steps 2 -o "$dir/run.json" >"$dir/run.out" 2>&1 || fail "run: $(tail -3 "$dir/run.out")"
grep -Eq "^token dropping \(capacity factor 0.5, [0-9]+ copies per expert and rank\): 3072 copies dropped over 2 step\(s\); per MoE layer 1: 1024 2: 1024 3: 1024$" "$dir/run.out" \
  || fail "run does not print the drops: $(grep -i drop "$dir/run.out")"
grep -q "DIFFERS" "$dir/run.out" && fail "a measurement differs from the prediction: $(grep DIFFERS "$dir/run.out")"
python3 - "$dir/run.json" <<'PY' || fail "run.json's drops"
import json, sys
m = json.load(open(sys.argv[1]))["moe"]
assert m["routing"] == "capacity" and m["capacity_factor"] == 0.5, m
assert m["dropped_total"] == 3072, m["dropped_total"]
for l in m["layers"]:
    assert l["dropped"] == [512, 512] and l["dropped_total"] == 1024, l
PY
[ "$fails" -eq 0 ] && echo "moe_capacity: plan, run, terminal and run.json agree: 3072 copies dropped"
exit $((fails > 0))

#!/usr/bin/env bash
# moe_dropless.sh PARALLAX — dropless MoE routing (docs/moe.md, "Dropless routing"): the plan a
# newcomer makes for tiny-moe on this machine (no --moe-imbalance, no forced balance) trains;
# the router, untrained, sends rank 0's experts more token copies than the plan's balanced
# buffers (512 rows), which grow instead of dropping a copy. run.json records each MoE layer's
# measured imbalance, the bytes it grew and in which step; memory per category is the
# prediction plus those bytes; compare marks the grown rows; forced balance grows nothing.
#
# The figures, by hand: tiny-moe (h 64, expert_ffn 64, SwiGLU) at 2 ranks, ep 2, one
# micro-batch of 4 x 64 tokens, top-2: a rank's experts are planned 256 x 2 = 512 rows. A grown
# micro-batch's saved rows take (64 + 128 + 64) x 4 = 1024 bytes a row, the receive and gradient
# scratch 64 x 4 = 256 bytes a row each, rounded up to 64 rows. Rank 0 took 574 rows in layer 1
# at step 1 (576 rows: 589,824 + 2 x 147,456 = 884,736 bytes), 652 and 654 in layers 2 and 3 (704 rows:
# 720,896 each, layer 2 also the scratch from 576 to 704 rows, 65,536), and 596 in layer 1 at
# step 2 (640 rows: 65,536 more).
set -u
px=${1:?usage: moe_dropless.sh path/to/parallax}
dir=$(mktemp -d /tmp/px-dropless.XXXXXX)
trap 'rm -rf "$dir"' EXIT
export PARALLAX_UNCALIBRATED=1
fails=0
fail() { echo "FAILED: $*"; fails=$((fails + 1)); }

"$px" plan --model tiny-moe --cluster local --gpus 2 --gbs 8 --ep 2 -o "$dir/p.json" >"$dir/plan.out" 2>&1 \
  || fail "plan: $(tail -3 "$dir/plan.out")"
"$px" run "$dir/p.json" --steps 2 -o "$dir/run.json" >"$dir/run.out" 2>&1 || fail "run: $(tail -3 "$dir/run.out")"
grep -q "^grown: the router sent a rank's experts more token copies" "$dir/run.out" \
  || fail "run does not say its buffers grew: $(tail -5 "$dir/run.out")"
grep -q "^  MoE layer 2: imbalance 1.273 measured, 786432 bytes grown$" "$dir/run.out" \
  || fail "run does not print layer 2's imbalance and growth: $(tail -4 "$dir/run.out")"
python3 - "$dir/run.json" <<'PY' || fail "run.json's dropless figures"
import json, sys
r = json.load(open(sys.argv[1]))
m = r["moe"]
def eq(what, want, got):
    if want != got:
        sys.exit("%s: expected %r, got %r" % (what, want, got))
eq("routing", "dropless", m["routing"])
eq("planned_imbalance", 1, m["planned_imbalance"])
eq("planned_rows", 512, m["planned_rows"])
eq("layers", [1, 2, 3], [l["layer"] for l in m["layers"]])
eq("rows_max", [596, 652, 654], [l["rows_max"] for l in m["layers"]])
eq("imbalance", [596 / 512, 652 / 512, 654 / 512], [l["imbalance"] for l in m["layers"]])
eq("extra_bytes", [950272, 786432, 720896], [l["extra_bytes"] for l in m["layers"]])
eq("growth", [[{"step": 1, "bytes": 884736}, {"step": 2, "bytes": 65536}],
              [{"step": 1, "bytes": 786432}], [{"step": 1, "bytes": 720896}]],
   [l["growth"] for l in m["layers"]])
eq("extra_bytes total", 2457600, m["extra_bytes"])
ranks = r["memory"]["per_rank"]
eq("rank 0 grown", {"activations": 2097152, "comm_buffers": 180224, "workspace": 180224},
   ranks[0].get("moe_dropless_bytes"))
eq("rank 1 grown", None, ranks[1].get("moe_dropless_bytes"))
eq("steps", 2, len(r["steps"]))
PY
"$px" compare "$dir/p.json" "$dir/run.json" >"$dir/compare.out" 2>&1 || fail "compare: $(tail -3 "$dir/compare.out")"
for cat in activations comm_buffers workspace; do
  grep -q "^memory rank 0 $cat (dropless growth) " "$dir/compare.out" || fail "compare does not mark rank 0 $cat grown"
done
grep -q "^memory rank 1 activations (dropless" "$dir/compare.out" && fail "compare marks rank 1, which grew nothing"
grep -q "^MoE buffers grown past the plan" "$dir/compare.out" || fail "compare has no growth table"
grep -Eq "^ +2 +1\.000 +1\.273 +786432$" "$dir/compare.out" || fail "compare's growth row of layer 2: $(grep -A4 '^MoE buffers grown' "$dir/compare.out")"

# forced balance: every rank takes its share, nothing grows, memory equals the prediction
"$px" plan --model tiny-moe --cluster local --gpus 2 --gbs 8 --ep 2 --moe-force-balance -o "$dir/pf.json" >/dev/null 2>&1 \
  || fail "plan with forced balance"
"$px" run "$dir/pf.json" --steps 2 -o "$dir/runf.json" >"$dir/runf.out" 2>&1 || fail "forced run: $(tail -3 "$dir/runf.out")"
python3 - "$dir/runf.json" <<'PY' || fail "forced balance grew buffers"
import json, sys
m = json.load(open(sys.argv[1]))["moe"]
assert m["extra_bytes"] == 0 and all(l["growth"] == [] and l["imbalance"] == 1 for l in m["layers"]), m
PY
grep -q "grown" "$dir/runf.out" && fail "forced run says grown: $(grep grown "$dir/runf.out")"

[ $fails -eq 0 ] && echo "moe_dropless: tiny-moe's default plan trains dropless; 2,457,600 bytes grown on rank 0, recorded per layer and step"
exit $((fails > 0))

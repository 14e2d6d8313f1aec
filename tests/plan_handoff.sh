#!/usr/bin/env bash
# plan_handoff.sh PARALLAX — the plan is the whole hand-off (docs/formats.md, "Plan"): a profile
# override given to the planner reaches every reader of the plan, which use the plan's own
# prediction and profile; version 1 plans still load, with a warning; a version 2 plan without
# its profile is refused.
set -u
px=${1:?usage: plan_handoff.sh path/to/parallax}
dir=$(mktemp -d /tmp/px-handoff.XXXXXX)
trap 'rm -rf "$dir"' EXIT
export PARALLAX_UNCALIBRATED=1
fails=0
fail() { echo "FAILED: $*"; fails=$((fails + 1)); }

"$px" plan --model tiny --cluster local --gpus 1 --gbs 8 --mbs 4 --tp 1 --pp 1 \
    --set device.peak_flops.fp32=1e9 -o "$dir/p.json" >"$dir/plan.out" 2>&1 || fail "plan: $(cat "$dir/plan.out")"
step=$(python3 -c 'import json,sys; p=json.load(open(sys.argv[1])); assert p["schema_version"] == 2; assert p["profile"]["device"]["peak_flops"]["fp32"] == 1e9; print("%.4f" % p["prediction"]["time"]["step_s"])' "$dir/p.json") \
    || fail "the plan does not carry its profile and prediction"
# the slow profile predicts over a second a step; the built-in one some hundredths
awk -v s="$step" 'BEGIN { exit !(s > 1.0) }' || fail "predicted step $step s: the override did not apply"

# run prints the plan's own prediction, not one made again on this host's 'local'
"$px" run "$dir/p.json" --steps 3 -o "$dir/run.json" >"$dir/run.out" 2>&1 || fail "run: $(tail -3 "$dir/run.out")"
grep -q "step time (s) *$step " "$dir/run.out" && grep -q "predicted by the plan on its local profile" "$dir/run.out" \
    || fail "run does not print the plan's predicted step $step: $(grep 'step time' "$dir/run.out")"
"$px" compare "$dir/p.json" "$dir/run.json" >"$dir/compare.out" 2>&1 || fail "compare: $(tail -3 "$dir/compare.out")"
"$px" export "$dir/p.json" --format megatron >/dev/null 2>&1 || fail "export of a version 2 plan"

# version 1: no profile; it loads, the profile resolved by name here, with a warning
python3 -c 'import json,sys; p=json.load(open(sys.argv[1])); p["schema_version"] = 1; del p["profile"]; json.dump(p, open(sys.argv[2], "w"))' \
    "$dir/p.json" "$dir/v1.json"
"$px" export "$dir/v1.json" --format deepspeed >"$dir/v1.out" 2>"$dir/v1.err" || fail "export of a version 1 plan: $(cat "$dir/v1.err")"
grep -q "schema_version 1 carries no cluster profile: 'local' is resolved on this host" "$dir/v1.err" \
    || fail "no warning for a version 1 plan: $(cat "$dir/v1.err")"
"$px" run "$dir/v1.json" --steps 2 -o "$dir/run1.json" >"$dir/run1.out" 2>&1 || fail "run of a version 1 plan: $(tail -3 "$dir/run1.out")"

# version 2 without its profile, or a version this build does not know: refused, exit 2
python3 -c 'import json,sys; p=json.load(open(sys.argv[1])); del p["profile"]; json.dump(p, open(sys.argv[2], "w")); p["schema_version"] = 3; json.dump(p, open(sys.argv[3], "w"))' \
    "$dir/p.json" "$dir/noprof.json" "$dir/v3.json"
for f in noprof v3; do
  "$px" export "$dir/$f.json" --format megatron >"$dir/$f.out" 2>&1
  rc=$?
  [ $rc -eq 2 ] || fail "$f: exit $rc, expected 2"
done
grep -q "profile: missing" "$dir/noprof.out" || fail "noprof: $(cat "$dir/noprof.out")"
grep -q "schema_version" "$dir/v3.out" || fail "v3: $(cat "$dir/v3.out")"

[ $fails -eq 0 ] && echo "plan_handoff: predicted step $step s carried from plan to run, compare and export; version 1 loads; bad versions refused"
exit $((fails > 0))

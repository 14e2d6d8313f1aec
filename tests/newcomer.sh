#!/usr/bin/env bash
# newcomer.sh PARALLAX ZOO "RANKS..." — what a new user does first: for every zoo model that
# fits this machine, `parallax plan` with nothing pinned on --cluster local (the GPU counts a
# newcomer types: RANKS, e.g. "1 2 4"), then `parallax run` of that plan for 2 steps. A refusal
# anywhere in that path (the planner finding no layout the executor runs, the executor refusing
# the layout the planner wrote) fails the test, but for the models expected_refusal names with
# the reason the planner must give: the planner on local and the executor consult
# one statement of what runs (model_exec_refusal), and this is where they must agree.
#
# Which models fit is parallax's own prediction, made without the executor's verdict: the same
# plan on a copy of the local cluster under another name (plan consults the executor only for
# "local"). A model is left out when no layout fits the device memory, or when the best
# layout's predicted step takes more than BOUND_S (the test stays quick on 2 cores); each one
# left out is printed with its reason. Any other failure of that plan fails the test too.
set -u
px=${1:?usage: newcomer.sh PARALLAX ZOO-DIR \"RANKS...\"}
zoo=${2:?usage: newcomer.sh PARALLAX ZOO-DIR \"RANKS...\"}
ranks=${3:-1}
BOUND_S=1.0 # predicted seconds a step; the tiny models predict 0.03-0.2 s, gpt2-124m 205 s
dir=$(mktemp -d /tmp/px-newcomer.XXXXXX)
trap 'rm -rf "$dir"' EXIT
export PARALLAX_UNCALIBRATED=1 # local's generic figures, as on a fresh checkout
src=$(dirname "$0")/..
sed 's/"name": "local"/"name": "this-machine-unchecked"/' "$src/profiles/clusters/local.json" >"$dir/mem.json"
fails=0 trained=0 left=0
fail() { echo "FAILED: $*"; fails=$((fails + 1)); }
# The zoo models the executor still refuses, each with the refusal expected: the planner must
# give exactly that reason. When the executor comes to run one, its plan goes through and the
# test fails until the line here goes.
expected_refusal() {
  case "$1" in
  *) echo "" ;;
  esac
}
refused=0

for f in "$zoo"/*.json; do
  m=$(basename "$f" .json)
  for g in $ranks; do
    # fits? (memory and time, the executor not asked)
    if ! "$px" plan --model "$m" --cluster "$dir/mem.json" --gpus "$g" --gbs 8 -o "$dir/fit.json" \
      >"$dir/fit.out" 2>&1; then
      if grep -q "does not fit in device memory" "$dir/fit.out"; then
        echo "left out: $m on $g: $(grep -o 'peak [0-9.]* GiB[^)]*' "$dir/fit.out" | head -1)"
        left=$((left + 1))
        continue
      fi
      fail "$m on $g: plan on a copy of local: $(tail -2 "$dir/fit.out")"
      continue
    fi
    step=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['prediction']['time']['step_s'])" "$dir/fit.json")
    if python3 -c "import sys; sys.exit(float(sys.argv[1]) <= float(sys.argv[2]))" "$step" "$BOUND_S"; then
      printf 'left out: %s on %s: a step predicted at %.1f s, over the %s s bound\n' "$m" "$g" "$step" "$BOUND_S"
      left=$((left + 1))
      continue
    fi
    # fits: the newcomer's plan and run must both go through
    p="$dir/$m-$g.json"
    want=$(expected_refusal "$m")
    if ! "$px" plan --model "$m" --cluster local --gpus "$g" --gbs 8 -o "$p" >"$dir/plan.out" 2>&1; then
      if [ -n "$want" ] && grep -qF "$want" "$dir/plan.out"; then
        echo "refused:  $m on $g, as expected: $want"
        refused=$((refused + 1))
        continue
      fi
      fail "$m on $g: parallax plan --cluster local refused: $(tail -2 "$dir/plan.out")"
      continue
    fi
    if [ -n "$want" ]; then
      fail "$m on $g: planned, but the test expects the refusal \"$want\": take it out of expected_refusal"
      continue
    fi
    if ! timeout 120 "$px" run "$p" --steps 2 -o "$dir/run.json" >"$dir/run.out" 2>&1; then
      fail "$m on $g: parallax run of the plan refused or failed: $(tail -3 "$dir/run.out")"
      continue
    fi
    if ! line=$(python3 - "$p" "$dir/run.json" <<'PY'
import json, math, sys
p, r = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
s = r["steps"]
if len(s) != 2 or not all(math.isfinite(x["loss"]) and x["loss"] > 0 for x in s):
    sys.exit("run.json's steps: %r" % s)
l = p["layout"]
knobs = " ".join("%s %s" % (k, l[k]) for k in ("dp", "tp", "pp", "cp", "ep", "vpp", "zero") if k in l)
print("%s, losses %.4f %.4f" % (knobs, s[0]["loss"], s[1]["loss"]))
PY
    ); then
      fail "$m on $g: $line"
      continue
    fi
    echo "trained:  $m on $g: $line"
    trained=$((trained + 1))
  done
done
[ $trained -gt 0 ] || fail "no zoo model was planned and trained"
echo "newcomer: $trained plans trained, $left left out, $refused refused as expected, $fails failed"
exit $((fails > 0))

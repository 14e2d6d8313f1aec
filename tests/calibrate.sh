#!/usr/bin/env bash
# parallax calibrate end to end: a quick calibration writes a profile that loads, carries the
# measurements (GEMMs, op rates per concurrency, collectives when there are 2 ranks), and
# changes the simulator's prediction; bad options exit 2 naming what is wrong.
# Usage: calibrate.sh PARALLAX [RANKS]   (RANKS 2 needs mpirun)
set -u
px=${1:?usage: calibrate.sh path/to/parallax [ranks]}
ranks=${2:-1}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAILED: $*"; fails=$((fails + 1)); }

# measurements must not depend on this machine's own calibration, nor land in the tree
export PARALLAX_PROFILE_DIR=$tmp/none
if ! "$px" calibrate --quick --ranks "$ranks" -o "$tmp/p.json" >"$tmp/log" 2>&1; then
  fail "calibrate --quick --ranks $ranks"
  cat "$tmp/log"
  exit 1
fi
grep -q 'fitted rates' "$tmp/p.calibration.txt" || fail "no fitted rates in the log beside the profile"
grep -q 'fitted rates' "$tmp/log" && fail "the tables printed on the terminal, not in the log"
[ -f "$tmp/none/local-$(hostname).json" ] && fail "wrote the default profile although -o was given"

# the profile loads and holds what was measured
for key in '"measured"' '"gemm"' '"ops"' '"variant":[[:space:]]*"attn.qkv/learned"' \
           '"variant":[[:space:]]*"gelu"' '"concurrency":[[:space:]]*1'; do
  grep -Eq "$key" "$tmp/p.json" || fail "profile lacks $key"
done
if [ "$ranks" -ge 2 ]; then
  # ... and the ranks together train a context-parallel ring, whose attention core has its own rate
  for key in '"allreduce"' '"all_gather"' '"reduce_scatter"' '"sendrecv"' "\"concurrency\":[[:space:]]*$ranks" \
             '"variant":[[:space:]]*"hd16/ring"'; do
    grep -Eq "$key" "$tmp/p.json" || fail "profile lacks $key"
  done
  grep -q 'busbw' "$tmp/p.calibration.txt" || fail "no bus bandwidth table in the log"
fi
"$px" profiles >/dev/null || fail "profiles"

# it changes the prediction (one rank of tiny: every op is timed from the measurements)
step() { "$px" simulate --model tiny --gpus 1 --cluster "$1" --json | grep -m1 '"step_s"' | tr -dc '0-9.e-'; }
uncal=$(PARALLAX_UNCALIBRATED=1 step local)
cal=$(step "$tmp/p.json")
if [ -z "$cal" ] || [ -z "$uncal" ] || [ "$cal" = "$uncal" ]; then
  fail "calibrated step '$cal' should differ from the generic '$uncal'"
fi
# ... and `local` picks it up from PARALLAX_PROFILE_DIR
mkdir -p "$tmp/dir" && cp "$tmp/p.json" "$tmp/dir/local-$(hostname).json"
local_step=$(PARALLAX_PROFILE_DIR=$tmp/dir step local)
[ "$local_step" = "$cal" ] || fail "--cluster local gave $local_step, the calibrated profile $cal"

# bad input: exit 2 and a message naming it
expect() {
  local needle=$1
  shift
  local out got
  out=$("$px" calibrate "$@" -o "$tmp/bad.json" 2>&1)
  got=$?
  if [ "$got" -ne 2 ] || ! grep -qF -- "$needle" <<<"$out"; then
    fail "calibrate $*: expected status 2 and '$needle', got $got: $(head -c 300 <<<"$out")"
  fi
}
expect "--ranks" --ranks 0
expect "--ranks" --ranks many
expect "--backend" --backend tpu
expect "no-such-model" --quick --ranks 1 --models no-such-model
expect "no-such-cluster" --quick --ranks 1 --base no-such-cluster
expect "--launcher" --launcher ssh
expect "unknown option" --frobnicate
[ -f "$tmp/bad.json" ] && fail "a failed calibration left a profile behind"
"$px" calibrate --help | grep -q -- '--ranks' || fail "calibrate --help"

if [ "$fails" -ne 0 ]; then
  echo "$fails failures"
  exit 1
fi
echo "calibrate: all checks passed (ranks $ranks)"

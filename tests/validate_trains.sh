#!/usr/bin/env bash
# parallax validate trains every layout it times for real: each run's loss falls, every layout
# follows the same trajectory (the single-rank one), and the table says so in its last line.
# Usage: validate_trains.sh PARALLAX   (two-rank layouts: needs mpirun)
set -u
px=${1:?usage: validate_trains.sh path/to/parallax}
command -v python3 >/dev/null || { echo "SKIPPED: python3 reads the JSON"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# the generic local profile: this machine's calibration must not change what is checked
export PARALLAX_UNCALIBRATED=1 PARALLAX_PROFILE_DIR=$tmp/none
if ! "$px" validate --model tiny --steps 5 --max-ranks 2 --report "$tmp/v" >"$tmp/out" 2>&1 ||
  ! "$px" validate --model tiny --steps 5 --max-ranks 2 --report "$tmp/j" --json >"$tmp/v.json" 2>"$tmp/err"; then
  echo "FAILED: parallax validate"
  cat "$tmp/out" "$tmp/err"
  exit 1
fi
grep -Eq '^training: loss [0-9.]+ at step 1, [0-9.]+ at step 5, on each of the [0-9]+ timed layouts$' "$tmp/out" ||
  { echo "FAILED: no training line in:"; cat "$tmp/out"; exit 1; }
python3 - "$tmp/v.json" <<'PY'
import json, sys
layouts = json.load(open(sys.argv[1]))["layouts"]
timed = [l for l in layouts if l["timing"]]
assert timed, "no layout was timed"
one = [l for l in timed if l["ranks"] == 1]
assert one, "no single-rank layout was timed"
ref = one[0]
for l in timed:
    assert l["steps"] == 5, (l["layout"], l["steps"])
    # every layout reproduces the single-rank trajectory (to float rounding across ranks)
    for k in ("loss_first", "loss_last"):
        assert abs(l[k] - ref[k]) <= 1e-6 * ref[k], (l["layout"], k, l[k], ref[k])
    assert l["loss_last"] < l["loss_first"] - 0.2, (l["layout"], l["loss_first"], l["loss_last"])
print(f"validate_trains: {len(timed)} timed layouts, loss {ref['loss_first']:.4f} -> {ref['loss_last']:.4f} in 5 steps")
PY

#!/usr/bin/env bash
# validate's host check for real: a quick calibration of this machine, then the profile's
# recorded figures made 100x too high (the host now looks about 99% slower) and 100x too low
# (GEMMs and memory both): each is reported as such, whatever the probe's own noise (a quick
# probe under the sanitizers can be off by a factor of 2-4); --recalibrate writes the profile
# again with what the host measures now; a validation on the drifted profile probes the host
# again after its timed run and grades nothing. Step timings are not asserted (the host is noisy).
set -euo pipefail
px=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export PARALLAX_PROFILE_DIR=$dir
"$px" calibrate --quick --ranks 1 --quiet
prof=$(ls "$dir"/local-*.json)
fail() { echo "FAILED: $*"; exit 1; }

# scale measured.peak_flops and measured.memory_bandwidth of the profile by $1
scale() {
  python3 - "$prof" "$1" <<'PY'
import json, sys
p, f = sys.argv[1], float(sys.argv[2])
j = json.load(open(p))
j["measured"]["peak_flops"] *= f
j["measured"]["memory_bandwidth"] *= f
json.dump(j, open(p, "w"), indent=1)
PY
}

out=$("$px" validate --check-host)
echo "$out"
grep -q "^host check: GEMM .* GFLOP/s now, .* when calibrated on " <<<"$out" || fail "no host check line"

scale 100
out=$("$px" validate --check-host)
echo "$out"
grep -q "host check: this host runs [0-9]*% slower than when it was calibrated" <<<"$out" || fail "100x profile: not slower"
json=$("$px" validate --check-host --json)
python3 - "$json" <<'PY' || fail "--json"
import json, sys
j = json.loads(sys.argv[1])
assert j["probed"] is True and j["drifted"] is True, j
assert j["peak_flops"] < 0.2 * j["peak_flops_calibrated"], j
PY

scale 0.0001
out=$("$px" validate --check-host)
echo "$out"
grep -q "host check: this host runs [0-9]*% faster than when it was calibrated" <<<"$out" || fail "0.01x profile: not faster"

# a validation on that profile: the host probed again after its timed run, and its rows not
# graded, the drift named (a quick layout on one rank, two steps)
if ! command -v mpirun >/dev/null; then
  echo "validate on a drifted host: skipped (its plan runs through mpirun, not installed)"
else
json=$("$px" validate --layouts 1 --max-ranks 1 --steps 2 --tries 1 --report "$dir/v" --json)
python3 - "$json" <<'PY' || fail "validate on a drifted host"
import json, sys
j = json.loads(sys.argv[1])
assert j["host_check"]["drifted"] is True and j["host_check_after"]["drifted"] is True, j.get("host_check_after")
assert j["host_check_after"]["peak_flops"] > 5 * j["host_check_after"]["peak_flops_calibrated"], j["host_check_after"]
assert j["graded"] is False, j["graded"]
# a busy machine (ctest -j runs other tests beside this one) is said first, and only then: a
# quiet one is not graded for the drift, said as such
busy = j["verdict"].startswith("not graded: machine busy: ")
assert busy == (j["machine"]["quiet"] is False), (j["machine"]["quiet"], j["verdict"])
assert busy or j["verdict"].startswith("not graded: the host drifted: ") and \
    " faster before the timed runs than when calibrated" in j["verdict"], j["verdict"]
assert [l["grade"] for l in j["layouts"] if l["timing"]] == ["not graded"], j["layouts"]
PY
fi

# --recalibrate: the profile written again, its figures this host's (not a tenth of them)
before=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['measured']['peak_flops'])" "$prof")
out=$("$px" validate --check-host --recalibrate)
echo "$out"
grep -q "host check: --recalibrate: calibrating this machine again in place" <<<"$out" || fail "no recalibration"
after=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['measured']['peak_flops'])" "$prof")
python3 -c "import sys; b, a = map(float, sys.argv[1:]); sys.exit(0 if a > 5 * b else 1)" "$before" "$after" \
  || fail "--recalibrate left peak_flops at $after (was $before)"

# an uncalibrated profile: no check
out=$(PARALLAX_UNCALIBRATED=1 "$px" validate --check-host)
echo "$out"
grep -q "host check: none: the profile is not calibrated" <<<"$out" || fail "uncalibrated"
echo "validate_host: all checks passed"

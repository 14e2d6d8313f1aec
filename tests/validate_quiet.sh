#!/usr/bin/env bash
# validate on a busy machine: a CPU burner on every core beside a one-layout validation. The
# machine is reported busy (in the terminal before the table, in validation.json's "machine" and
# in the run's run-NN.json), and the timed row is not graded. Whether a machine is quiet cannot
# be asserted on a shared CI host; that it is busy with a burner on each core can.
# Usage: validate_quiet.sh PARALLAX   (the planner's layout on the cores: mpirun where > 1 core)
set -u
px=${1:?usage: validate_quiet.sh path/to/parallax}
command -v python3 >/dev/null || { echo "SKIPPED: python3 reads the JSON"; exit 77; }
tmp=$(mktemp -d)
burners=()
cleanup() {
  for b in "${burners[@]}"; do kill "$b" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAILED: $*"; cat "$tmp/out" 2>/dev/null; exit 1; }
export PARALLAX_UNCALIBRATED=1 PARALLAX_PROFILE_DIR=$tmp/none
for _ in $(seq "$(nproc)"); do
  yes >/dev/null &
  burners+=($!)
done
"$px" validate --model tiny --steps 2 --layouts 1 --report "$tmp/v" >"$tmp/out" 2>&1 ||
  fail "parallax validate"
cat "$tmp/out"
# said first: the machine and the verdict come before the table's header
python3 - "$tmp/out" <<'PY' || fail "order of the answer"
import re, sys
lines = open(sys.argv[1]).read().splitlines()
def at(pattern):
    for i, l in enumerate(lines):
        if re.search(pattern, l):
            return i
    sys.exit(f"no line matching {pattern!r}")
m = at(r"^machine during the timed runs: busy: other processes used [0-9.]+% of the [0-9]+ cores' time")
v = at(r"^validation: not graded: machine busy: during the timed runs other processes took [0-9]+% of the cores' time")
h = at(r"^ +# ranks +layout +predicted +measured +error +ops<15% +memory +comm +grade$")
r = at(r"^ +1 +[0-9]+  plan: .* +[0-9.]+ +[0-9.]+ +[-+0-9.]+% +[0-9]+/[0-9]+ +equal +equal  not graded$")
assert m < v < h < r, (m, v, h, r)
PY
python3 - "$tmp/v" <<'PY' || fail "validation.json / run-01.json"
import json, sys
d = sys.argv[1]
j = json.load(open(f"{d}/validation.json"))
m = j["machine"]
# the five keys the report reads, in this order, then what they are out of
assert list(m)[:5] == ["quiet", "load", "other_cpu_s", "steal_s", "verdict"], list(m)
assert m["quiet"] is False, m
# a burner per core: others took at least a third of the cores' time
assert m["other_cpu_s"] >= m["cpu_s"] / 3, m
assert m["verdict"].startswith("busy: "), m
assert j["graded"] is False and j["verdict"].startswith("not graded: machine busy"), j["verdict"]
assert [l["grade"] for l in j["layouts"]] == ["not graded"], j["layouts"]
# a busy machine's rows are not graded, so its timed layouts are not tried again
assert [l["tries"] for l in j["layouts"]] == [1], [l["tries"] for l in j["layouts"]]
assert j["calibration_log"] is None, j["calibration_log"]
r = json.load(open(f"{d}/run-01.json"))
assert r["machine"]["quiet"] is False, r["machine"]
PY
echo "validate_quiet: all checks passed"

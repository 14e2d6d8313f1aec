#!/usr/bin/env bash
# calibrate_emu.sh WORKER_EMU — the compute part of `calibrate --backend cuda` on the CUDA sources
# compiled for the CPU (kernels/cuda/emu): the GPU calibration path runs end to end (bf16 GEMMs,
# op rates from bf16 training steps, planned on a GPU profile) and writes what assemble reads.
# The figures are the emulator's and mean nothing; the keys and types are checked.
set -euo pipefail
worker=$1
dir=$(mktemp -d /tmp/px-calibrate-emu.XXXXXX)
trap 'rm -rf "$dir"' EXIT
fail() { echo "calibrate_emu: $*" >&2; exit 1; }

"$worker" calibrate --part compute --backend cuda --base dgx-h100 --quick --quiet \
    --models tiny -o "$dir/compute.json" || fail "compute part failed"
python3 - "$dir/compute.json" <<'PY' || fail "compute.json is not as expected"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["part"] == "compute", d["part"]
assert d["backend"] == "cuda-emu", d["backend"]
assert d["dtype"] == "bf16", d["dtype"]
assert d["peak_flops"] > 0 and d["memory_bandwidth"] > 0
assert len(d["gemm"]) == 31, len(d["gemm"])
kinds = {(o["kind"], o["phase"]) for o in d["ops"]}
for need in [("attention", "fwd"), ("attention", "bwd"), ("norm", "fwd"), ("optimizer", "step")]:
    assert need in kinds, need
print("compute.json: %d GEMM shapes, %d op rates, bf16 on %s" % (len(d["gemm"]), len(d["ops"]), d["backend"]))
PY

# a GPU calibration planned on the CPU profile is refused, naming the precision
if "$worker" calibrate --part compute --backend cuda --base local --quick --quiet --models tiny \
    -o "$dir/x.json" 2>"$dir/err"; then
    fail "--base local with --backend cuda was accepted"
fi
grep -q "bf16" "$dir/err" || fail "unexpected message: $(cat "$dir/err")"
echo "calibrate_emu: ok"

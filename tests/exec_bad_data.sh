#!/usr/bin/env bash
# parallax run end to end, and the input it must refuse: bad data files, plans the CPU executor
# cannot run, bad options, a missing worker. (Launching several ranks is tests/exec_mpi_fail.sh's.) Every refusal exits with the expected
# status (2 for input the user can fix) and a message naming the file or setting.
# Usage: exec_bad_data.sh PARALLAX EXEC_MKPLAN
set -u
px=${1:?usage: exec_bad_data.sh path/to/parallax path/to/exec_mkplan}
mkplan=${2:?usage: exec_bad_data.sh path/to/parallax path/to/exec_mkplan}
worker="$(dirname "$px")/parallax-worker"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0 cases=0

# expect STATUS NEEDLE CMD ARGS... : run CMD, check the exit status and that its output names NEEDLE.
expect() {
  local want=$1 needle=$2
  shift 2
  cases=$((cases + 1))
  local out
  out=$("$@" 2>&1)
  local got=$?
  if [ "$got" -ne "$want" ] || ! grep -qF -- "$needle" <<<"$out"; then
    echo "FAILED: $*"
    echo "  expected status $want and '$needle'"
    echo "  got status $got: $(head -c 600 <<<"$out")"
    fails=$((fails + 1))
  fi
}

plan() { # plan NAME KNOBS...: a tiny plan for the local cluster
  local name=$1
  shift
  "$mkplan" --model tiny --seq 16 --gbs 4 --mbs 2 --output "$tmp/$name.json" "$@" >/dev/null ||
    { echo "FAILED: exec_mkplan $*"; fails=$((fails + 1)); }
}

plan good
plan bf16 --cluster dgx-a100 --precision bf16
"$mkplan" --model tiny-moe --seq 16 --gbs 4 --mbs 2 --precision bf16 --output "$tmp/moe16.json" \
  >/dev/null || { echo "FAILED: exec_mkplan tiny-moe bf16"; fails=$((fails + 1)); }
plan zero2 --zero 2
plan zero3 --zero 3 --recompute full
plan dp2 --gpus 2
plan tp2 --gpus 2 --tp 2
plan cp2 --gpus 2 --cp 2 --dropout 0.1
# MXFP8 attention wants head widths of multiples of 32 and a sequence of a multiple of 128
printf '{"name": "hd32", "family": "llama", "layers": 2, "hidden": 64, "heads": 2, "vocab": 256, "seq_len": 128}\n' >"$tmp/hd32.json"
plan fp8att --model "$tmp/hd32.json" --seq 128 --fp8-recipe mxfp8 --fp8-attention
plan fp8attbw --fp8-recipe tensorwise --fp8-attention
# a mixture-of-experts model with the shapes the executor once refused, which it now runs:
# GeLU experts, the shared experts' gate beside the MLP's biases, shared experts wider than the
# dense MLP
cat >"$tmp/moe-model.json" <<'EOF'
{"schema_version": 1, "name": "moe-shapes", "family": "llama", "layers": 2, "hidden": 64,
 "heads": 8, "kv_heads": 4, "ffn_hidden": 176, "vocab": 256, "seq_len": 64, "bias": true,
 "mlp": "gelu",
 "moe": {"experts": 4, "topk": 2, "expert_ffn": 32, "shared_ffn": 192, "shared_gate": true}}
EOF
"$mkplan" --model "$tmp/moe-model.json" --seq 16 --gbs 4 --mbs 2 --output "$tmp/moe.json" >/dev/null ||
  { echo "FAILED: exec_mkplan of a MoE model"; fails=$((fails + 1)); }

# bad data: a message naming the file and the problem, exit 2
printf 'short text' >"$tmp/short.txt"
python3 - "$tmp" <<'EOF' 2>/dev/null || printf 'x' >"$tmp/nopython"
import struct, sys
d = sys.argv[1]
hdr = lambda magic, version, n: struct.pack('<256i', magic, version, n, *([0] * 253))
open(d + '/magic.bin', 'wb').write(hdr(12345, 1, 100) + b'\0' * 200)
open(d + '/version.bin', 'wb').write(hdr(20240520, 7, 100) + b'\0' * 200)
open(d + '/truncated.bin', 'wb').write(hdr(20240520, 1, 1000) + b'\0' * 200)
open(d + '/vocab.bin', 'wb').write(hdr(20240520, 1, 1000) + struct.pack('<1000H', *([5] * 500 + [300] + [5] * 499)))
open(d + '/few.bin', 'wb').write(hdr(20240520, 1, 20) + struct.pack('<20H', *range(20)))
open(d + '/good.bin', 'wb').write(hdr(20240520, 1, 4000) + struct.pack('<4000H', *[(i * 7) % 256 for i in range(4000)]))
EOF
if [ -e "$tmp/nopython" ]; then
  echo "SKIPPED the .bin cases: python3 is needed to write them"
else
  expect 2 "magic.bin: wrong magic number 12345" "$px" run "$tmp/good.json" --data "$tmp/magic.bin"
  expect 2 "version.bin: token file version 7 is not supported" "$px" run "$tmp/good.json" --data "$tmp/version.bin"
  expect 2 "truncated.bin: truncated: the header promises 1000 tokens" "$px" run "$tmp/good.json" --data "$tmp/truncated.bin"
  expect 2 "vocab.bin: token 300 at position 500 is beyond the model's vocabulary of 256" "$px" run "$tmp/good.json" --data "$tmp/vocab.bin"
  expect 2 "few.bin: 20 tokens are too few: one step's batch reads 65 (global batch 4 x sequence 16 + 1)" "$px" run "$tmp/good.json" --data "$tmp/few.bin"
  expect 0 "wrote $tmp/bin-run.json" "$px" run "$tmp/good.json" --steps 2 --data "$tmp/good.bin" -o "$tmp/bin-run.json"
fi
expect 2 "$tmp/missing.txt: cannot open the training data: No such file or directory" "$px" run "$tmp/good.json" --data "$tmp/missing.txt"
expect 2 "short.txt: 10 tokens are too few" "$px" run "$tmp/good.json" --data "$tmp/short.txt"
expect 2 "the training data is not a regular file" "$px" run "$tmp/good.json" --data "$tmp"

# plans the executor cannot run here
if ! command -v nvidia-smi >/dev/null; then # no GPU here
  expect 2 "this machine has no CUDA device for the plan's" "$px" run "$tmp/bf16.json"
fi
# and one that is no layout at all: a sequence of 18 over cp 2 does not split into 2 x cp
# chunks (the spec's rule: no plan is made of it, so this one is edited by hand)
sed -E 's/"seq_len":([[:space:]]*)16,/"seq_len":\118,/' "$tmp/cp2.json" >"$tmp/cp2_18.json"
expect 2 "the layout breaks a rule: cp 2 needs the sequence length 18 to split into 2 x cp = 4 chunks" "$px" run "$tmp/cp2_18.json" --launcher none
# MXFP8 attention runs on Transformer Engine's shapes; a sequence of 96 is no job (the spec's
# rule: no plan is made of it, so this one is edited by hand)
sed -E 's/"seq_len":([[:space:]]*)128/"seq_len":\196/' "$tmp/fp8att.json" >"$tmp/fp8att96.json"
expect 2 "the layout breaks a rule: FP8 attention under mxfp8 needs a sequence of a multiple of 128 and head widths of multiples of 32" "$px" run "$tmp/fp8att96.json" --launcher none
# blockwise with FP8 attention is no job (no plan is made of it, so this one is edited by hand)
sed -E 's/"fp8_recipe":([[:space:]]*)"tensorwise"/"fp8_recipe":\1"blockwise"/' "$tmp/fp8attbw.json" >"$tmp/fp8attbw2.json"
expect 2 "the layout breaks a rule: FP8 attention has no blockwise recipe: Transformer Engine runs no attention backend with Float8BlockScaling" "$px" run "$tmp/fp8attbw2.json" --launcher none
expect 0 "wrote $tmp/moe-run.json" "$px" run "$tmp/moe.json" --launcher none --steps 1 -o "$tmp/moe-run.json"
# and in bf16 on the CPU (its 16-bit kernels' expert permutation), once refused
expect 0 "wrote $tmp/moe16-run.json" "$px" run "$tmp/moe16.json" --launcher none --steps 1 -o "$tmp/moe16-run.json"
expect 2 "needs 2 ranks (dp 2 x tp 1 x pp 1 x cp 1) but this" "$px" run "$tmp/dp2.json" --launcher none
# a MoE plan on the CUDA backend (bf16) through the emulator, where the build has it: a backend
# without the MoE kernels would refuse it at start naming itself (test_exec_cuda: the check)
emu="$(dirname "$px")/parallax-worker-emu"
if [ -x "$emu" ]; then
  "$mkplan" --model tiny-moe --cluster dgx-h100 --precision bf16 --seq 16 --gbs 4 --mbs 2 \
    --output "$tmp/moe-bf16.json" >/dev/null || { echo "FAILED: exec_mkplan tiny-moe bf16"; fails=$((fails + 1)); }
  expect 0 "wrote $tmp/moe-bf16-run.json" "$emu" run "$tmp/moe-bf16.json" --backend cuda --steps 2 \
    -o "$tmp/moe-bf16-run.json"
  # optimizer offload on the CUDA backend: the host steps the master and state
  "$mkplan" --model tiny --cluster dgx-h100 --precision bf16 --seq 16 --gbs 4 --mbs 2 --zero 1 \
    --offload-optimizer --output "$tmp/offload-bf16.json" >/dev/null ||
    { echo "FAILED: exec_mkplan offload bf16"; fails=$((fails + 1)); }
  expect 0 "wrote $tmp/offload-bf16-run.json" "$emu" run "$tmp/offload-bf16.json" --backend cuda \
    --steps 1 -o "$tmp/offload-bf16-run.json"
fi
expect 2 "needs 2 ranks (dp 1 x tp 2 x pp 1 x cp 1) but this" "$px" run "$tmp/tp2.json" --launcher none
expect 2 "the layout needs 2 ranks" "$worker" run "$tmp/dp2.json"
expect 2 "--launcher: expected mpirun, srun or none, got 'ssh'" "$px" run "$tmp/good.json" --launcher ssh
# ZeRO-2 and ZeRO-3 on one rank: the gradient bucket, shards and gathers of one
expect 0 "wrote $tmp/zero2-run.json" "$px" run "$tmp/zero2.json" --steps 2 -o "$tmp/zero2-run.json"
expect 0 "wrote $tmp/zero3-run.json" "$px" run "$tmp/zero3.json" --steps 2 -o "$tmp/zero3-run.json"
expect 2 "nothing.json: cannot" "$px" run "$tmp/nothing.json"

expect 2 "$tmp/nodir/run.json: cannot write into $tmp/nodir" "$px" run "$tmp/good.json" -o "$tmp/nodir/run.json"

# options
expect 0 "usage: parallax run PLAN.json" "$px" run --help
expect 0 "usage: parallax-worker run PLAN.json" "$worker" --help
expect 2 "expected one plan file" "$px" run
expect 2 "--steps: expected an integer, got 'ten'" "$px" run "$tmp/good.json" --steps ten
expect 2 "--steps: must be between 1" "$px" run "$tmp/good.json" --steps 0
expect 2 "unknown option '--stepz'" "$px" run "$tmp/good.json" --stepz 3
expect 2 "option '-o' needs a value" "$px" run "$tmp/good.json" -o
expect 2 "unknown command 'train'" "$worker" train "$tmp/good.json"

# a run: progress lines, the summary, run.json and the metrics log (-o and -oFILE both work)
expect 0 "step     3/3" "$px" run "$tmp/good.json" --steps 3 -o "$tmp/run.json"
expect 0 "FLOPs per step" "$px" run "$tmp/good.json" --steps 1 "-o$tmp/run1.json"
[ -s "$tmp/run1.json" ] || { echo "FAILED: -oFILE did not write $tmp/run1.json"; fails=$((fails + 1)); }
cases=$((cases + 1))
if ! grep -q '"steps"' "$tmp/run.json" || ! grep -q '"activations"' "$tmp/run.json" ||
  [ "$(wc -l <"$tmp/run.metrics.jsonl")" -ne 3 ]; then
  echo "FAILED: run.json or run.metrics.jsonl incomplete"
  fails=$((fails + 1))
fi

# interrupted: the worker stops at a step boundary and still writes what it measured
cases=$((cases + 1))
"$worker" run "$tmp/good.json" --steps 1000000 -o "$tmp/int.json" >"$tmp/int.out" 2>&1 &
pid=$!
for _ in $(seq 1 300); do
  [ -s "$tmp/int.metrics.jsonl" ] && break
  sleep 0.1
done
kill -INT "$pid"
wait "$pid"
st=$?
if [ "$st" -ne 1 ] || ! grep -Eq "\"interrupted\":[[:space:]]*true" "$tmp/int.json" ||
  ! grep -q "interrupted after" "$tmp/int.out"; then
  echo "FAILED: SIGINT: status $st, $(tail -c 300 "$tmp/int.out")"
  fails=$((fails + 1))
fi

# a loss or gradient that is not finite (fp32: no loss scaler) stops the run at that step,
# before its update, with run.json and the metrics log of the steps done
expect 1 "step 3: the gradient norm is inf: training diverged (a gradient is not finite" \
  env PARALLAX_TEST_INF=3 "$px" run "$tmp/good.json" --steps 5 -o "$tmp/inf.json"
cases=$((cases + 1))
if [ "$(grep -c '"step":' "$tmp/inf.json")" -ne 2 ] || ! grep -Eq '"diverged_at_step":[[:space:]]*3' "$tmp/inf.json" ||
  [ "$(wc -l <"$tmp/inf.metrics.jsonl")" -ne 2 ]; then
  echo "FAILED: a non-finite gradient at step 3: run.json or the metrics log does not hold steps 1-2"
  fails=$((fails + 1))
fi
expect 1 "step 2: the loss is nan: training diverged (the loss is not finite" \
  env PARALLAX_TEST_NAN_LOSS=2 "$px" run "$tmp/good.json" --steps 5 -o "$tmp/nan.json"
expect 2 "PARALLAX_TEST_NAN_LOSS=0: expected steps 1-64" \
  env PARALLAX_TEST_NAN_LOSS=0 "$px" run "$tmp/good.json" --steps 5 -o "$tmp/nan.json"

# a parallax without its worker beside it
cp "$px" "$tmp/parallax"
expect 1 "parallax-worker is missing or not executable" "$tmp/parallax" run "$tmp/good.json"

echo "exec_bad_data: $((cases - fails)) of $cases cases passed"
[ "$fails" -eq 0 ]

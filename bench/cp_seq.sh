#!/usr/bin/env bash
# Context parallelism at growing sequence length on this machine: tiny-llama with cp 2 (two
# MPI ranks, fp32 on the CPU) for each comm type, the plan's predicted step time against the
# median measured by `parallax run`, as a table. A benchmark, not a test: it fails only when a
# plan or a run fails. The a2a comm type runs the unfused attention core, the others the fused
# one (docs/executor.md, "Context parallelism"); the cluster is `local` (calibrate it first with
# `parallax calibrate` for predictions of this machine).
# Usage: bench/cp_seq.sh PARALLAX [SEQ...]   (default 256 512 1024 2048; PX_STEPS, default 4)
set -u
px=${1:?usage: bench/cp_seq.sh path/to/parallax [seq...]}
shift
seqs=("$@")
[ ${#seqs[@]} -eq 0 ] && seqs=(256 512 1024 2048)
steps=${PX_STEPS:-4}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

printf '%-10s %6s %14s %14s %8s\n' comm seq predicted_s measured_s meas/pred
for comm in p2p allgather a2a; do
  attn=--flash-attn
  [ "$comm" = a2a ] && attn=--no-flash-attn
  for s in "${seqs[@]}"; do
    plan="$tmp/$comm-$s.json" run="$tmp/$comm-$s.run.json"
    if ! "$px" plan --model tiny-llama --cluster local --gpus 2 --cp 2 --cp-comm-type "$comm" \
      --seq "$s" --gbs 2 --mbs 1 --dp 1 --tp 1 --pp 1 --zero 0 --no-sp --vpp 1 --schedule 1f1b \
      --precision fp32 --steps "$steps" "$attn" -o "$plan" >/dev/null; then
      echo "cp_seq: parallax plan failed for $comm at sequence $s" >&2
      exit 1
    fi
    if ! "$px" run "$plan" --quiet -o "$run" >/dev/null; then
      echo "cp_seq: parallax run failed for $comm at sequence $s" >&2
      exit 1
    fi
    python3 - "$plan" "$run" "$comm" "$s" <<'EOF'
import json, sys
p = json.load(open(sys.argv[1]))["prediction"]["time"]["step_s"]
m = json.load(open(sys.argv[2]))["time"]["step_s_median"]
print("%-10s %6s %14.4f %14.4f %8.2f" % (sys.argv[3], sys.argv[4], p, m, m / p))
EOF
  done
done

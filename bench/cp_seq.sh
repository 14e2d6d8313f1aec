#!/usr/bin/env bash
# Context parallelism at growing sequence length on this machine: tiny-llama with cp 2 (two
# MPI ranks, fp32 on the CPU) for each comm type, the plan's predicted step time against the
# median measured by `parallax run`, printed as a table and drawn: DIR/cp_seq.md (the table and
# the chart), cp_seq.dat, cp_seq.gp, cp_seq.png and cp_seq.svg (gnuplot). A benchmark, not a
# test: it fails only when a plan, a run or the drawing fails. The a2a comm type runs the
# unfused attention core, the others the fused one (docs/executor.md, "Context parallelism");
# the cluster is `local` (calibrate it first with `parallax calibrate` for predictions of this
# machine).
# Usage: bench/cp_seq.sh [--dir DIR] PARALLAX [SEQ...]
#   (default sequences 256 512 1024 2048, DIR cp-bench; PX_STEPS steps a run, default 4)
set -u
usage="usage: bench/cp_seq.sh [--dir DIR] path/to/parallax [seq...]"
dir=cp-bench
if [ "${1:-}" = --dir ]; then
  [ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }
  dir=$2
  shift 2
fi
[ $# -ge 1 ] || { echo "$usage" >&2; exit 2; }
px=$1
shift
[ -x "$px" ] || { echo "cp_seq: $px is not an executable" >&2; exit 2; }
seqs=("$@")
[ ${#seqs[@]} -eq 0 ] && seqs=(256 512 1024 2048)
for s in "${seqs[@]}"; do
  case "$s" in '' | *[!0-9]*) echo "cp_seq: sequence '$s' is not a whole number" >&2; exit 2 ;; esac
done
steps=${PX_STEPS:-4}
mkdir -p "$dir" || { echo "cp_seq: cannot create $dir" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dat="$dir/cp_seq.dat"
echo "# comm seq predicted_s measured_s" >"$dat"

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
    python3 - "$plan" "$run" "$comm" "$s" "$dat" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))["prediction"]["time"]["step_s"]
m = json.load(open(sys.argv[2]))["time"]["step_s_median"]
print("%-10s %6s %14.4f %14.4f %8.2f" % (sys.argv[3], sys.argv[4], p, m, m / p))
with open(sys.argv[5], "a") as f:
    f.write("%s %s %.6g %.6g\n" % (sys.argv[3], sys.argv[4], p, m))
PY
  done
done

# the chart: step time against sequence, predicted (dashed) and measured (solid) per comm type
gp="$dir/cp_seq.gp"
{
  echo "set logscale xy 2"
  echo "set xlabel 'sequence length (tokens)'"
  echo "set ylabel 'step time (s)'"
  echo "set key top left"
  echo "set grid"
  echo "set title 'tiny-llama, cp 2 on this machine: measured (solid) and predicted (dashed)'"
  printf 'plot'
  i=1
  for comm in p2p allgather a2a; do
    [ $i -gt 1 ] && printf ','
    printf " \\\\\n  '%s' using 2:(strcol(1) eq '%s' ? \$4 : 1/0) with linespoints lw 2 lc %d title '%s measured'" \
      "$dat" "$comm" "$i" "$comm"
    printf ", \\\\\n  '%s' using 2:(strcol(1) eq '%s' ? \$3 : 1/0) with linespoints dt 2 lc %d title '%s predicted'" \
      "$dat" "$comm" "$i" "$comm"
    i=$((i + 1))
  done
  echo
} >"$gp"
if ! gnuplot -e "set terminal pngcairo size 960,560 font 'sans,10' noenhanced; set output '$dir/cp_seq.png'" "$gp" \
  -e "set terminal svg size 960,560 fixed font 'sans,10' noenhanced; set output '$dir/cp_seq.svg'; replot"; then
  echo "cp_seq: gnuplot failed on $gp" >&2
  exit 1
fi
python3 - "$dat" "$dir/cp_seq.md" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1]) if not l.startswith("#")]
with open(sys.argv[2], "w") as f:
    f.write("# Context parallelism at growing sequence length\n\n")
    f.write("tiny-llama, cp 2, fp32 on this machine's CPU (`bench/cp_seq.sh`).\n\n")
    f.write("| comm type | sequence | predicted s | measured s | measured / predicted |\n")
    f.write("| --- | ---: | ---: | ---: | ---: |\n")
    for c, s, p, m in rows:
        f.write("| %s | %s | %.4g | %.4g | %.2f |\n" % (c, s, float(p), float(m), float(m) / float(p)))
    f.write("\n![step time against sequence](cp_seq.png)\n")
PY
echo "cp_seq: table and chart in $dir (cp_seq.md, cp_seq.png, cp_seq.svg)"

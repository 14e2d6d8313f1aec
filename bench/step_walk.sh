#!/usr/bin/env bash
# The walk of one training step through the source files: how many files exec_step enters,
# how often it climbs back up into a file already on the call stack, how often a return lands
# in another file, and which files it enters most (docs/executor.md, "The walk of a step").
#
# It builds the worker with -finstrument-functions (-O0, no inlining; functions defined in
# headers left out) in a build directory of its own, preloads bench/step_walk_trace.c into it,
# and records rank 0's second step of each plan (tiny, 2 ranks, 2 steps); bench/step_walk.py
# maps each function to its file and counts. A benchmark, not a test: it fails only when the
# build, a plan or a run fails. The counts are the same on every machine for the same code and
# plan (the path a step takes does not depend on timing), so two trees compare: run it with
# --src on a checkout of the other.
#
# Usage: bench/step_walk.sh [--src DIR] [--build DIR] [--dir DIR] [--plan "NAME MKPLAN-ARGS"]...
#   --src    the tree to measure (default: the one this script is in)
#   --build  its instrumented build (default: SRC/build-walk)
#   --dir    plans, traces and runs (default: BUILD/walk)
#   --plan   a plan of the tiny model on the local cluster, as exec_mkplan's arguments after a
#            name, e.g. --plan "tp2-sp --gpus 2 --tp 2 --sp --gbs 8 --mbs 4"; the default plans
#            are TP with SP and CP's three kinds of attention
set -u
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/.." && pwd)
build=
dir=
plans=()
usage="usage: bench/step_walk.sh [--src DIR] [--build DIR] [--dir DIR] [--plan \"NAME ARGS\"]..."
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }
  case "$1" in
    --src) src=$(cd "$2" && pwd) || exit 2 ;;
    --build) build=$2 ;;
    --dir) dir=$2 ;;
    --plan) plans+=("$2") ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
  shift 2
done
[ -n "$build" ] || build=$src/build-walk
[ -n "$dir" ] || dir=$build/walk
if [ ${#plans[@]} -eq 0 ]; then
  plans=("tp2-sp --gpus 2 --tp 2 --sp --gbs 8 --mbs 4"
         "cp2-p2p --gpus 2 --cp 2 --gbs 8 --mbs 2 --seq 64"
         "cp2-allgather --gpus 2 --cp 2 --cp-comm-type allgather --gbs 8 --mbs 2 --seq 64"
         "cp2-a2a --gpus 2 --cp 2 --cp-comm-type a2a --no-flash-attn --gbs 8 --mbs 2 --seq 64")
fi
mkdir -p "$dir" || { echo "step_walk: cannot create $dir" >&2; exit 2; }
dir=$(cd "$dir" && pwd)

# every function of the project instrumented, none inlined; the headers' static inline ones
# (and the system's) left out: they are not a file a step walks into
flags="-O0 -g -finstrument-functions -finstrument-functions-exclude-file-list=.h"
echo "step_walk: building $src into $build (instrumented)" >&2
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS="$flags" -DPARALLAX_CUDA=OFF \
  >"$dir/cmake.log" 2>&1 || { echo "step_walk: cmake failed ($dir/cmake.log)" >&2; exit 1; }
cmake --build "$build" -j2 --target parallax parallax-worker exec_mkplan >"$dir/build.log" 2>&1 ||
  { echo "step_walk: the build failed ($dir/build.log)" >&2; exit 1; }
cc -O2 -shared -fPIC -o "$build/step_walk_trace.so" "$here/step_walk_trace.c" -ldl -lpthread ||
  { echo "step_walk: the tracer did not compile" >&2; exit 1; }
worker=$build/parallax-worker
func=$(nm "$worker" | awk '$3 == "exec_step" { print $1 }')
[ -n "$func" ] || { echo "step_walk: $worker has no exec_step" >&2; exit 1; }

status=0
for spec in "${plans[@]}"; do
  set -- $spec
  name=$1
  shift
  echo "$name (tiny $*; rank 0, step 2 of 2)"
  if ! "$build/exec_mkplan" --model tiny --cluster local "$@" -o "$dir/$name.plan.json" \
      >"$dir/$name.mkplan.log" 2>&1; then
    echo "  exec_mkplan failed ($dir/$name.mkplan.log)"; status=1; continue
  fi
  rm -f "$dir/$name.trace"
  if ! LD_PRELOAD="$build/step_walk_trace.so" PARALLAX_WALK_EXE=parallax-worker \
      PARALLAX_WALK_FUNC=$func PARALLAX_WALK_CALL=2 PARALLAX_WALK_OUT="$dir/$name.trace" \
      "$build/parallax" run "$dir/$name.plan.json" --steps 2 --quiet -o "$dir/$name.run.json" \
      >"$dir/$name.run.log" 2>&1; then
    echo "  the run failed ($dir/$name.run.log)"; status=1; continue
  fi
  python3 "$here/step_walk.py" "$worker" "$dir/$name.trace" "$src" || status=1
done
exit $status

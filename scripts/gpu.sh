#!/usr/bin/env bash
# gpu.sh — build parallax with its CUDA backend on a machine with an NVIDIA GPU, run the GPU
# tests, train on the GPU against the CPU, check the simulator's prediction, benchmark, calibrate,
# and keep what they printed. Nothing here needs a network.
#
#   scripts/gpu.sh [--steps LIST] [RESULTS_DIR]      (RESULTS_DIR defaults to ./gpu-results)
#   scripts/gpu.sh --fetch-deps DIR                  (on a machine with apt and a network)
#
# Steps, in order (--steps takes a comma-separated subset, e.g. --steps configure,build):
#   preflight  tools present, a GPU visible; nvidia-smi, nvcc, cmake, compiler → system.txt
#   configure  cmake with PARALLAX_CUDA=ON, CMAKE_CUDA_ARCHITECTURES=$CUDA_ARCH (90: Hopper)
#   build      cmake --build (all targets, or $PARALLAX_GPU_TARGETS)          → build.log
#   test       ctest -L gpu --output-on-failure: the CUDA backend against the CPU one,
#              every kernel, bf16 and fp16 (a skipped test counts as a failure here)  → test.log
#   train      20 steps of tiny and of gpt2-124m (seq 128) on the GPU in bf16 beside the same
#              job on the CPU in fp32: both loss columns, the deviation, a tolerance → train.txt
#   validate   single GPU: gpt2-124m at seq 1024 (recompute none, selective, full), the
#              simulator's step time and memory against the measured run (the arenas and
#              cudaMemGetInfo's peak), relative errors; parallax compare for the rest → validate.txt
#   bench      bench_kernels_cuda: GEMM TFLOP/s, copy/cast/add bandwidth, attention; then
#              tokens/s and MFU of gpt2-124m at mbs 8 and 16, seq 1024, bf16   → bench.txt
#   calibrate  parallax calibrate --backend cuda --base <cluster> --ranks 1 -o
#              profiles/<gpu>-measured.json (a copy in RESULTS_DIR)           → calibrate.txt
#   pytorch    when python3 has torch: one forward and backward of tiny in PyTorch with the
#              weights and batch parallax exported, loss and gradient norms compared (skipped
#              otherwise)                                                     → pytorch.txt
#   sanitize   compute-sanitizer memcheck, racecheck (shared memory) and synccheck over the
#              GPU test at its small shapes                                   → sanitize.log
# summary.txt lists each step's status and seconds; the exit status is 0 only when every step
# that ran passed (a step that skips itself, exit 77, is listed as skipped and does not fail the
# run). A failed configure or build skips the steps after it. To add a step (a
# training run, say): write a function step_NAME that returns non-zero on failure and writes
# its output to one file in $RESULTS, and add NAME to DEFAULT_STEPS. The results folder stays a
# handful of plain files, so that it can be copied back from a remote machine as it is.
#
# What the machine needs: the CUDA toolkit (nvcc, cuBLAS; CUDA 12 or newer), CMake >= 3.20, a
# C/C++ compiler, and the driver. The build also links cJSON (every parallax program) and
# OpenBLAS (the CPU reference backend) and finds them with pkg-config. A GPU machine without
# a network may lack them: give it Debian/Ubuntu packages in PARALLAX_DEPS, either a folder of
# .deb files (unpacked with dpkg -x into BUILD_DIR/deps, nothing installed) or a prefix unpacked
# (usr/include, usr/lib/<triplet>; or a plain prefix with include/ and lib/). Fetch them on a
# machine with a network with `scripts/gpu.sh --fetch-deps DIR` (apt-get download: libcjson1,
# libcjson-dev, libopenblas0-pthread, libopenblas-pthread-dev, libopenblas-dev, libgfortran5,
# and pkgconf, pkgconf-bin, libpkgconf3 for a machine without pkg-config; about 13 MB), carry
# DIR along and run `PARALLAX_DEPS=DIR scripts/gpu.sh`. No MPI is needed (with it, the GPU tests
# also train the parallel layouts: over NCCL when every rank has a GPU, else staged through host
# memory).
#
# Environment: CUDA_ARCH (default 90), BUILD_DIR (default build-gpu), JOBS (default nproc),
# PARALLAX_DEPS (above), PARALLAX_GPU_TARGETS (space-separated build targets; default all),
# GPU_CLUSTER (the cluster profile the GPU runs are planned on; default from the GPU's name:
# dgx-h100, dgx-h200, dgx-a100 or dgx-b200).
# shellcheck disable=SC2317  # (file-wide) the step_* functions are called by name, "step_$s"
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
ROOT=$(pwd)

DEFAULT_STEPS="preflight configure build test train validate bench calibrate pytorch sanitize"
DEB_PACKAGES="libcjson1 libcjson-dev libopenblas0-pthread libopenblas-pthread-dev libopenblas-dev
              libgfortran5 pkgconf pkgconf-bin libpkgconf3"

die() { echo "gpu.sh: $*" >&2; exit 2; }

usage() { sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; }

# ---- arguments ----

STEPS=$DEFAULT_STEPS
RESULTS=
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) [ $# -ge 2 ] || die "--steps needs a list"; STEPS=${2//,/ }; shift 2 ;;
    --fetch-deps)
      [ $# -ge 2 ] || die "--fetch-deps needs a folder"
      mkdir -p "$2" || die "cannot create $2"
      cd "$2" || die "cannot use $2"
      # shellcheck disable=SC2086
      apt-get download $DEB_PACKAGES || die "apt-get download failed (network? a Debian/Ubuntu machine?)"
      echo "gpu.sh: packages in $(pwd); on the GPU machine: PARALLAX_DEPS=$(pwd) scripts/gpu.sh"
      exit 0 ;;
    -h|--help) usage; exit 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) [ -z "$RESULTS" ] || die "one results folder only"; RESULTS=$1; shift ;;
  esac
done
for s in $STEPS; do
  case " $DEFAULT_STEPS " in *" $s "*) ;; *) die "unknown step '$s' (steps: $DEFAULT_STEPS)" ;; esac
done
RESULTS=${RESULTS:-gpu-results}
mkdir -p "$RESULTS" || die "cannot create $RESULTS"
RESULTS=$(cd "$RESULTS" && pwd)
BUILD=${BUILD_DIR:-build-gpu}
case "$BUILD" in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 4)}
CUDA_ARCH=${CUDA_ARCH:-90}
NVCC=$(command -v nvcc || true)
[ -n "$NVCC" ] || { [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc; }

# ---- dependencies from PARALLAX_DEPS ----

CMAKE_DEPS_ARGS=()
setup_deps() {
  [ -n "${PARALLAX_DEPS:-}" ] || return 0
  local deps
  deps=$(cd "$PARALLAX_DEPS" 2>/dev/null && pwd) || die "PARALLAX_DEPS=$PARALLAX_DEPS: no such folder"
  if compgen -G "$deps/*.deb" >/dev/null; then
    # unpacked beside the build, which links to them (and finds them again through its RPATH)
    local root=$BUILD/deps
    rm -rf "$root"
    mkdir -p "$root" || die "cannot create $root"
    for f in "$deps"/*.deb; do dpkg -x "$f" "$root" || die "dpkg -x $f failed"; done
    deps=$root
  fi
  local libdirs pcdirs
  libdirs=$(find "$deps" \( -name '*.so' -o -name '*.so.*' \) -printf '%h\n' 2>/dev/null | sort -u | paste -sd:)
  pcdirs=$(find "$deps" -type d -name pkgconfig 2>/dev/null | sort -u | paste -sd:)
  export LD_LIBRARY_PATH=$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  if [ -d "$deps/usr/include" ]; then
    # Debian layout: the .pc files say /usr/...; the sysroot prefixes their -I and -L paths
    export PKG_CONFIG_SYSROOT_DIR=$deps
    export PKG_CONFIG_LIBDIR=$pcdirs  # these, not the system's: a missing package shows
  else
    export PKG_CONFIG_PATH=$pcdirs${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
    CMAKE_DEPS_ARGS+=("-DCMAKE_PREFIX_PATH=$deps")
  fi
  local pc=
  pkg-config --version >/dev/null 2>&1 && pc=$(command -v pkg-config)
  [ -n "$pc" ] || pc=$(find "$deps" -path '*/bin/pkgconf' -type f 2>/dev/null | head -n1)
  [ -n "$pc" ] || die "no pkg-config on this machine and none in PARALLAX_DEPS (add pkgconf, pkgconf-bin, libpkgconf3)"
  CMAKE_DEPS_ARGS+=("-DPKG_CONFIG_EXECUTABLE=$pc")
  echo "gpu.sh: dependencies from $deps (pkg-config: $pc)"
}

# ---- steps ----

step_preflight() {
  local out=$RESULTS/system.txt ok=0
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host: $(uname -a)"
    echo "commit: $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
    echo; echo "== nvidia-smi"
    if command -v nvidia-smi >/dev/null && nvidia-smi; then
      nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem \
                 --format=csv || true
    else
      echo "nvidia-smi: not found or failed"; ok=1
    fi
    echo; echo "== nvcc"; if [ -n "$NVCC" ]; then "$NVCC" --version; else echo "nvcc: not found"; ok=1; fi
    echo; echo "== cmake"; cmake --version || ok=1
    echo; echo "== compilers"; cc --version | head -n1 || ok=1; c++ --version | head -n1 || ok=1
    echo; echo "== pkg-config"; pkg-config --modversion libcjson openblas 2>&1 || true
  } >"$out" 2>&1
  if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu.sh: no NVIDIA GPU visible (nvidia-smi missing or failing; see $out)." >&2
    echo "gpu.sh: run this on a GPU machine, or build only: --steps configure,build" >&2
    return 1
  fi
  [ -n "$NVCC" ] || { echo "gpu.sh: no nvcc (put the CUDA toolkit's bin on PATH)" >&2; return 1; }
  return "$ok"
}

step_configure() {
  local cuda_args=(-DPARALLAX_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCH")
  [ -n "$NVCC" ] && cuda_args+=("-DCMAKE_CUDA_COMPILER=$NVCC")
  cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release "${cuda_args[@]}" \
        "${CMAKE_DEPS_ARGS[@]}" >"$RESULTS/build.log" 2>&1
  local rc=$?
  [ "$rc" -eq 0 ] || { echo "gpu.sh: configure failed:" >&2; tail -n 20 "$RESULTS/build.log" >&2; }
  return "$rc"
}

step_build() {
  local targets=()
  for t in ${PARALLAX_GPU_TARGETS:-}; do targets+=(--target "$t"); done
  cmake --build "$BUILD" -j "$JOBS" "${targets[@]}" >>"$RESULTS/build.log" 2>&1
  local rc=$?
  [ "$rc" -eq 0 ] || { echo "gpu.sh: build failed:" >&2; grep -E 'error|Error' "$RESULTS/build.log" | head -n 20 >&2; }
  return "$rc"
}

step_test() {
  local out=$RESULTS/test.log
  (cd "$BUILD" && ctest -L gpu --output-on-failure) >"$out" 2>&1
  local rc=$?
  # ctest counts a skipped test (exit 77: no device) as passing; here a GPU is the point
  if grep -q -E 'Skipped|Not Run' "$out"; then
    echo "gpu.sh: a GPU test skipped itself (kern_cuda() saw no device); see $out" >&2
    return 1
  fi
  grep -q -E 'tests passed' "$out" || { echo "gpu.sh: no GPU test ran; see $out" >&2; return 1; }
  return "$rc"
}

# ---- training runs: helpers ----

PX=$BUILD/parallax
# the cluster profile the GPU runs are planned on: the GPU's own when parallax has it
gpu_cluster() {
  if [ -n "${GPU_CLUSTER:-}" ]; then echo "$GPU_CLUSTER"; return; fi
  local name
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1)
  case "$name" in
    *H200*) echo dgx-h200 ;; *H100*) echo dgx-h100 ;; *A100*) echo dgx-a100 ;; *B200*) echo dgx-b200 ;;
    *) echo dgx-h100 ;;
  esac
}
# the first number under "KEY" in a JSON file parallax wrote (one key per line)
jnum() { grep -m1 -o "\"$2\":[[:space:]]*[-0-9.eE+]*" "$1" | sed 's/.*:[[:space:]]*//'; }
# one step's losses of a metrics log, one per line
losses() { sed -n 's/.*"loss": \([-0-9.eE+a-z]*\).*/\1/p' "$1"; }
# single-GPU knobs: one rank, nothing sharded
ONE=(--gpus 1 --tp 1 --pp 1 --dp 1 --zero 0 --vpp 1 --schedule 1f1b)

step_train() {
  local out=$RESULTS/train.txt dir=$RESULTS/train rc=0 cluster
  cluster=$(gpu_cluster)
  mkdir -p "$dir"
  {
    echo "20 steps on the CPU (fp32) and on the GPU ($cluster profile, bf16): per-step loss"
    echo "the tolerance (2e-3 relative, half of bf16's unit roundoff) is wider than what the"
    echo "emulator measures over 8 steps of tiny (1.9e-4): 20 steps let the runs drift apart"
  } >"$out"
  local job model knobs
  for job in "tiny|--seq 64 --gbs 8 --mbs 4" "gpt2-124m|--seq 128 --gbs 4 --mbs 4"; do
    model=${job%%|*} knobs=${job#*|}
    # shellcheck disable=SC2086
    { "$PX" plan --model "$model" --cluster local "${ONE[@]}" $knobs --steps 20 --precision fp32 \
          -o "$dir/$model-cpu.json" &&
      "$PX" plan --model "$model" --cluster "$cluster" "${ONE[@]}" $knobs --steps 20 --precision bf16 \
          -o "$dir/$model-cuda.json"; } >>"$dir/log" 2>&1 || { echo "gpu.sh: planning $model failed" >&2; rc=1; continue; }
    # the CPU reference gets every core for its BLAS
    PARALLAX_BLAS_THREADS=$JOBS "$PX" run "$dir/$model-cpu.json" --backend cpu --launcher none \
        -o "$dir/$model-cpu.run.json" >>"$dir/log" 2>&1 || { echo "gpu.sh: the CPU run of $model failed" >&2; rc=1; continue; }
    "$PX" run "$dir/$model-cuda.json" --backend cuda --launcher none -o "$dir/$model-cuda.run.json" \
        >"$dir/$model-cuda.log" 2>&1 || { echo "gpu.sh: the GPU run of $model failed (see $dir/$model-cuda.log)" >&2; rc=1; continue; }
    echo >>"$out"
    head -n 1 "$dir/$model-cuda.log" >>"$out"
    paste <(losses "$dir/$model-cpu.run.metrics.jsonl") <(losses "$dir/$model-cuda.run.metrics.jsonl") |
      awk -v model="$model" -v tol=2e-3 '
        BEGIN { printf "%-10s %5s %12s %12s %10s\n", model, "step", "cpu fp32", "cuda bf16", "rel diff" }
        { d = ($2 - $1) / $1; if (d < 0) d = -d; if (d > w) w = d; if (!(d <= tol)) bad++
          printf "%-10s %5d %12.6f %12.6f %10.2e\n", "", NR, $1, $2, d }
        END { printf "%-10s worst %.2e (tolerance %.0e): %s\n", model, w, tol, bad || NR != 20 ? "FAILED" : "ok"
              exit (bad || NR != 20) }' >>"$out" || rc=1
  done
  [ "$rc" -eq 0 ] || echo "gpu.sh: the GPU's losses do not track the CPU's; see $out" >&2
  return "$rc"
}

step_validate() {
  local out=$RESULTS/validate.txt dir=$RESULTS/validate rc=0 cluster rec
  cluster=$(gpu_cluster)
  mkdir -p "$dir"
  echo "gpt2-124m on one GPU ($cluster profile), bf16, mbs 4, seq 1024, 20 steps: predicted against measured" >"$out"
  printf '%-10s %11s %11s %8s   %13s %13s %8s %13s\n' recompute "step pred" "step meas" error \
    "memory pred" "device peak" error "arenas" >>"$out"
  for rec in none selective full; do
    if ! { "$PX" plan --model gpt2-124m --cluster "$cluster" "${ONE[@]}" --mbs 4 --gbs 4 --seq 1024 \
               --steps 20 --precision bf16 --recompute "$rec" -o "$dir/$rec.json" >>"$dir/log" 2>&1 &&
           "$PX" run "$dir/$rec.json" --backend cuda --launcher none -o "$dir/$rec.run.json" \
               >"$dir/$rec.log" 2>&1; }; then
      echo "gpu.sh: validate: the $rec run failed (see $dir/$rec.log)" >&2
      rc=1
      continue
    fi
    local ps ms pm dm ar
    ps=$(jnum "$dir/$rec.json" step_s) ms=$(jnum "$dir/$rec.run.json" step_s_median)
    pm=$(jnum "$dir/$rec.json" total) dm=$(jnum "$dir/$rec.run.json" device_used_peak_bytes)
    ar=$(jnum "$dir/$rec.run.json" arena_bytes)
    awk -v r="$rec" -v ps="$ps" -v ms="$ms" -v pm="$pm" -v dm="$dm" -v ar="$ar" 'BEGIN {
      printf "%-10s %10.4fs %10.4fs %+7.1f%%   %10.3f GiB %10.3f GiB %+7.1f%% %10.3f GiB\n", r, ps, ms,
             100 * (ms - ps) / ps, pm / 2^30, dm / 2^30, 100 * (dm - pm) / pm, ar / 2^30 }' >>"$out"
    { echo; echo "== parallax compare ($rec)"; "$PX" compare "$dir/$rec.json" "$dir/$rec.run.json"; } \
      >>"$dir/compare.txt" 2>&1
  done
  {
    echo
    echo "memory pred: the simulator's total for the rank (every category, the profile's runtime"
    echo "allowance included); device peak: cudaMemGetInfo's bytes in use at the peak (context,"
    echo "cuBLAS and everything else on the device); arenas: what the executor allocated, which"
    echo "equals the prediction category by category (see compare.txt beside this file)"
  } >>"$out"
  return "$rc"
}

step_bench() {
  local bin=$BUILD/kernels/bench_kernels_cuda
  [ -x "$bin" ] || { echo "gpu.sh: $bin was not built" >&2; return 1; }
  "$bin" >"$RESULTS/bench.txt" 2>&1
  local rc=$?
  [ "$rc" -eq 77 ] && echo "gpu.sh: the benchmark saw no device" >&2
  [ "$rc" -eq 0 ] || return "$rc"
  # training throughput: gpt2-124m at realistic micro-batches, one GPU, bf16
  local dir=$RESULTS/bench cluster mbs
  cluster=$(gpu_cluster)
  mkdir -p "$dir"
  {
    echo
    echo "== training: gpt2-124m on one GPU, bf16, seq 1024, flash attention, 20 steps (median after the first)"
    printf '%5s %12s %10s %8s %14s %10s\n' mbs "step (s)" "tokens/s" MFU "predicted (s)" "pred MFU"
  } >>"$RESULTS/bench.txt"
  for mbs in 8 16; do
    if ! { "$PX" plan --model gpt2-124m --cluster "$cluster" "${ONE[@]}" --mbs "$mbs" --gbs "$mbs" \
               --seq 1024 --steps 20 --precision bf16 --recompute none -o "$dir/mbs$mbs.json" \
               >>"$dir/log" 2>&1 &&
           "$PX" run "$dir/mbs$mbs.json" --backend cuda --launcher none --quiet \
               -o "$dir/mbs$mbs.run.json" >>"$dir/log" 2>&1; }; then
      echo "gpu.sh: bench: gpt2-124m at mbs $mbs failed (out of memory? see $dir/log)" >&2
      rc=1
      continue
    fi
    local ps ms mfu
    ps=$(jnum "$dir/mbs$mbs.json" step_s) ms=$(jnum "$dir/mbs$mbs.run.json" step_s_median)
    mfu=$(jnum "$dir/mbs$mbs.json" mfu)
    # MFU = model FLOPs / (time x peak): the prediction's, scaled by its step time over ours
    awk -v b="$mbs" -v ps="$ps" -v ms="$ms" -v mfu="$mfu" 'BEGIN {
      printf "%5d %12.4f %10.0f %7.1f%% %14.4f %9.1f%%\n", b, ms, b * 1024 / ms, 100 * mfu * ps / ms, ps, 100 * mfu }' \
      >>"$RESULTS/bench.txt"
  done
  echo "(measured with every op timed: the executor waits for the GPU at each op's start and end)" >>"$RESULTS/bench.txt"
  return "$rc"
}

step_calibrate() {
  local out=$RESULTS/calibrate.txt name file
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1 |
         tr '[:upper:]' '[:lower:]' | sed 's/^nvidia //; s/[^a-z0-9]\{1,\}/-/g; s/^-//; s/-$//')
  file=$ROOT/profiles/${name:-gpu}-measured.json
  # one rank on the one GPU: GEMMs, op rates, peak and bandwidth; the collectives keep the base
  # profile's figures (calibrate's comm part measures the MPI layer, not NCCL)
  "$PX" calibrate --backend cuda --base "$(gpu_cluster)" --ranks 1 -o "$file" >"$out" 2>&1 || {
    echo "gpu.sh: parallax calibrate failed; see $out" >&2
    return 1
  }
  cp "$file" "$RESULTS/" && echo "wrote $file (and a copy in $RESULTS)" >>"$out"
}

step_pytorch() {
  local out=$RESULTS/pytorch.txt dir=$RESULTS/pytorch
  if ! python3 -c 'import torch' >/dev/null 2>&1; then
    echo "python3 has no torch here: no comparison with PyTorch" | tee "$out" >&2
    return 77
  fi
  local dump=$BUILD/exec_dump
  [ -x "$dump" ] || { echo "gpu.sh: $dump was not built" >&2; return 1; }
  mkdir -p "$dir"
  "$PX" plan --model tiny --cluster local "${ONE[@]}" --seq 64 --gbs 4 --mbs 4 --precision fp32 \
      -o "$dir/tiny.json" >"$dir/log" 2>&1 &&
    "$dump" "$dir/tiny.json" "$dir/tiny.dump" >>"$dir/log" 2>&1 &&
    python3 "$ROOT/scripts/pytorch_check.py" "$dir/tiny.dump" >"$out" 2>&1
  local rc=$?
  [ "$rc" -eq 0 ] || echo "gpu.sh: the PyTorch comparison failed; see $out" >&2
  return "$rc"
}

step_sanitize() {
  local cs bin=$BUILD/kernels/test_kernels_cuda out=$RESULTS/sanitize.log rc=0
  cs=$(command -v compute-sanitizer || true)
  [ -n "$cs" ] || [ ! -x "${NVCC%/nvcc}/compute-sanitizer" ] || cs=${NVCC%/nvcc}/compute-sanitizer
  [ -n "$cs" ] || { echo "gpu.sh: no compute-sanitizer" >&2; return 1; }
  : >"$out"
  for tool in memcheck racecheck synccheck; do
    echo "== compute-sanitizer --tool $tool" >>"$out"
    PARALLAX_TEST_LARGE=0 "$cs" --tool "$tool" --error-exitcode 99 "$bin" >>"$out" 2>&1 || {
      echo "gpu.sh: compute-sanitizer --tool $tool failed; see $out" >&2
      rc=1
    }
  done
  return "$rc"
}

# ---- run ----

setup_deps
SUMMARY=$RESULTS/summary.txt
echo "parallax gpu.sh $(date -u +%Y-%m-%dT%H:%M:%SZ) steps: $STEPS" >"$SUMMARY"
status=0 blocked=
for s in $STEPS; do
  if [ -n "$blocked" ]; then
    printf '%-10s skipped (after %s failed)\n' "$s" "$blocked" | tee -a "$SUMMARY"
    continue
  fi
  echo "== $s"
  t0=$(date +%s)
  "step_$s"
  rc=$?
  dt=$(( $(date +%s) - t0 ))
  if [ "$rc" -eq 0 ]; then
    printf '%-10s ok      %4ds\n' "$s" "$dt" | tee -a "$SUMMARY"
  elif [ "$rc" -eq 77 ]; then
    printf '%-10s skipped %4ds (it said why above)\n' "$s" "$dt" | tee -a "$SUMMARY"
  else
    printf '%-10s FAILED  %4ds (exit %d)\n' "$s" "$dt" "$rc" | tee -a "$SUMMARY"
    status=1
    case $s in preflight|configure|build) blocked=$s ;; esac
  fi
done
echo "results in $RESULTS:" "$(cd "$RESULTS" && find . -maxdepth 1 -type f -printf '%f ')"
exit $status

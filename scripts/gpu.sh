#!/usr/bin/env bash
# gpu.sh — build parallax with its CUDA backend on a machine with an NVIDIA GPU, run the GPU
# tests, train on the GPU against the CPU, check the simulator's prediction, benchmark, calibrate,
# and keep what they printed, packed in one archive. Nothing here needs a network.
#
#   scripts/gpu.sh [--part 1|2] [--steps LIST] [--archive FILE] [--dry-run] [RESULTS_DIR]
#   scripts/gpu.sh --fetch-deps DIR                  (on a machine with apt and a network)
#
# RESULTS_DIR defaults to ./gpu-results. --part runs one of two halves, each sized to finish in
# under 10 minutes on one H100 (a lent machine takes commands of at most 10 minutes; how to run
# them there is in docs/gpu.md):
#   --part 1   preflight configure build test train validate bench
#   --part 2   preflight configure build calibrate pytorch sanitize
# Without --part or --steps every step of both runs. --steps takes a comma-separated list
# instead (revalidate, which needs no GPU, runs only when named). --dry-run prints the commands
# each step would run, runs none and needs no GPU. --archive FILE packs RESULTS_DIR into one
# .tar.gz at the end, whatever failed.
#
# Steps:
#   preflight  tools present, a GPU visible; nvidia-smi, nvcc, cmake, compiler    → system.txt
#   configure  cmake with PARALLAX_CUDA=ON, CMAKE_CUDA_ARCHITECTURES=$CUDA_ARCH (90: Hopper)
#   build      cmake --build (the targets the steps asked for need), then gpu-env.sh: the
#              library folders of PARALLAX_DEPS that the built programs need, nothing else → build.log
#   test       ctest -L gpu --timeout: the CUDA backend against the CPU one, every kernel, bf16
#              and fp16, the executor on the GPU (a skipped test counts as a failure here) → test.log
#   train      20 steps of tiny and of gpt2-124m (seq 128) on the GPU in bf16 beside the same
#              job on the CPU in fp32: both loss columns, the deviation, a tolerance → train.txt
#   validate   gpt2-124m, mbs 4, seq 1024, vocabulary padded to 128: fused and unfused attention,
#              recompute none, selective and full, each timed per step after a warm-up; the
#              step time and memory predicted by the stock profile and by the calibrated one
#              (when there is one) against the measured ones; parallax compare per op → validate.txt
#   bench      bench_kernels_cuda (GEMM TFLOP/s, bandwidth, attention) after a clock warm-up;
#              gpt2-124m at mbs 8 and 16, seq 1024, padded vocabulary: tokens/s and MFU timed
#              per op and per step                                            → bench.txt
#   calibrate  parallax calibrate --backend cuda on gpt2-124m and a Llama-shaped model
#              (bench/models/llama3-8b-4l.json): profiles/<gpu>-measured.json (a copy in
#              RESULTS_DIR)                                                   → calibrate.txt
#   pytorch    when python3 has torch: one forward and backward of tiny in PyTorch with the
#              weights and batch parallax exported, loss and gradient norms compared (skipped
#              otherwise)                                                     → pytorch.txt
#   sanitize   compute-sanitizer over the kernel test at its small shapes: memcheck over every
#              kernel, racecheck and synccheck over parallax's own (not cuBLAS's), errors only
#                                                                             → sanitize.log
#   revalidate (no GPU) validate's measured runs in RESULTS_DIR against the calibrated profile
#              CALIBRATED=FILE, after a part 2 made it                         → revalidate.txt
# summary.txt lists each step's status and seconds; the exit status is 0 only when every step
# that ran passed (a step that skips itself, exit 77, is listed as skipped and does not fail the
# run). A failed configure or build skips the steps after it, and so does the time budget:
# PARALLAX_GPU_BUDGET_S (default 540) seconds after the start no step begins, and every
# command is given at most what is left, so that the archive is written before a 10-minute
# limit ends the command. To add a step: a function step_NAME that returns non-zero on failure
# (77: skipped, saying why) and writes one file in $RESULTS, run through `x` (--dry-run), and
# NAME in a part.
#
# What the machine needs: the CUDA toolkit (nvcc, cuBLAS; CUDA 12 or newer), CMake >= 3.20, a
# C/C++ compiler, and the driver. The build also links cJSON (every parallax program), OpenBLAS
# (the CPU reference backend), zlib (checkpoints) and cmark-gfm (report.html), found with pkg-config and CMake. A GPU
# machine without a network may lack them: give it Debian/Ubuntu packages in PARALLAX_DEPS,
# either a folder of .deb files (unpacked with dpkg -x into BUILD_DIR/deps, nothing installed)
# or a prefix unpacked (usr/include, usr/lib/<triplet>; or a plain prefix with include/ and
# lib/). Fetch them on a machine with a network with `scripts/gpu.sh --fetch-deps DIR`
# (apt-get download of $DEB_PACKAGES below, about 14 MB), carry DIR along and run
# `PARALLAX_DEPS=DIR scripts/gpu.sh`. No MPI is needed (with it, the GPU tests also train the
# parallel layouts: over NCCL when every rank has a GPU, else staged through host memory).
#
# Environment: CUDA_ARCH (default 90), BUILD_DIR (default build-gpu), JOBS (default nproc),
# PARALLAX_DEPS (above), PARALLAX_GPU_TARGETS (space-separated build targets; default: what
# the steps need), GPU_CLUSTER (the cluster profile the GPU runs are planned on; default from
# the GPU's name: dgx-h100, dgx-h200, dgx-a100 or dgx-b200), CALIBRATED (the calibrated profile
# validate and revalidate use; default profiles/<gpu>-measured.json when it exists),
# CALIB_MODELS (default gpt2-124m and the Llama-shaped model), PARALLAX_GPU_BUDGET_S (above).
# shellcheck disable=SC2317  # (file-wide) the step_* functions are called by name, "step_$s"
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
ROOT=$(pwd)
T_START=$(date +%s)

PART1="preflight configure build test train validate bench"
PART2="preflight configure build calibrate pytorch sanitize"
ALL_STEPS="preflight configure build test train validate bench calibrate pytorch sanitize revalidate"
DEB_PACKAGES="libcjson1 libcjson-dev libopenblas0-pthread libopenblas-pthread-dev libopenblas-dev
              libgfortran5 zlib1g zlib1g-dev pkgconf pkgconf-bin libpkgconf3
              libcmark-gfm0.29.0.gfm.6 libcmark-gfm-dev libcmark-gfm-extensions0.29.0.gfm.6
              libcmark-gfm-extensions-dev"

die() { echo "gpu.sh: $*" >&2; exit 2; }

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; }

# ---- arguments ----

STEPS=
RESULTS=
ARCHIVE=
DRY=
while [ $# -gt 0 ]; do
  case "$1" in
    --part)
      [ $# -ge 2 ] || die "--part needs 1 or 2"
      case "$2" in 1) STEPS=$PART1 ;; 2) STEPS=$PART2 ;; *) die "--part: expected 1 or 2, got '$2'" ;; esac
      shift 2 ;;
    --steps) [ $# -ge 2 ] || die "--steps needs a list"; STEPS=${2//,/ }; shift 2 ;;
    --archive) [ $# -ge 2 ] || die "--archive needs a file"; ARCHIVE=$2; shift 2 ;;
    --dry-run) DRY=1; shift ;;
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
[ -n "$STEPS" ] || STEPS="$PART1 calibrate pytorch sanitize"
# the parts share preflight, configure and build: once each (split into words on purpose)
# shellcheck disable=SC2086
STEPS=$(printf '%s\n' $STEPS | awk '!seen[$0]++' | paste -sd' ')
for s in $STEPS; do
  case " $ALL_STEPS " in *" $s "*) ;; *) die "unknown step '$s' (steps: $ALL_STEPS)" ;; esac
done
RESULTS=${RESULTS:-gpu-results}
mkdir -p "$RESULTS" || die "cannot create $RESULTS"
RESULTS=$(cd "$RESULTS" && pwd)
if [ -n "$ARCHIVE" ]; then
  mkdir -p "$(dirname "$ARCHIVE")" || die "cannot create the folder of $ARCHIVE"
  ARCHIVE=$(cd "$(dirname "$ARCHIVE")" && pwd)/$(basename "$ARCHIVE")
  case "$ARCHIVE" in "$RESULTS"/*) die "--archive $ARCHIVE: not inside the results folder it packs" ;; esac
fi
BUILD=${BUILD_DIR:-build-gpu}
case "$BUILD" in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
ENV_FILE=$BUILD/gpu-env.sh
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 4)}
CUDA_ARCH=${CUDA_ARCH:-90}
BUDGET=${PARALLAX_GPU_BUDGET_S:-540}
case "$BUDGET" in ''|*[!0-9]*) die "PARALLAX_GPU_BUDGET_S=$BUDGET: expected whole seconds" ;; esac
NVCC=$(command -v nvcc || true)
[ -n "$NVCC" ] || { [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc; }
exec 3>&1 # --dry-run prints here, whatever a step redirects

# ---- running commands: --dry-run, the time budget, the library environment ----

# Runs a command, or under --dry-run prints it.
x() {
  if [ -n "$DRY" ]; then
    printf '   ' >&3
    printf ' %q' "$@" >&3
    printf '\n' >&3
    return 0
  fi
  "$@"
}

# Seconds a command may take: at most $1, and never past the budget (less 20 s for the archive).
lim() {
  local left=$(( T_START + BUDGET - 20 - $(date +%s) ))
  [ "$left" -lt "$1" ] || left=$1
  [ "$left" -ge 1 ] || left=1
  echo "$left"
}

# Runs a built program (argument 2 on) within $1 seconds, with gpu-env.sh's libraries.
run_px() {
  local limit=$1
  shift
  (
    # shellcheck disable=SC1090
    [ -f "$ENV_FILE" ] && . "$ENV_FILE"
    exec timeout -k 10 "$limit" "$@"
  )
}

# ---- dependencies from PARALLAX_DEPS ----

CMAKE_DEPS_ARGS=()
DEPS=
setup_deps() {
  [ -n "${PARALLAX_DEPS:-}" ] || return 0
  DEPS=$(cd "$PARALLAX_DEPS" 2>/dev/null && pwd) || die "PARALLAX_DEPS=$PARALLAX_DEPS: no such folder"
  if compgen -G "$DEPS/*.deb" >/dev/null; then
    # unpacked beside the build, which links to them (and finds them again through its RPATH)
    local root=$BUILD/deps
    if [ -n "$DRY" ]; then
      echo "    (dpkg -x each of $DEPS/*.deb into $root)" >&3
    else
      rm -rf "$root"
      mkdir -p "$root" || die "cannot create $root"
      for f in "$DEPS"/*.deb; do dpkg -x "$f" "$root" || die "dpkg -x $f failed"; done
      # Debian links some libraries absolutely (zlib1g-dev: usr/lib/<triplet>/libz.so ->
      # /lib/<triplet>/libz.so.1.2.13): unpacked here, that points at the system's file of that
      # exact version or at nothing, and CMake finds no zlib. Pointed at the copy unpacked here.
      local l t
      while IFS= read -r l; do
        t=$(readlink "$l")
        case "$t" in /*) [ -e "$root$t" ] && ln -sfn "$root$t" "$l" ;; esac
      done < <(find "$root" -type l)
    fi
    DEPS=$root
  fi
  local pcdirs
  pcdirs=$(find "$DEPS" -type d -name pkgconfig 2>/dev/null | sort -u | paste -sd:)
  if [ -d "$DEPS/usr/include" ] || [ -n "$DRY" ]; then
    # Debian layout: the .pc files say /usr/...; the sysroot prefixes their -I and -L paths
    export PKG_CONFIG_SYSROOT_DIR=$DEPS
    export PKG_CONFIG_LIBDIR=$pcdirs  # these, not the system's: a missing package shows
    CMAKE_DEPS_ARGS+=("-DCMAKE_PREFIX_PATH=$DEPS/usr" "-DZLIB_ROOT=$DEPS/usr")
  else
    export PKG_CONFIG_PATH=$pcdirs${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
    CMAKE_DEPS_ARGS+=("-DCMAKE_PREFIX_PATH=$DEPS" "-DZLIB_ROOT=$DEPS")
  fi
  local pc=
  pkg-config --version >/dev/null 2>&1 && pc=$(command -v pkg-config)
  if [ -z "$pc" ]; then
    # the carried pkgconf, through a wrapper that gives it its own library alone
    local bin lib
    bin=$(find "$DEPS" -path '*/bin/pkgconf' -type f 2>/dev/null | head -n1)
    lib=$(find "$DEPS" -name 'libpkgconf.so.*' 2>/dev/null | head -n1)
    [ -n "$bin" ] || [ -n "$DRY" ] ||
      die "no pkg-config on this machine and none in PARALLAX_DEPS (add pkgconf, pkgconf-bin, libpkgconf3)"
    pc=$DEPS/pkg-config
    # shellcheck disable=SC2016  # (the wrapper expands them when it runs)
    [ -n "$DRY" ] || printf '#!/bin/sh\nLD_LIBRARY_PATH=%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec %s "$@"\n' \
      "$(dirname "${lib:-$bin}")" "$bin" >"$pc" && chmod +x "$pc"
  fi
  CMAKE_DEPS_ARGS+=("-DPKG_CONFIG_EXECUTABLE=$pc")
  echo "gpu.sh: dependencies from $DEPS (pkg-config: $pc)"
}

# gpu-env.sh: LD_LIBRARY_PATH with the folders of PARALLAX_DEPS that hold a library the built
# programs need and the system lacks (OpenBLAS's libgfortran, say), found with ldd, and nothing
# else: cmake, nvcc, python3 and the profilers keep the system's libraries. Sourced by run_px.
write_env() {
  local progs=() p dirs='' missing so d
  for p in parallax parallax-worker exec_dump kernels/test_kernels_cuda exec/test_exec_cuda \
           kernels/bench_kernels_cuda; do
    [ -x "$BUILD/$p" ] && progs+=("$BUILD/$p")
  done
  # a library found may need another: a few rounds, until ldd finds everything
  for _ in 1 2 3 4 5; do
    if [ -z "$DEPS" ] || [ ${#progs[@]} -eq 0 ]; then break; fi
    missing=$(LD_LIBRARY_PATH=$dirs ldd "${progs[@]}" 2>/dev/null | awk '/=> not found/ { print $1 }' | sort -u)
    [ -n "$missing" ] || break
    for so in $missing; do
      d=$(find "$DEPS" -name "$so" 2>/dev/null | head -n1)
      [ -n "$d" ] || { echo "gpu.sh: $so: needed by the programs, in neither the system nor PARALLAX_DEPS" >&2; continue; }
      d=$(dirname "$d")
      case ":$dirs:" in *":$d:"*) ;; *) dirs=${dirs:+$dirs:}$d ;; esac
    done
  done
  {
    echo "# written by scripts/gpu.sh: the libraries parallax's programs need that this machine"
    echo "# lacks, from PARALLAX_DEPS (nothing when it has them all). Source it before running them."
    [ -z "$dirs" ] || echo "export LD_LIBRARY_PATH=$dirs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
  } >"$ENV_FILE"
  echo "gpu.sh: $ENV_FILE: ${dirs:-no library folder needed}"
}

# ---- steps ----

step_preflight() {
  local out=$RESULTS/system.txt ok=0
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host: $(uname -a)"
    echo "commit: $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
    echo "steps: $STEPS"
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
    echo; echo "== tools"
    for t in ninja mpirun compute-sanitizer python3 ldd timeout tar; do
      printf '%-18s %s\n' "$t" "$(command -v "$t" || echo '(none)')"
    done
    echo; echo "== pkg-config"; pkg-config --modversion libcjson openblas zlib 2>&1 || true
  } >"$out" 2>&1
  if [ -n "$DRY" ]; then
    echo "    (dry run: no GPU needed; the machine's tools are in $out)" >&3
    return 0
  fi
  if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu.sh: no NVIDIA GPU visible (nvidia-smi missing or failing; see $out)." >&2
    echo "gpu.sh: run this on a GPU machine, or build only: --steps configure,build" >&2
    return 1
  fi
  [ -n "$NVCC" ] || { echo "gpu.sh: no nvcc (put the CUDA toolkit's bin on PATH)" >&2; return 1; }
  return "$ok"
}

step_configure() {
  local args=(-DPARALLAX_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCH" -DCMAKE_BUILD_TYPE=Release)
  [ -n "$NVCC" ] && args+=("-DCMAKE_CUDA_COMPILER=$NVCC")
  # ninja when there is one and the build folder is new (a folder keeps its generator)
  if command -v ninja >/dev/null && [ ! -f "$BUILD/CMakeCache.txt" ]; then args+=(-G Ninja); fi
  x timeout -k 10 "$(lim 300)" cmake -S "$ROOT" -B "$BUILD" "${args[@]}" "${CMAKE_DEPS_ARGS[@]}" \
    >"$RESULTS/build.log" 2>&1
  local rc=$?
  [ "$rc" -eq 0 ] || { echo "gpu.sh: configure failed:" >&2; tail -n 20 "$RESULTS/build.log" >&2; }
  return "$rc"
}

# What the steps to run need built.
build_targets() {
  local t=() s
  for s in $STEPS; do
    case $s in
      test) t+=(parallax parallax-worker test_kernels_cuda test_exec_cuda)
            # the parallel layouts' GPU test exists only with MPI
            if [ -z "$DRY" ] && cmake --build "$BUILD" --target help 2>/dev/null | grep -q 'test_exec_cuda_mpi\b'; then
              t+=(test_exec_cuda_mpi)
            fi ;;
      train|validate|calibrate) t+=(parallax parallax-worker) ;;
      bench) t+=(parallax parallax-worker bench_kernels_cuda) ;;
      pytorch) t+=(parallax exec_dump) ;;
      sanitize) t+=(test_kernels_cuda) ;;
    esac
  done
  printf '%s\n' "${t[@]}" | awk 'NF && !seen[$0]++' | paste -sd' '
}

step_build() {
  local targets=() t
  for t in ${PARALLAX_GPU_TARGETS:-$(build_targets)}; do targets+=(--target "$t"); done
  x timeout -k 10 "$(lim 400)" cmake --build "$BUILD" -j "$JOBS" "${targets[@]}" >>"$RESULTS/build.log" 2>&1
  local rc=$?
  [ "$rc" -eq 0 ] || { echo "gpu.sh: build failed:" >&2; grep -E 'error|Error' "$RESULTS/build.log" | head -n 20 >&2; }
  [ "$rc" -ne 0 ] || [ -n "$DRY" ] || write_env
  return "$rc"
}

step_test() {
  local out=$RESULTS/test.log
  x run_px "$(lim 420)" ctest --test-dir "$BUILD" -L gpu --timeout 300 -j 4 --output-on-failure \
    >"$out" 2>&1
  local rc=$?
  [ -z "$DRY" ] || return 0
  # ctest counts a skipped test (exit 77: no device) as passing; here a GPU is the point
  if grep -q -E 'Skipped|Not Run' "$out"; then
    echo "gpu.sh: a GPU test skipped itself (kern_cuda() saw no device); see $out" >&2
    return 1
  fi
  grep -q -E 'tests passed' "$out" || { echo "gpu.sh: no GPU test ran; see $out" >&2; return 1; }
  # every failed comparison of the kernel test, gathered at the end of the log
  local failed
  failed=$(grep -h 'FAILED' "$out")
  [ -z "$failed" ] || printf '\n== failed checks\n%s\n' "$failed" >>"$out"
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
# the GPU's name as a file name: "NVIDIA H100 80GB HBM3" -> h100-80gb-hbm3
gpu_slug() {
  nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1 |
    tr '[:upper:]' '[:lower:]' | sed 's/^nvidia //; s/[^a-z0-9]\{1,\}/-/g; s/^-//; s/-$//'
}
# the calibrated profile: CALIBRATED, else this GPU's measured profile when one exists
calibrated_profile() {
  if [ -n "${CALIBRATED:-}" ]; then echo "$CALIBRATED"; return; fi
  local f
  f=$ROOT/profiles/$(gpu_slug)-measured.json
  [ -f "$f" ] && echo "$f"
}
# the first number under "KEY" in a JSON file parallax wrote (one key per line)
jnum() { grep -m1 -o "\"$2\":[[:space:]]*[-0-9.eE+]*" "$1" | sed 's/.*:[[:space:]]*//'; }
# one step's losses of a metrics log, one per line
losses() { sed -n 's/.*"loss": \([-0-9.eE+a-z]*\).*/\1/p' "$1"; }
# the median step time in seconds of a metrics log after its first $2 steps (the warm-up:
# cuBLAS's first choices, the allocator, and the clocks, which idle low and take a while to rise)
median_after() {
  sed -n 's/.*"ms_per_step": \([0-9.eE+-]*\).*/\1/p' "$1" | tail -n +"$(( $2 + 1 ))" | sort -g |
    awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2] / 1e3;
                             else print (v[NR / 2] + v[NR / 2 + 1]) / 2e3 }'
}
# single-GPU knobs: one rank, nothing sharded
ONE=(--gpus 1 --tp 1 --pp 1 --dp 1 --zero 0 --vpp 1 --schedule 1f1b)
WARMUP=10  # steps left out of the measured medians

step_train() {
  local out=$RESULTS/train.txt dir=$RESULTS/train rc=0 cluster
  cluster=$(gpu_cluster)
  mkdir -p "$dir"
  {
    echo "20 steps on the CPU (fp32) and on the GPU ($cluster profile, bf16): per-step loss."
    echo "Steps 1-5 within 2e-3 relative (half of bf16's unit roundoff; the emulator measures"
    echo "1.9e-4 over 8 steps of tiny): a wrong kernel shows there. Later steps within 5e-2:"
    echo "training amplifies the rounding differences (an H200 measured 1.7e-2 at gpt2-124m's"
    echo "loss spike at step 13, which both runs have), so only a gross departure fails there"
  } >"$out"
  local job model knobs
  for job in "tiny|--seq 64 --gbs 8 --mbs 4" "gpt2-124m|--seq 128 --gbs 4 --mbs 4"; do
    model=${job%%|*} knobs=${job#*|}
    # shellcheck disable=SC2086
    { x run_px 30 "$PX" plan --model "$model" --cluster local "${ONE[@]}" $knobs --steps 20 --precision fp32 \
          -o "$dir/$model-cpu.json" &&
      x run_px 30 "$PX" plan --model "$model" --cluster "$cluster" "${ONE[@]}" $knobs --steps 20 --precision bf16 \
          -o "$dir/$model-cuda.json"; } >>"$dir/log" 2>&1 || { echo "gpu.sh: planning $model failed" >&2; rc=1; continue; }
    # the CPU reference gets every core for its BLAS
    PARALLAX_BLAS_THREADS=$JOBS x run_px "$(lim 240)" "$PX" run "$dir/$model-cpu.json" --backend cpu \
        --launcher none -o "$dir/$model-cpu.run.json" >>"$dir/log" 2>&1 ||
      { echo "gpu.sh: the CPU run of $model failed" >&2; rc=1; continue; }
    x run_px "$(lim 120)" "$PX" run "$dir/$model-cuda.json" --backend cuda --launcher none \
        -o "$dir/$model-cuda.run.json" >"$dir/$model-cuda.log" 2>&1 ||
      { echo "gpu.sh: the GPU run of $model failed (see $dir/$model-cuda.log)" >&2; rc=1; continue; }
    [ -z "$DRY" ] || continue
    echo >>"$out"
    head -n 1 "$dir/$model-cuda.log" >>"$out"
    paste <(losses "$dir/$model-cpu.run.metrics.jsonl") <(losses "$dir/$model-cuda.run.metrics.jsonl") |
      awk -v model="$model" -v tol=2e-3 -v late=5e-2 '
        BEGIN { printf "%-10s %5s %12s %12s %10s\n", model, "step", "cpu fp32", "cuda bf16", "rel diff" }
        { d = ($2 - $1) / $1; if (d < 0) d = -d
          if (NR <= 5) { if (d > w) w = d; if (!(d <= tol)) bad++ }
          else { if (d > wl) wl = d; if (!(d <= late)) bad++ }
          printf "%-10s %5d %12.6f %12.6f %10.2e\n", "", NR, $1, $2, d }
        END { printf "%-10s worst %.2e over steps 1-5 (tolerance %.0e), %.2e over 6-20 (%.0e): %s\n",
                     model, w, tol, wl, late, bad || NR != 20 ? "FAILED" : "ok"
              exit (bad || NR != 20) }' >>"$out" || rc=1
  done
  [ "$rc" -eq 0 ] || echo "gpu.sh: the GPU's losses do not track the CPU's; see $out" >&2
  return "$rc"
}

# gpt2-124m on one GPU as validate runs it: attention $1 (fused|unfused), recompute $2
VSTEPS=30
validate_knobs() {
  local flash=--flash-attn
  [ "$1" = fused ] || flash=--no-flash-attn
  echo "--model gpt2-124m ${ONE[*]} --mbs 4 --gbs 4 --seq 1024 --pad-vocab 128 --steps $VSTEPS \
--precision bf16 --recompute $2 $flash"
}
VCASES="fused:none fused:selective fused:full unfused:none unfused:selective unfused:full"

# One row of the predicted-against-measured table: case, the measured step (per-step timing,
# median after the warm-up), each plan's prediction and error, memory predicted (the stock
# plan's total, runtime allowance included), cudaMemGetInfo's peak and the arenas.
validate_row() {
  local name=$1 dir=$2 cal=$3 ms ps pc pm dm ar
  ms=$(median_after "$dir/$name.step.run.metrics.jsonl" "$WARMUP")
  ps=$(jnum "$dir/$name.json" step_s) pm=$(jnum "$dir/$name.json" total)
  dm=$(jnum "$dir/$name.step.run.json" device_used_peak_bytes) ar=$(jnum "$dir/$name.step.run.json" arena_bytes)
  pc=nan
  [ -z "$cal" ] || pc=$(jnum "$dir/$name.cal.json" step_s)
  awk -v r="$name" -v ms="$ms" -v ps="$ps" -v pc="$pc" -v pm="$pm" -v dm="$dm" -v ar="$ar" 'BEGIN {
    cal = pc == "nan" ? sprintf("%10s %8s", "-", "-") : sprintf("%9.4fs %+7.1f%%", pc, 100 * (ms - pc) / pc)
    printf "%-18s %9.4fs %9.4fs %+7.1f%% %s  %8.3f GiB %8.3f GiB %+7.1f%% %8.3f GiB\n", r, ms, ps,
           100 * (ms - ps) / ps, cal, pm / 2^30, dm / 2^30, 100 * (dm - pm) / pm, ar / 2^30 }'
}

step_validate() {
  local out=$RESULTS/validate.txt dir=$RESULTS/validate rc=0 cluster cal c attn rec knobs
  cluster=$(gpu_cluster)
  cal=$(calibrated_profile)
  mkdir -p "$dir"
  {
    echo "gpt2-124m on one GPU, bf16, mbs 4, seq 1024, vocabulary padded to a multiple of 128, $VSTEPS steps;"
    echo "measured: the median step after $WARMUP warm-up steps, timed per step (one wait for the GPU a step);"
    echo "predicted by the stock profile ($cluster) and by the calibrated one (${cal:-none yet: run part 2, then revalidate})"
    printf '%-18s %10s %10s %8s %10s %8s  %12s %12s %8s %12s\n' case measured stock error calibrated error \
      "memory pred" "device peak" error arenas
  } >"$out"
  for c in $VCASES; do
    attn=${c%%:*} rec=${c#*:} knobs=$(validate_knobs "$attn" "$rec")
    local name=$attn-$rec
    # shellcheck disable=SC2086
    if ! { x run_px 30 "$PX" plan $knobs --cluster "$cluster" -o "$dir/$name.json" >>"$dir/log" 2>&1 &&
           x run_px "$(lim 90)" "$PX" run "$dir/$name.json" --backend cuda --launcher none --timing step \
               -o "$dir/$name.step.run.json" >"$dir/$name.step.log" 2>&1; }; then
      echo "gpu.sh: validate: $name failed (see $dir/$name.step.log)" >&2
      rc=1
      continue
    fi
    # shellcheck disable=SC2086
    [ -z "$cal" ] || x run_px 30 "$PX" plan $knobs --cluster "$cal" -o "$dir/$name.cal.json" >>"$dir/log" 2>&1 ||
      { echo "gpu.sh: validate: planning $name on $cal failed" >&2; rc=1; }
    # every op timed, for parallax compare's per-op table (recompute none only: enough to see
    # which ops the prediction misses)
    if [ "$rec" = none ]; then
      x run_px "$(lim 90)" "$PX" run "$dir/$name.json" --backend cuda --launcher none \
          -o "$dir/$name.op.run.json" >"$dir/$name.op.log" 2>&1 ||
        { echo "gpu.sh: validate: $name timed per op failed" >&2; rc=1; }
      [ -n "$DRY" ] || { echo "== parallax compare $name (stock profile, every op timed)";
                         "$PX" compare "$dir/$name.json" "$dir/$name.op.run.json"; } >>"$dir/compare.txt" 2>&1
    fi
    [ -n "$DRY" ] || validate_row "$name" "$dir" "$cal" >>"$out"
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

# validate's measured runs against a calibrated profile made later (no GPU needed)
step_revalidate() {
  local out=$RESULTS/revalidate.txt dir=$RESULTS/validate cal=${CALIBRATED:-} c attn rec knobs n=0
  [ -n "$cal" ] || { echo "gpu.sh: revalidate needs CALIBRATED=profiles/<gpu>-measured.json" >&2; return 1; }
  [ -f "$cal" ] || [ -n "$DRY" ] || { echo "gpu.sh: revalidate: no profile $cal" >&2; return 1; }
  [ -x "$PX" ] || [ -n "$DRY" ] || { echo "gpu.sh: revalidate: no $PX (BUILD_DIR=build for a CPU build)" >&2; return 1; }
  {
    echo "validate's runs in $dir against the stock plans and $cal"
    printf '%-18s %10s %10s %8s %10s %8s  %12s %12s %8s %12s\n' case measured stock error calibrated error \
      "memory pred" "device peak" error arenas
  } >"$out"
  for c in $VCASES; do
    attn=${c%%:*} rec=${c#*:} knobs=$(validate_knobs "$attn" "$rec")
    [ -f "$dir/$attn-$rec.step.run.json" ] || [ -n "$DRY" ] || continue
    # shellcheck disable=SC2086
    x run_px 30 "$PX" plan $knobs --cluster "$cal" -o "$dir/$attn-$rec.cal.json" >>"$dir/log" 2>&1 ||
      { echo "gpu.sh: revalidate: planning $attn-$rec on $cal failed" >&2; return 1; }
    [ -n "$DRY" ] || validate_row "$attn-$rec" "$dir" "$cal" >>"$out"
    n=$((n + 1))
  done
  [ "$n" -gt 0 ] || [ -n "$DRY" ] || { echo "gpu.sh: revalidate: no validate runs in $dir" >&2; return 1; }
}

step_bench() {
  local bin=$BUILD/kernels/bench_kernels_cuda out=$RESULTS/bench.txt
  [ -x "$bin" ] || [ -n "$DRY" ] || { echo "gpu.sh: $bin was not built" >&2; return 1; }
  x run_px "$(lim 180)" "$bin" --warmup 3 >"$out" 2>&1
  local rc=$?
  [ "$rc" -eq 77 ] && echo "gpu.sh: the benchmark saw no device" >&2
  [ "$rc" -eq 0 ] || return "$rc"
  # training throughput: gpt2-124m at realistic micro-batches, one GPU, bf16
  local dir=$RESULTS/bench cluster mbs timing steps=40
  cluster=$(gpu_cluster)
  mkdir -p "$dir"
  {
    echo
    echo "== training: gpt2-124m on one GPU ($cluster profile), bf16, seq 1024, vocabulary padded to 128,"
    echo "   flash attention, $steps steps: the median step after $WARMUP warm-up steps, timed per op (the"
    echo "   executor waits for the GPU at each op's start and end) and per step (one wait a step)"
    printf '%5s %-6s %12s %10s %8s %14s %10s\n' mbs timing "step (s)" "tokens/s" MFU "predicted (s)" "pred MFU"
  } >>"$out"
  for mbs in 8 16; do
    if ! x run_px 30 "$PX" plan --model gpt2-124m --cluster "$cluster" "${ONE[@]}" --mbs "$mbs" --gbs "$mbs" \
           --seq 1024 --pad-vocab 128 --steps "$steps" --precision bf16 --recompute none \
           -o "$dir/mbs$mbs.json" >>"$dir/log" 2>&1; then
      echo "gpu.sh: bench: planning gpt2-124m at mbs $mbs failed" >&2
      rc=1
      continue
    fi
    for timing in op step; do
      if ! x run_px "$(lim 120)" "$PX" run "$dir/mbs$mbs.json" --backend cuda --launcher none --quiet \
             --timing "$timing" -o "$dir/mbs$mbs.$timing.run.json" >>"$dir/log" 2>&1; then
        echo "gpu.sh: bench: gpt2-124m at mbs $mbs ($timing timing) failed (out of memory? see $dir/log)" >&2
        rc=1
        continue
      fi
      [ -z "$DRY" ] || continue
      local ps ms mfu
      ps=$(jnum "$dir/mbs$mbs.json" step_s) mfu=$(jnum "$dir/mbs$mbs.json" mfu)
      ms=$(median_after "$dir/mbs$mbs.$timing.run.metrics.jsonl" "$WARMUP")
      # MFU = model FLOPs / (time x peak): the prediction's, scaled by its step time over ours
      awk -v b="$mbs" -v t="$timing" -v ps="$ps" -v ms="$ms" -v mfu="$mfu" 'BEGIN {
        printf "%5d %-6s %12.4f %10.0f %7.1f%% %14.4f %9.1f%%\n", b, t, ms, b * 1024 / ms, 100 * mfu * ps / ms, ps, 100 * mfu }' \
        >>"$out"
    done
  done
  return "$rc"
}

step_calibrate() {
  local out=$RESULTS/calibrate.txt name file
  name=$(gpu_slug)
  file=$ROOT/profiles/${name:-gpu}-measured.json
  # tiny is launch-bound on a GPU: its op rates would say nothing of a real model's. gpt2-124m
  # and a Llama-shaped model (Llama 3 8B's layers, four of them) instead. One rank on the one
  # GPU: GEMMs, op rates, peak and bandwidth; the collectives keep the base profile's figures
  # (calibrate's comm part measures the MPI layer, not NCCL)
  x run_px "$(lim 560)" "$PX" calibrate --backend cuda --base "$(gpu_cluster)" --ranks 1 --launcher none --log - \
      --models "${CALIB_MODELS:-gpt2-124m,$ROOT/bench/models/llama3-8b-4l.json}" -o "$file" >"$out" 2>&1 || {
    echo "gpu.sh: parallax calibrate failed; see $out" >&2
    return 1
  }
  [ -n "$DRY" ] || { cp "$file" "$RESULTS/" && echo "wrote $file (and a copy in $RESULTS)" >>"$out"; }
}

step_pytorch() {
  local out=$RESULTS/pytorch.txt dir=$RESULTS/pytorch
  if ! python3 -c 'import torch' >/dev/null 2>&1; then
    echo "python3 has no torch here: no comparison with PyTorch" | tee "$out" >&2
    return 77
  fi
  local dump=$BUILD/exec_dump
  [ -x "$dump" ] || [ -n "$DRY" ] || { echo "gpu.sh: $dump was not built" >&2; return 1; }
  mkdir -p "$dir"
  x run_px 30 "$PX" plan --model tiny --cluster local "${ONE[@]}" --seq 64 --gbs 4 --mbs 4 --precision fp32 \
      -o "$dir/tiny.json" >"$dir/log" 2>&1 &&
    x run_px 120 "$dump" "$dir/tiny.json" "$dir/tiny.dump" >>"$dir/log" 2>&1 &&
    x timeout -k 10 "$(lim 180)" python3 "$ROOT/scripts/pytorch_check.py" "$dir/tiny.dump" >"$out" 2>&1
  local rc=$?
  [ "$rc" -eq 0 ] || echo "gpu.sh: the PyTorch comparison failed; see $out" >&2
  return "$rc"
}

# compute-sanitizer's filter for parallax's kernels: their mangled names begin _Z<length><name>
# (templates too), cuBLAS's do not
kernel_filter() {
  sed -n 's/.*__global__ void \([A-Za-z0-9_]*\)(.*/\1/p' "$ROOT"/kernels/cuda/*.cu | sort -u |
    awk '{ printf "%s%d%s", (NR > 1 ? "|" : "regex=^_Z("), length($0), $0 } END { if (NR) print ")" }'
}

step_sanitize() {
  local cs bin=$BUILD/kernels/test_kernels_cuda out=$RESULTS/sanitize.log rc=0 filter
  cs=$(command -v compute-sanitizer || true)
  [ -n "$cs" ] || [ ! -x "${NVCC%/nvcc}/compute-sanitizer" ] || cs=${NVCC%/nvcc}/compute-sanitizer
  [ -n "$cs" ] || [ -n "$DRY" ] || { echo "gpu.sh: no compute-sanitizer" >&2; return 1; }
  filter=$(kernel_filter)
  [ -n "$filter" ] || { echo "gpu.sh: no __global__ kernel found in kernels/cuda" >&2; return 1; }
  : >"$out"
  # memcheck over every kernel (an out-of-bounds access through a cuBLAS call is ours too);
  # racecheck and synccheck over parallax's own, errors only: cuBLAS's kernels are not ours to
  # fix, and their hazard warnings would drown ours
  local tool args
  for tool in memcheck racecheck synccheck; do
    args=(--tool "$tool" --error-exitcode 99)
    [ "$tool" = memcheck ] || args+=(--kernel-name "$filter" --print-level error)
    echo "== compute-sanitizer ${args[*]}" >>"$out"
    PARALLAX_TEST_LARGE=0 x run_px "$(lim 240)" "${cs:-compute-sanitizer}" "${args[@]}" "$bin" >>"$out" 2>&1 || {
      echo "gpu.sh: compute-sanitizer --tool $tool failed; see $out" >&2
      rc=1
    }
  done
  return "$rc"
}

# ---- run ----

setup_deps
SUMMARY=$RESULTS/summary.txt
echo "parallax gpu.sh $(date -u +%Y-%m-%dT%H:%M:%SZ) steps: $STEPS${DRY:+ (dry run)}" >"$SUMMARY"
status=0 blocked=
for s in $STEPS; do
  if [ -n "$blocked" ]; then
    printf '%-10s skipped (%s)\n' "$s" "$blocked" | tee -a "$SUMMARY"
    continue
  fi
  if [ "$(( $(date +%s) - T_START ))" -ge $(( BUDGET - 30 )) ]; then
    printf '%-10s skipped (the time budget of %d s is spent: PARALLAX_GPU_BUDGET_S)\n' "$s" "$BUDGET" | tee -a "$SUMMARY"
    status=1
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
    printf '%-10s FAILED  %4ds (exit %d%s)\n' "$s" "$dt" "$rc" \
      "$([ "$rc" -eq 124 ] && echo ': out of time')" | tee -a "$SUMMARY"
    status=1
    case $s in preflight|configure|build) blocked="after $s failed" ;; esac
  fi
done
echo "results in $RESULTS:" "$(cd "$RESULTS" && find . -maxdepth 1 -type f -printf '%f ')"
if [ -n "$ARCHIVE" ]; then
  if tar -czf "$ARCHIVE" -C "$(dirname "$RESULTS")" "$(basename "$RESULTS")"; then
    echo "packed in $ARCHIVE ($(du -h "$ARCHIVE" | cut -f1))"
  else
    echo "gpu.sh: could not write $ARCHIVE" >&2
    status=1
  fi
fi
exit $status

#!/usr/bin/env bash
# gpu.sh — build parallax with its CUDA backend on a machine with an NVIDIA GPU, run the GPU
# tests and a short kernel benchmark, and keep what they printed.
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
#   bench      bench_kernels_cuda: GEMM TFLOP/s, copy/cast/add bandwidth, attention → bench.txt
#   sanitize   compute-sanitizer memcheck, racecheck (shared memory) and synccheck over the
#              GPU test at its small shapes                                   → sanitize.log
# summary.txt lists each step's status and seconds; the exit status is 0 only when every step
# that ran passed. A failed configure or build skips the steps after it. To add a step (a
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
# DIR along and run `PARALLAX_DEPS=DIR scripts/gpu.sh`. No MPI is needed.
#
# Environment: CUDA_ARCH (default 90), BUILD_DIR (default build-gpu), JOBS (default nproc),
# PARALLAX_DEPS (above), PARALLAX_GPU_TARGETS (space-separated build targets; default all).
# shellcheck disable=SC2317  # (file-wide) the step_* functions are called by name, "step_$s"
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
ROOT=$(pwd)

DEFAULT_STEPS="preflight configure build test bench sanitize"
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

step_bench() {
  local bin=$BUILD/kernels/bench_kernels_cuda
  [ -x "$bin" ] || { echo "gpu.sh: $bin was not built" >&2; return 1; }
  "$bin" >"$RESULTS/bench.txt" 2>&1
  local rc=$?
  [ "$rc" -eq 77 ] && echo "gpu.sh: the benchmark saw no device" >&2
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
  else
    printf '%-10s FAILED  %4ds (exit %d)\n' "$s" "$dt" "$rc" | tee -a "$SUMMARY"
    status=1
    case $s in preflight|configure|build) blocked=$s ;; esac
  fi
done
echo "results in $RESULTS:" "$(cd "$RESULTS" && find . -maxdepth 1 -type f -printf '%f ')"
exit $status

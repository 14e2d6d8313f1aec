#!/usr/bin/env bash
# The whole test suite: install what is missing, build with warnings as errors, run every test,
# then build again with AddressSanitizer + UndefinedBehaviorSanitizer and run every test there
# but those of the real clients, Slurm and the browser (they test what other programs make of
# parallax's files, which the sanitizers do not change),
# then a bounded libFuzzer run of the loaders (PARALLAX_FUZZ_SECONDS per target, default 15).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
jobs=$(nproc)
echo "== build (strict warnings, -Werror)"
cmake -S . -B build-test -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPARALLAX_WERROR=ON >/dev/null
cmake --build build-test -j "$jobs"
echo "== tests"
(cd build-test && ctest --output-on-failure -j "$jobs")
echo "== build with ASan + UBSan"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DPARALLAX_SANITIZE=ON -DPARALLAX_WERROR=ON >/dev/null
cmake --build build-asan -j "$jobs"
echo "== tests under ASan + UBSan"
supp="$PWD/tests/lsan.supp"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
   LSAN_OPTIONS="suppressions=$supp:print_suppressions=0" \
   ctest --output-on-failure -j "$jobs" -LE '^(clients|slurm|browser)$')
echo "== fuzzing the loaders (bounded smoke run)"
scripts/fuzz.sh "${PARALLAX_FUZZ_SECONDS:-15}"
echo "== all tests passed"

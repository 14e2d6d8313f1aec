#!/usr/bin/env bash
# The whole test suite, in stages, each timed (a line as it ends, a table at the end):
#   deps        install what is missing (scripts/install-deps.sh)
#   build       strict warnings (-Werror), optimised (RelWithDebInfo)
#   tests       every test, ctest -j (nproc)
#   asan-build  again with AddressSanitizer + UndefinedBehaviorSanitizer, at -O1 (AddressSanitizer's
#               documentation asks for -O1 or more for a reasonable speed)
#   asan-tests  under the sanitizers, every test that runs a line of parallax no other test runs
#               there: not the labels static (they read the sources and objects), clients, slurm
#               and browser (other programs read parallax's files there, which the sanitizers do
#               not change), nor repeat (tests/sanitize_repeat.txt: every line they run runs in
#               the pass's other tests; scripts/sanitize_set.py, docs/testing.md).
#               PARALLAX_SANITIZE_ALL=1 runs the repeat tests there too.
#   fuzz        a bounded libFuzzer run of the loaders (PARALLAX_FUZZ_SECONDS per target, 15)
# The real clients' Python environments (scripts/clients.sh, from PyPI: torch alone is a few GB)
# are installed in the background from the start, while the builds run; their tests wait for
# them. PARALLAX_TEST_STAGES lists the stages to run (default: all of them, in this order).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
stages=${PARALLAX_TEST_STAGES:-deps build tests asan-build asan-tests fuzz}
supp="$PWD/tests/lsan.supp"
report=()
t_all=$(date +%s)

# stage NAME COMMAND...: runs it, prints its time; the suite stops at the first that fails
stage() {
    local name=$1 t0 rc=0
    shift
    case " $stages " in *" $name "*) ;; *) return 0 ;; esac
    echo "== $name"
    t0=$(date +%s)
    "$@" || rc=$?
    local dt=$(($(date +%s) - t0))
    report+=("$(printf '%-12s %5d s' "$name" "$dt")")
    echo "== $name: ${dt} s$([ $rc -ne 0 ] && echo ", FAILED (status $rc)")"
    if [ $rc -ne 0 ]; then
        summary
        exit $rc
    fi
}

summary() {
    echo "== stage times"
    printf '%s\n' "${report[@]}"
    printf '%-12s %5d s\n' total $(($(date +%s) - t_all))
}

# the clients' environments, one after another (clients.sh holds a lock), in the background;
# a client that cannot be installed is the business of its test (skip or fail), not of this
prefetch_clients() {
    local req name log=build-test/clients-install.log
    mkdir -p build-test
    for req in tests/clients/*.txt; do
        name=$(basename "$req" .txt)
        [ "$name" = torch ] && continue # installed with the first client that needs it
        scripts/clients.sh "$name" >/dev/null 2>>"$log" || true
    done
}

build_strict() {
    cmake -S . -B build-test -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPARALLAX_WERROR=ON >/dev/null
    cmake --build build-test -j "$jobs"
}

tests_strict() {
    (cd build-test && ctest --output-on-failure -j "$jobs")
}

build_asan() {
    cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-O1 -g" \
          -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g" -DPARALLAX_SANITIZE=ON -DPARALLAX_WERROR=ON >/dev/null
    cmake --build build-asan -j "$jobs"
}

tests_asan() {
    local repeat="|repeat"
    [ "${PARALLAX_SANITIZE_ALL:-0}" = 1 ] && repeat=
    (cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
        UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        LSAN_OPTIONS="suppressions=$supp:print_suppressions=0" \
        ctest --output-on-failure -j "$jobs" -LE "^(static|clients|slurm|browser$repeat)\$")
}

stage deps scripts/install-deps.sh
case " $stages " in *" tests "*) prefetch_clients & ;; esac
stage build build_strict
stage tests tests_strict
stage asan-build build_asan
stage asan-tests tests_asan
stage fuzz scripts/fuzz.sh "${PARALLAX_FUZZ_SECONDS:-15}"
wait
summary
echo "== all tests passed"

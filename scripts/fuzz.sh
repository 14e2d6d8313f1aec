#!/usr/bin/env bash
# Fuzzes the loaders with libFuzzer (models, profiles, plans, token files): builds the targets
# with clang (ASan + UBSan), then runs each for SECONDS (default 20) on a scratch copy of its
# seed corpus in tests/fuzz/corpus, printing the executions and exiting non-zero on the first
# crash, leak or undefined behaviour (the reproducer is kept in build-fuzz/).
# Usage: scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-20}
command -v clang >/dev/null || { echo "fuzz.sh: clang is needed (apt-get install clang)" >&2; exit 1; }
CC=clang cmake -S . -B build-fuzz -DPARALLAX_FUZZ=ON -DPARALLAX_CUDA=OFF -DBUILD_TESTING=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
targets=(model profile plan tokens)
cmake --build build-fuzz -j "$(nproc)" --target "${targets[@]/#/fuzz_}" >/dev/null
for t in "${targets[@]}"; do
  work=$(mktemp -d)
  cp tests/fuzz/corpus/"$t"/* "$work"/
  log=build-fuzz/fuzz_$t.log
  if ! (cd build-fuzz && "./tests/fuzz/fuzz_$t" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 \
        -print_final_stats=1 "$work" >"../$log" 2>&1); then
    echo "fuzz_$t: FAILED, see $log"
    tail -n 30 "$log"
    rm -rf "$work"
    exit 1
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  echo "fuzz_$t: $execs executions in ${secs}s, 0 crashes, corpus $(ls "$work" | wc -l) inputs"
  rm -rf "$work"
done

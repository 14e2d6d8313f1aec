#!/usr/bin/env bash
# The main job on built-in defaults: install what is missing, build, plan the tiny model on this
# machine and train it for real (60 steps on the built-in text), printing predicted against
# measured memory, FLOPs and step time. Files land in ./parallax-demo.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)" >/dev/null
mkdir -p parallax-demo
build/parallax plan --model tiny --cluster local --gpus 1 --gbs 8 --mbs 4 -o parallax-demo/plan.json
build/parallax run parallax-demo/plan.json --steps 60 -o parallax-demo/run.json \
  --metrics parallax-demo/metrics.jsonl "$@"

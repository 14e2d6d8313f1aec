#!/usr/bin/env bash
# The main job on built-in defaults: install what is missing, build, and simulate GPT-3 175B on
# 1536 Selene A100s with Megatron's layout (tp 8, pp 12, gbs 2304).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)" >/dev/null
build/parallax simulate --model gpt3-175b --cluster dgx-a100 --gpus 1536 --tp 8 --pp 12 --gbs 2304 "$@"

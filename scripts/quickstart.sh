#!/usr/bin/env bash
# The main job on built-in defaults: install what is missing, build, calibrate this machine when
# it has no calibrated profile yet (profiles/local-<host>.json), then validate the tiny model on
# it: plan, run a spread of layouts for real, compare prediction and measurement, and write the
# report with its charts. Files land in ./parallax-demo; extra arguments go to validate.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)" >/dev/null
profile=${PARALLAX_PROFILE_DIR:-profiles}/local-$(hostname).json
if [ -f "$profile" ]; then
  echo "quickstart: using $profile (delete it to calibrate again)"
else
  build/parallax calibrate
fi
build/parallax validate --model tiny --report parallax-demo "$@"

#!/usr/bin/env bash
# Quick-start command (1): install what is needed, build, run the main job on its built-in default.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)"
build/sinter demo "$@"

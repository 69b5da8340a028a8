#!/usr/bin/env bash
# Quick-start command (1): install what is needed, build, train the default model (a tiny GPT on
# Debian's fortune-cookie corpus, starting over: --overwrite) and generate a sample from it. Extra
# arguments go to `train`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)"
build/sinter train --out out/tiny --overwrite "$@"
build/sinter generate --checkpoint out/tiny --prompt "The " --max-new-tokens 300 --seed 1

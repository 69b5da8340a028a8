#!/usr/bin/env bash
# Builds the safetensors libFuzzer target with clang (ASan + UBSan) and runs it.
#   scripts/fuzz.sh [RUNS]     default 1,000,000 executions, seeded from fuzz/corpus
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
runs=${1:-1000000}
CXX=clang++ CC=clang cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSINTER_FUZZ=ON \
  -DSINTER_BUILD_TESTS=OFF -DSINTER_NATIVE=OFF >/dev/null
cmake --build build-fuzz --target safetensors_fuzz
work=$(mktemp -d)
cp fuzz/corpus/* "$work/"
ASAN_OPTIONS=detect_leaks=0 build-fuzz/fuzz/safetensors_fuzz -runs="$runs" -max_len=4096 -timeout=10 "$work"

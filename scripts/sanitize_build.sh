#!/usr/bin/env bash
# The sanitizer build that scripts/sanitize.sh and scripts/fuzz.sh share: clang with AddressSanitizer
# + UBSan over the whole library (unoptimized but for its GEMMs, hashes and parsers, so it builds in
# minutes), the parsers with libFuzzer's coverage; without OpenMPI and nvcc's CUDA backend.
#   scripts/sanitize_build.sh TARGET...   builds those targets in build-sanitize
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# Line tables only (-gline-tables-only, not -g): the sanitizers' reports still name file and line,
# and the build spends less time writing debug info no one reads here.
flags="-O2 -gline-tables-only -DNDEBUG"
CXX=clang++ CC=clang cmake -S . -B build-sanitize -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSINTER_SANITIZE=ON -DSINTER_FUZZ=ON \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$flags" -DCMAKE_C_FLAGS_RELWITHDEBINFO="$flags" \
  -DSINTER_LIBRARY_O0=ON -DSINTER_NATIVE=OFF -DSINTER_MPI=OFF -DSINTER_CUDA=OFF >/dev/null
cmake --build build-sanitize -j "$(nproc)" --target "$@"

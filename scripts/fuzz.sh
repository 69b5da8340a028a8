#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) and runs each: the safetensors parser,
# config.json and train_state.json.
#   scripts/fuzz.sh [RUNS] [TARGET...]   default 1,000,000 executions per target, seeded from fuzz/corpus/
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
runs=${1:-1000000}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(safetensors config train_state)
CXX=clang++ CC=clang cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSINTER_FUZZ=ON \
  -DSINTER_BUILD_TESTS=OFF -DSINTER_NATIVE=OFF >/dev/null
cmake --build build-fuzz --target "${targets[@]/%/_fuzz}"
for t in "${targets[@]}"; do
  work=$(mktemp -d)
  cp fuzz/corpus/"$t"/* "$work/"
  echo "fuzz: $t, $runs executions"
  if ! ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 build-fuzz/fuzz/"$t"_fuzz -runs="$runs" -max_len=4096 -timeout=10 \
       -print_final_stats=1 "$work" > "$work.log" 2>&1; then
    tail -n 60 "$work.log"
    echo "fuzz: $t FAILED (the crashing input is in the crash-* file above)"
    exit 1
  fi
  grep -E "^(Done|stat::number_of_executed_units|stat::peak_rss_mb)" "$work.log"
  rm -rf "$work" "$work.log"
done

#!/usr/bin/env bash
# Builds the libFuzzer targets (scripts/sanitize_build.sh: clang, ASan + UBSan) and runs them side by side:
# the safetensors parser, config.json, train_state.json, and an exported model's manifest, program and
# weights (aot).
#   scripts/fuzz.sh [RUNS] [TARGET...]   default 1,000,000 executions per target, seeded from fuzz/corpus/
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-1000000}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(safetensors config train_state aot)
scripts/sanitize_build.sh "${targets[@]/%/_fuzz}"
# The targets run side by side, each on a copy of its seed corpus.
declare -A pid work
for t in "${targets[@]}"; do
  work[$t]=$(mktemp -d)
  cp fuzz/corpus/"$t"/* "${work[$t]}/"
  echo "fuzz: $t, $runs executions"
  ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 build-sanitize/fuzz/"$t"_fuzz -runs="$runs" -max_len=4096 -timeout=10 \
    -print_final_stats=1 "${work[$t]}" > "${work[$t]}.log" 2>&1 &
  pid[$t]=$!
done
failed=0
for t in "${targets[@]}"; do
  if ! wait "${pid[$t]}"; then
    tail -n 60 "${work[$t]}.log"
    echo "fuzz: $t FAILED (the crashing input is in the crash-* file above)"
    failed=1
    continue
  fi
  echo "fuzz: $t"
  grep -E "^(Done|stat::number_of_executed_units|stat::peak_rss_mb)" "${work[$t]}.log"
  rm -rf "${work[$t]}" "${work[$t]}.log"
done
exit $failed

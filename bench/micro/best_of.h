#pragma once
// The micro benchmarks' timer: milliseconds a call of f, best of 7 rounds of about 20 ms each
// (one warm-up call first).
#include <algorithm>
#include <chrono>

namespace sinter::micro {

template <class F> double ms_per_call(F f) {
  f();
  const auto t0 = std::chrono::steady_clock::now();
  f();
  const double once = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const int n = std::max(1, int(20.0 / std::max(once, 1e-3)));
  double best = 1e9;
  for (int r = 0; r < 7; ++r) {
    const auto t1 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) f();
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count() / n);
  }
  return best;
}

}  // namespace sinter::micro

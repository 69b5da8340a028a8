#pragma once
// Timing for benchmarks: warm up, repeat, report best and median.
#include <algorithm>
#include <chrono>
#include <vector>

namespace sinter::bench {

struct Timing {
  double best_ms, median_ms;
};

template <class F> Timing time_it(F&& f, int warmup = 3, int reps = 15, double min_total_s = 0.3) {
  for (int i = 0; i < warmup; ++i) f();
  std::vector<double> ms;
  double total = 0;
  while (int(ms.size()) < reps || (total < min_total_s && ms.size() < 2000)) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ms.push_back(s * 1e3);
    total += s;
  }
  std::sort(ms.begin(), ms.end());
  return {ms.front(), ms[ms.size() / 2]};
}

}  // namespace sinter::bench

#pragma once
// One threading helper for every CPU kernel, over OpenMP (the pool oneDNN uses too, so the two
// never fight over cores). Thread count: SINTER_NUM_THREADS, default all cores.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace sinter {

int num_threads();
void set_num_threads(int n);

// Calls f(lo, hi) on disjoint chunks covering [begin, end); runs inline when the range is
// smaller than `grain` or we are already inside a parallel region. f must not throw.
template <class F> void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  const int64_t n = end - begin;
  if (n <= 0) return;
  const int nt = int(std::min<int64_t>(num_threads(), (n + grain - 1) / std::max<int64_t>(grain, 1)));
  if (nt <= 1 || omp_in_parallel()) { f(begin, end); return; }
#pragma omp parallel num_threads(nt)
  {
    const int64_t t = omp_get_thread_num(), chunk = (n + nt - 1) / nt;
    const int64_t lo = begin + t * chunk, hi = std::min(end, lo + chunk);
    if (lo < hi) f(lo, hi);
  }
}

// For jobs of uneven cost (or cores slowed by other work): each thread calls f(next) once and
// takes jobs with next() (the next index of [begin, end), -1 when none is left) as it frees up,
// so no thread waits at the end with its share done while another has half of its own left.
template <class F> void parallel_dynamic(int64_t begin, int64_t end, const F& f) {
  std::atomic<int64_t> counter{begin};
  const auto next = [&]() -> int64_t {
    const int64_t j = counter.fetch_add(1, std::memory_order_relaxed);
    return j < end ? j : -1;
  };
  const int nt = int(std::min<int64_t>(num_threads(), end - begin));
  if (nt <= 1 || omp_in_parallel()) { f(next); return; }
#pragma omp parallel num_threads(nt)
  f(next);
}
}  // namespace sinter

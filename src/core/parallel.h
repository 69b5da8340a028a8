#pragma once
// One threading helper for every CPU kernel, over OpenMP (the pool oneDNN uses too, so the two
// never fight over cores). Thread count: SINTER_NUM_THREADS, default all cores.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "sinter/parallel.h"

namespace sinter {

// Compute entries (every parallel loop and every CPU kernel entry point counts one, per thread),
// and those made outside any op call: a computation that bypasses the op table shows up there
// (tests check it stays 0). The op table keeps the depth of nested op calls (op_call_depth).
struct KernelEntries {
  int64_t total = 0, outside_ops = 0;
};
KernelEntries& kernel_entries();
namespace detail {
int& op_depth();  // the op table's nesting depth on this thread
}
inline void count_kernel_entry() {
  KernelEntries& e = kernel_entries();
  ++e.total;
  if (detail::op_depth() == 0) ++e.outside_ops;
}

// Calls f(lo, hi) on disjoint chunks covering [begin, end); runs inline when the range is
// smaller than `grain` or we are already inside a parallel region. f must not throw.
template <class F> void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  count_kernel_entry();
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
  count_kernel_entry();
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

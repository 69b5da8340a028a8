#include "core/parallel.h"

#include <cstdlib>

namespace sinter {

static int initial_threads() {
  if (const char* s = std::getenv("SINTER_NUM_THREADS")) {
    const int n = std::atoi(s);
    if (n > 0) { omp_set_num_threads(n); return n; }
  }
  return omp_get_max_threads();
}

static int& thread_setting() {
  static int n = initial_threads();
  return n;
}

int num_threads() { return thread_setting(); }

KernelEntries& kernel_entries() {
  static thread_local KernelEntries e;
  return e;
}

int& detail::op_depth() {
  static thread_local int depth = 0;
  return depth;
}

void set_num_threads(int n) {
  if (n < 1) n = 1;
  thread_setting() = n;
  omp_set_num_threads(n);
}

}  // namespace sinter

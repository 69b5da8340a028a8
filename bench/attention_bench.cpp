// Causal attention, B=1 H=16: the flash backend against the math backend (scores per head with the
// library GEMM would be the careful-user baseline; this math backend does all heads at once).
//   build/bench/sinter_bench_attention [--quick]
#include <cstdio>
#include <cstring>
#include <sinter/sinter.h>

#include "bench_util.h"

using namespace sinter;

int main(int argc, char** argv) {
  const bool quick = argc > 1 && !std::strcmp(argv[1], "--quick");
  std::printf("%-28s %12s %12s %8s %14s %14s\n", "case", "math ms", "flash ms", "x", "math scores", "flash extra");
  for (int64_t D : {64, 128}) {
    for (int64_t S : quick ? std::vector<int64_t>{512} : std::vector<int64_t>{512, 2048}) {
      NoGradGuard g;
      Tensor q = randn({1, 16, S, D}), k = randn({1, 16, S, D}), v = randn({1, 16, S, D});
      auto tm = bench::time_it([&] { scaled_dot_product_attention(q, k, v, {}, 0.0, true, {}, false, SDPABackend::math); }, 1, 3, 0.0);
      auto tf = bench::time_it([&] { scaled_dot_product_attention(q, k, v, {}, 0.0, true, {}, false, SDPABackend::flash); }, 1, 3, 0.0);
      char name[64];
      std::snprintf(name, sizeof name, "causal D=%ld S=%ld fwd", long(D), long(S));
      // Extra memory beyond inputs/outputs: math holds (H, S, S) scores (and their softmax); flash
      // holds one (32 x 64) score tile per thread plus the row log-sum-exp.
      const double math_mb = 2.0 * 16 * double(S) * double(S) * 4 / (1 << 20);
      const double flash_kb = (2.0 * 32 * 64 * 4 + 16.0 * double(S) * 4) / 1024;
      std::printf("%-28s %12.1f %12.1f %8.2f %11.1f MiB %11.1f KiB\n", name, tm.best_ms, tf.best_ms, tm.best_ms / tf.best_ms,
                  math_mb, flash_kb);
    }
  }
  return 0;
}

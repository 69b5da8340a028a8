// bf16 causal attention forward (B = 1, 8 query heads, MHA and GQA 4:1) at the sweep's head dims
// and lengths, best of 7: the measurement behind flash_amx.cpp. `build/flash_amx`, then the same
// with SINTER_AMX=0 for the f32 kernels on widened copies; PyTorch's times are the sweep's
// (`sinter bench sweep`, docs/bench_sweep.md).
#include <sinter/sinter.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

using namespace sinter;

namespace {
template <class F> double ms_per_call(F f) {
  f();
  const auto t0 = std::chrono::steady_clock::now();
  f();
  const double once = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const int n = std::max(1, int(20.0 / std::max(once, 1e-3)));  // about 20 ms a round
  double best = 1e9;
  for (int r = 0; r < 7; ++r) {
    const auto t1 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) f();
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count() / n);
  }
  return best;
}
}  // namespace

int main() {
  NoGradGuard no_grad;
  std::printf("%-5s %-5s %-6s %10s\n", "D", "L", "heads", "ms");
  for (int64_t group : {1, 4})
    for (int64_t D : {16, 40, 64, 80, 96, 112, 128, 256})
      for (int64_t L : {37, 512, 2048}) {
        const Tensor q = randn({1, 8, L, D}).to(DType::bf16), k = randn({1, 8 / group, L, D}).to(DType::bf16),
                     v = randn({1, 8 / group, L, D}).to(DType::bf16);
        const double ms = ms_per_call([&] { (void)scaled_dot_product_attention(q, k, v, {}, 0.0, true, {}, group > 1); });
        std::printf("%-5lld %-5lld %-6s %10.4f\n", static_cast<long long>(D), static_cast<long long>(L), group > 1 ? "GQA" : "MHA", ms);
        std::fflush(stdout);
      }
}

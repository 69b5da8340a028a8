// bf16 causal attention, forward and forward + backward (B = 1, 8 query heads, MHA and GQA 4:1) at
// the sweep's head dims and lengths, best of 7: the measurement behind flash_amx*.cpp.
// `build/flash_amx`, then the same with SINTER_AMX=0 for the f32 kernels on widened copies;
// PyTorch's times are the sweep's (`sinter bench sweep`, docs/bench_sweep.md).
#include <sinter/sinter.h>

#include <cstdio>

#include "best_of.h"

using namespace sinter;
using micro::ms_per_call;

int main() {
  std::printf("%-5s %-5s %-6s %10s %10s\n", "D", "L", "heads", "fwd ms", "fwd+bwd");
  for (int64_t group : {1, 4})
    for (int64_t D : {16, 40, 64, 80, 96, 112, 128, 256})
      for (int64_t L : {37, 512, 2048}) {
        const Tensor q = randn({1, 8, L, D}).to(DType::bf16), k = randn({1, 8 / group, L, D}).to(DType::bf16),
                     v = randn({1, 8 / group, L, D}).to(DType::bf16);
        const Tensor dout = randn({1, 8, L, D}).to(DType::bf16);
        const double fwd = ms_per_call([&] {
          NoGradGuard no_grad;
          (void)scaled_dot_product_attention(q, k, v, {}, 0.0, true, {}, group > 1);
        });
        const double both = ms_per_call([&] {
          Tensor qg = q.detach().requires_grad_(), kg = k.detach().requires_grad_(), vg = v.detach().requires_grad_();
          scaled_dot_product_attention(qg, kg, vg, {}, 0.0, true, {}, group > 1).backward(dout);
        });
        std::printf("%-5lld %-5lld %-6s %10.4f %10.4f\n", static_cast<long long>(D), static_cast<long long>(L), group > 1 ? "GQA" : "MHA",
                    fwd, both);
        std::fflush(stdout);
      }
}

// bf16 2:4 layers against the dense bf16 layer (oneDNN; on a Xeon with AMX, its tile unit) at the
// M where the chooser decides between the tile unit and the vector kernels: linear(x, w_sparse)
// against linear(x, w) on the same pruned weight, alternating, best of 7. The measurement behind
// amx_bf16.cpp's threshold and docs/sparse.md's AMX rows:
// `build/sparse_amx [K N]`, then the same with SINTER_SPARSE24_AMX=0 for the vector kernels.
#include <sinter/sinter.h>

#include <cstdio>
#include <cstdlib>

#include "best_of.h"

using namespace sinter;
using micro::ms_per_call;

int main(int argc, char** argv) {
  NoGradGuard no_grad;
  const int64_t K = argc > 2 ? std::atoll(argv[1]) : 4096, N = argc > 2 ? std::atoll(argv[2]) : 4096;
  const Tensor w = prune_2_4(randn({N, K}) * 0.02).to(DType::bf16);
  const SemiStructuredSparse s = to_sparse_semi_structured(w.to(DType::f32), DType::bf16);
  std::printf("bf16 x, bf16 values, K=%lld N=%lld\n", static_cast<long long>(K), static_cast<long long>(N));
  for (int64_t M : {1, 4, 5, 8, 12, 16, 17, 32, 64, 128, 333, 512, 2048}) {
    const Tensor x = randn({M, K}).to(DType::bf16);
    const double sparse = ms_per_call([&] { (void)linear(x, s); }), dense = ms_per_call([&] { (void)linear(x, w); });
    std::printf("M=%5lld  2:4 %8.4f ms (%s)  dense %8.4f ms  dense/2:4 %.2f\n", static_cast<long long>(M), sparse,
                sparse_kernel_for(s, DType::bf16, M).c_str(), dense, dense / sparse);
  }
}

// bf16 linear from 5 rows of x on a weight of 4M values or more, on a CPU with AMX: the dense
// weight's rows through the tile code of the 2:4 AMX kernel (src/cpu/sparse24/amx_bf16.cpp, called
// by cpu/gemm.cpp), against the f32 product of the same values (products exact in f32, sums within
// f32 rounding: far inside the bf16 output's). Shapes past a block of 16 rows of x, of 32 columns
// (K not a multiple of 32), of a 32-row panel, several 2048-column slices, with and without a bias.
// Where the tile unit is absent the same cases check oneDNN's bf16 GEMM.
#include "test_util.h"

namespace sinter {
namespace {

TEST(LinearAmx, Bf16MatchesTheF32ProductAtEveryShape) {
  NoGradGuard no_grad;
  manual_seed(41);
  for (auto [N, K] : {std::pair<int64_t, int64_t>{1001, 4200}, {4097, 1030}, {64, 65600}}) {
    const Tensor w = randn({N, K}).to(DType::bf16), b = randn({N}).to(DType::bf16);
    const Tensor w32 = w.to(DType::f32), b32 = b.to(DType::f32);
    for (int64_t M : {5, 17, 33, 150}) {
      SCOPED_TRACE("N=" + std::to_string(N) + " K=" + std::to_string(K) + " M=" + std::to_string(M));
      const Tensor x = randn({M, K}).to(DType::bf16), x32 = x.to(DType::f32);
      const Tensor y = linear(x, w), yb = linear(x, w, b);
      EXPECT_EQ(y.dtype(), DType::bf16);
      // one bf16 rounding of the output apart (sums of K products of unit-scale values: |y| ~ sqrt(K))
      EXPECT_TRUE(test::all_close(y.to(DType::f32), linear(x32, w32), 8e-3, 1e-2));
      EXPECT_TRUE(test::all_close(yb.to(DType::f32), linear(x32, w32, b32), 8e-3, 1e-2));
    }
  }
}

}  // namespace
}  // namespace sinter

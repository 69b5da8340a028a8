// bf16 x with bf16 values from M = 5 on a CPU with AMX (src/cpu/sparse24/amx_bf16.cpp): expanded
// weight tiles through the tile unit, against the f64 product of the same weights. The shapes cover
// what the kernel splits by: rows of x past a block of 16 and odd blocks, columns past a block of
// 32, weight rows past a panel of 32, passes of x over several chunks, bias, activations, and meta a
// reader may hand us (columns swapped, a column named twice). Elsewhere the same cases check the
// vector kernels that serve these calls; the kernel's name says which ran.
#include "test_util.h"

namespace sinter {
namespace {

const char* kAmx = "AMX bf16 tiles, expanded";

void check(const Tensor& y, const Tensor& ref) {
  EXPECT_EQ(y.dtype(), DType::bf16);
  EXPECT_TRUE(test::all_close(y.to(DType::f64), ref, 4e-3, 1e-3));  // one bf16 rounding of the output apart
}

TEST(Sparse24Amx, MatchesTheF64ProductAtEveryShape) {
  NoGradGuard no_grad;
  manual_seed(31);
  // Each layer is past the small-layer size (256 KiB of f32), so the 2:4 kernels run it.
  for (auto [N, K] : {std::pair<int64_t, int64_t>{300, 264}, {67, 1032}, {129, 1024}, {40, 4168}}) {  // 4168: three slices of columns
    const SemiStructuredSparse s = to_sparse_semi_structured(prune_2_4(randn({N, K})), DType::bf16);
    const SemiStructuredSparse s64{s.values.to(DType::f64), s.meta, s.scales};
    for (int64_t M : {5, 16, 17, 31, 33, 64, 150, 500}) {
      SCOPED_TRACE("N=" + std::to_string(N) + " K=" + std::to_string(K) + " M=" + std::to_string(M) + " kernel: " +
                   sparse_kernel_for(s, DType::bf16, M));
      const Tensor x = randn({M, K}).to(DType::bf16), b = randn({N}).to(DType::bf16);
      const Tensor x64 = x.to(DType::f64), b64 = b.to(DType::f64);
      check(linear(x, s), linear(x64, s64));
      check(linear(x, s, b, "relu"), relu(linear(x64, s64, b64)));
      check(linear(x, s, b, "silu"), silu(linear(x64, s64, b64)));
      check(linear(x, s, b, "gelu"), gelu(linear(x64, s64, b64)));
    }
  }
}

TEST(Sparse24Amx, AddsUpMetaOutOfOrderOrNamingAColumnTwice) {
  NoGradGuard no_grad;
  manual_seed(32);
  // K = 4168: three slices of 2048 columns where a thread keeps its expansion (150 rows of x), and
  // chunks of 256 where it multiplies as it expands (8 and 40 rows): each wrong group lies in one.
  const int64_t N = 96, K = 4168, K8 = K / 8;
  SemiStructuredSparse s = to_sparse_semi_structured(prune_2_4(randn({N, K})), DType::bf16);
  uint8_t* mt = s.meta.data<uint8_t>();
  mt[0] = uint8_t((mt[0] & 0xF0) | ((mt[0] & 3) << 2) | ((mt[0] >> 2) & 3));  // row 0, group 0: the two columns swapped
  std::swap(s.values.data<bf16>()[0].bits, s.values.data<bf16>()[1].bits);
  mt[K8 + 1] = uint8_t((mt[K8 + 1] & 0x0F) | 0x50);  // row 1, group 3: column 1 twice
  mt[40 * K8 + 3] = 0xFF;                           // row 40, groups 6 and 7 and
  mt[40 * K8 + K8 - 1] = 0xFF;                      // its last two (the third slice): column 3 twice each
  mt[70 * K8 + 300] = 0x55;                         // row 70, two groups in the second slice: column 1 twice
  const SemiStructuredSparse s64{s.values.to(DType::f64), s.meta, s.scales};
  for (int64_t M : {8, 40, 150}) {
    SCOPED_TRACE("M=" + std::to_string(M) + " kernel: " + sparse_kernel_for(s, DType::bf16, M));
    const Tensor x = randn({M, K}).to(DType::bf16);
    check(linear(x, s), linear(x.to(DType::f64), s64));
  }
}

TEST(Sparse24Amx, ServesBf16FromFiveRowsWhereTheCpuHasTheTileUnit) {
  const SemiStructuredSparse s = to_sparse_semi_structured(prune_2_4(randn({512, 1024})), DType::bf16);
  const std::string at16 = sparse_kernel_for(s, DType::bf16, 16);
  if (at16 != kAmx) GTEST_SKIP() << "no AMX in this build or CPU: bf16 2:4 runs " << at16;
  EXPECT_EQ(sparse_kernel_for(s, DType::bf16, 5), kAmx);
  EXPECT_NE(sparse_kernel_for(s, DType::bf16, 4), kAmx);  // below, the vector kernels read the bytes as fast
  EXPECT_NE(sparse_kernel_for(s, DType::f32, 16), kAmx);
}

}  // namespace
}  // namespace sinter

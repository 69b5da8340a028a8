// The emulator's cuSPARSELt (src/cuda/emulator/cusparselt.cpp) on its own: the product over every
// layout and transpose against a loop in double, and what it refuses (the sizes, a group with three
// nonzeros, a compressed matrix of another shape), and its bias and ReLU epilogue, so that the CUDA
// backend's 2:4 tests on the emulator check the backend against cuSPARSELt's rules, not against a
// lenient stand-in.
#include <cusparseLt.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cuda_bf16.h"

namespace {

using Bf16 = __nv_bfloat16;

struct Lt {
  cusparseLtHandle_t h;
  Lt() { EXPECT_EQ(cusparseLtInit(&h), CUSPARSE_STATUS_SUCCESS); }
};

// An m x k matrix with two nonzeros in each group of four along k, and its values in double.
std::vector<double> two_of_four(int64_t m, int64_t k, std::mt19937& rng) {
  std::vector<double> a(size_t(m * k), 0.0);
  std::uniform_real_distribution<float> u(-1, 1);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t g = 0; g < k / 4; ++g) {
      const int first = int(rng() % 4), second = (first + 1 + int(rng() % 3)) % 4;
      for (int t : {first, second}) a[size_t(i * k + 4 * g + t)] = __bfloat162float(__float2bfloat16_rn(u(rng)));
    }
  return a;
}

// m (rows x cols, row-major doubles) stored as op(M)'s storage: transposed when op is T, in order.
std::vector<Bf16> store(const std::vector<double>& m, int64_t rows, int64_t cols, cusparseOperation_t op, cusparseOrder_t order) {
  std::vector<Bf16> out(m.size());
  const int64_t srows = op == CUSPARSE_OPERATION_TRANSPOSE ? cols : rows, scols = op == CUSPARSE_OPERATION_TRANSPOSE ? rows : cols;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t sr = op == CUSPARSE_OPERATION_TRANSPOSE ? c : r, sc = op == CUSPARSE_OPERATION_TRANSPOSE ? r : c;
      out[size_t(order == CUSPARSE_ORDER_ROW ? sr * scols + sc : sr + sc * srows)] = __float2bfloat16_rn(float(m[size_t(r * cols + c)]));
    }
  return out;
}

int64_t ld_of(int64_t rows, int64_t cols, cusparseOperation_t op, cusparseOrder_t order) {
  const int64_t srows = op == CUSPARSE_OPERATION_TRANSPOSE ? cols : rows, scols = op == CUSPARSE_OPERATION_TRANSPOSE ? rows : cols;
  return order == CUSPARSE_ORDER_ROW ? scols : srows;
}

}  // namespace

TEST(CudaEmulator, CusparseLtMatmulEqualsALoopOverEveryLayoutAndTranspose) {
  const int64_t m = 32, k = 64, n = 24;
  std::mt19937 rng(7);
  const std::vector<double> a = two_of_four(m, k, rng), b = [&] {
    std::vector<double> v(size_t(k * n));
    for (double& x : v) x = __bfloat162float(__float2bfloat16_rn(float(int(rng() % 17) - 8) / 8));
    return v;
  }();
  const auto N = CUSPARSE_OPERATION_NON_TRANSPOSE, T = CUSPARSE_OPERATION_TRANSPOSE;
  for (auto op_a : {N, T})
    for (auto op_b : {N, T})
      for (auto order : {CUSPARSE_ORDER_ROW, CUSPARSE_ORDER_COL}) {
        const auto other = order == CUSPARSE_ORDER_ROW ? CUSPARSE_ORDER_COL : CUSPARSE_ORDER_ROW;
        Lt lt;
        cusparseLtMatDescriptor_t da, db, dc;
        const std::vector<Bf16> sa = store(a, m, k, op_a, order), sb = store(b, k, n, op_b, other);
        const int64_t ar = op_a == N ? m : k, ac = op_a == N ? k : m, br = op_b == N ? k : n, bc = op_b == N ? n : k;
        ASSERT_EQ(cusparseLtStructuredDescriptorInit(&lt.h, &da, ar, ac, ld_of(m, k, op_a, order), 16, CUDA_R_16BF, order,
                                                     CUSPARSELT_SPARSITY_50_PERCENT), CUSPARSE_STATUS_SUCCESS);
        ASSERT_EQ(cusparseLtDenseDescriptorInit(&lt.h, &db, br, bc, ld_of(k, n, op_b, other), 16, CUDA_R_16BF, other),
                  CUSPARSE_STATUS_SUCCESS);
        ASSERT_EQ(cusparseLtDenseDescriptorInit(&lt.h, &dc, m, n, order == CUSPARSE_ORDER_ROW ? n : m, 16, CUDA_R_16BF, order),
                  CUSPARSE_STATUS_SUCCESS);
        cusparseLtMatmulDescriptor_t mm;
        cusparseLtMatmulAlgSelection_t alg;
        cusparseLtMatmulPlan_t plan;
        ASSERT_EQ(cusparseLtMatmulDescriptorInit(&lt.h, &mm, op_a, op_b, &da, &db, &dc, &dc, CUSPARSE_COMPUTE_32F),
                  CUSPARSE_STATUS_SUCCESS);
        ASSERT_EQ(cusparseLtMatmulAlgSelectionInit(&lt.h, &alg, &mm, CUSPARSELT_MATMUL_ALG_DEFAULT), CUSPARSE_STATUS_SUCCESS);
        ASSERT_EQ(cusparseLtMatmulPlanInit(&lt.h, &plan, &mm, &alg), CUSPARSE_STATUS_SUCCESS);
        size_t bytes = 0, scratch = 0, workspace = 0;
        ASSERT_EQ(cusparseLtSpMMACompressedSize2(&lt.h, &da, &bytes, &scratch), CUSPARSE_STATUS_SUCCESS);
        std::vector<uint64_t> compressed(bytes / 8 + 1), buffer(scratch / 8 + 1);
        ASSERT_EQ(cusparseLtSpMMACompress2(&lt.h, &da, 1, op_a, sa.data(), compressed.data(), buffer.data(), nullptr),
                  CUSPARSE_STATUS_SUCCESS);
        ASSERT_EQ(cusparseLtMatmulGetWorkspace(&lt.h, &plan, &workspace), CUSPARSE_STATUS_SUCCESS);
        std::vector<uint64_t> ws(workspace / 8 + 1);
        std::vector<Bf16> d(size_t(m * n), __float2bfloat16_rn(NAN));  // beta = 0: C is not read
        const float alpha = 2, beta = 0;
        ASSERT_EQ(cusparseLtMatmul(&lt.h, &plan, &alpha, compressed.data(), sb.data(), &beta, d.data(), d.data(), ws.data(), nullptr, 0),
                  CUSPARSE_STATUS_SUCCESS);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            double want = 0;
            for (int64_t q = 0; q < k; ++q) want += 2 * a[size_t(i * k + q)] * b[size_t(q * n + j)];
            const double got = __bfloat162float(d[size_t(order == CUSPARSE_ORDER_ROW ? i * n + j : i + j * m)]);
            ASSERT_NEAR(got, want, std::abs(want) * 0x1p-8 + 1e-6) << "op_a " << op_a << " op_b " << op_b << " order " << order;
          }
        for (auto* desc : {&da, &db, &dc}) EXPECT_EQ(cusparseLtMatDescriptorDestroy(desc), CUSPARSE_STATUS_SUCCESS);
        EXPECT_EQ(cusparseLtMatmulPlanDestroy(&plan), CUSPARSE_STATUS_SUCCESS);
        EXPECT_EQ(cusparseLtMatmulPlanDestroy(&plan), CUSPARSE_STATUS_INVALID_VALUE);  // twice
      }
}

TEST(CudaEmulator, CusparseLtRefusesWhatTheLibraryRefuses) {
  Lt lt;
  cusparseLtMatDescriptor_t d;
  auto refused = [](cusparseStatus_t s, const std::string& why) {
    EXPECT_NE(s, CUSPARSE_STATUS_SUCCESS);
    const std::string text = cusparseLtGetErrorString(s);
    EXPECT_NE(text.find(why), std::string::npos) << text;
  };
  refused(cusparseLtDenseDescriptorInit(&lt.h, &d, 64, 1, 64, 16, CUDA_R_16BF, CUSPARSE_ORDER_COL), "multiples of 8");
  refused(cusparseLtDenseDescriptorInit(&lt.h, &d, 64, 16, 8, 16, CUDA_R_16BF, CUSPARSE_ORDER_COL), "leading dimension");
  refused(cusparseLtDenseDescriptorInit(&lt.h, &d, 64, 16, 64, 16, CUDA_R_32F, CUSPARSE_ORDER_COL), "bf16");
  refused(cusparseLtStructuredDescriptorInit(&lt.h, &d, 24, 32, 32, 16, CUDA_R_16BF, CUSPARSE_ORDER_ROW, CUSPARSELT_SPARSITY_50_PERCENT),
          "multiples of 16");
  cusparseLtHandle_t none{};
  refused(cusparseLtDenseDescriptorInit(&none, &d, 64, 16, 64, 16, CUDA_R_16BF, CUSPARSE_ORDER_COL), "cusparseLtInit");

  // A row holding three nonzeros in one group of four is not 2:4: compressing it fails naming it.
  ASSERT_EQ(cusparseLtStructuredDescriptorInit(&lt.h, &d, 16, 16, 16, 16, CUDA_R_16BF, CUSPARSE_ORDER_ROW, CUSPARSELT_SPARSITY_50_PERCENT),
            CUSPARSE_STATUS_SUCCESS);
  std::vector<Bf16> dense(256, __float2bfloat16_rn(0));
  for (int t = 0; t < 3; ++t) dense[size_t(5 * 16 + 8 + t)] = __float2bfloat16_rn(1);
  size_t bytes = 0, scratch = 0;
  ASSERT_EQ(cusparseLtSpMMACompressedSize2(&lt.h, &d, &bytes, &scratch), CUSPARSE_STATUS_SUCCESS);
  std::vector<uint64_t> compressed(bytes / 8 + 1), buffer(scratch / 8 + 1);
  const auto compress = [&] {
    const auto op = CUSPARSE_OPERATION_NON_TRANSPOSE;
    return cusparseLtSpMMACompress2(&lt.h, &d, 1, op, dense.data(), compressed.data(), buffer.data(), nullptr);
  };
  refused(compress(), "row 5 of op(A) holds more than two nonzeros in columns 8..11");

  // Shapes that do not chain; a search leaves the plan needing a larger workspace; A must be a
  // matrix compressed for the plan (the dense weight itself is refused).
  dense[size_t(5 * 16 + 10)] = __float2bfloat16_rn(0);
  ASSERT_EQ(compress(), CUSPARSE_STATUS_SUCCESS);
  cusparseLtMatDescriptor_t b, c;
  cusparseLtMatmulDescriptor_t mm;
  ASSERT_EQ(cusparseLtDenseDescriptorInit(&lt.h, &b, 32, 16, 32, 16, CUDA_R_16BF, CUSPARSE_ORDER_COL), CUSPARSE_STATUS_SUCCESS);
  ASSERT_EQ(cusparseLtDenseDescriptorInit(&lt.h, &c, 16, 16, 16, 16, CUDA_R_16BF, CUSPARSE_ORDER_COL), CUSPARSE_STATUS_SUCCESS);
  refused(cusparseLtMatmulDescriptorInit(&lt.h, &mm, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_NON_TRANSPOSE, &d, &b, &c, &c,
                                         CUSPARSE_COMPUTE_32F),
          "do not chain");
  ASSERT_EQ(cusparseLtDenseDescriptorInit(&lt.h, &b, 16, 16, 16, 16, CUDA_R_16BF, CUSPARSE_ORDER_COL), CUSPARSE_STATUS_SUCCESS);
  ASSERT_EQ(cusparseLtMatmulDescriptorInit(&lt.h, &mm, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_NON_TRANSPOSE, &d, &b, &c, &c,
                                           CUSPARSE_COMPUTE_32F),
            CUSPARSE_STATUS_SUCCESS);
  cusparseLtMatmulAlgSelection_t alg;
  cusparseLtMatmulPlan_t plan;
  ASSERT_EQ(cusparseLtMatmulAlgSelectionInit(&lt.h, &alg, &mm, CUSPARSELT_MATMUL_ALG_DEFAULT), CUSPARSE_STATUS_SUCCESS);
  ASSERT_EQ(cusparseLtMatmulPlanInit(&lt.h, &plan, &mm, &alg), CUSPARSE_STATUS_SUCCESS);
  size_t before = 0, after = 0;
  ASSERT_EQ(cusparseLtMatmulGetWorkspace(&lt.h, &plan, &before), CUSPARSE_STATUS_SUCCESS);
  std::vector<uint64_t> ws(before / 8 + 1);
  std::vector<Bf16> x(16 * 16, __float2bfloat16_rn(1)), y(16 * 16);
  const float alpha = 1, beta = 0;
  refused(cusparseLtMatmul(&lt.h, &plan, &alpha, dense.data(), x.data(), &beta, y.data(), y.data(), ws.data(), nullptr, 0),
          "not a matrix compressed for this plan");
  ASSERT_EQ(cusparseLtMatmulSearch(&lt.h, &plan, &alpha, compressed.data(), x.data(), &beta, y.data(), y.data(), ws.data(), nullptr, 0),
            CUSPARSE_STATUS_SUCCESS);
  ASSERT_EQ(cusparseLtMatmulGetWorkspace(&lt.h, &plan, &after), CUSPARSE_STATUS_SUCCESS);
  EXPECT_GT(after, before);
  EXPECT_EQ(__bfloat162float(y[5]), 2.0f);  // row 5: the two ones left in columns 8..11
  // The search wrote its choice into the algorithm selection: a plan made from a selection given
  // that choice needs the searched plan's workspace; an algorithm beyond the shape's last (D 8
  // columns wide: algorithm 0 only) is refused.
  int id = -1;
  ASSERT_EQ(cusparseLtMatmulAlgGetAttribute(&lt.h, &alg, CUSPARSELT_MATMUL_ALG_CONFIG_ID, &id, sizeof id), CUSPARSE_STATUS_SUCCESS);
  cusparseLtMatmulAlgSelection_t alg2;
  cusparseLtMatmulPlan_t plan2;
  ASSERT_EQ(cusparseLtMatmulAlgSelectionInit(&lt.h, &alg2, &mm, CUSPARSELT_MATMUL_ALG_DEFAULT), CUSPARSE_STATUS_SUCCESS);
  ASSERT_EQ(cusparseLtMatmulAlgSetAttribute(&lt.h, &alg2, CUSPARSELT_MATMUL_ALG_CONFIG_ID, &id, sizeof id), CUSPARSE_STATUS_SUCCESS);
  ASSERT_EQ(cusparseLtMatmulPlanInit(&lt.h, &plan2, &mm, &alg2), CUSPARSE_STATUS_SUCCESS);
  size_t reused = 0;
  ASSERT_EQ(cusparseLtMatmulGetWorkspace(&lt.h, &plan2, &reused), CUSPARSE_STATUS_SUCCESS);
  EXPECT_EQ(reused, after);
  cusparseLtMatmulDescriptor_t narrow;
  cusparseLtMatDescriptor_t b8, c8;
  ASSERT_EQ(cusparseLtDenseDescriptorInit(&lt.h, &b8, 16, 8, 16, 16, CUDA_R_16BF, CUSPARSE_ORDER_COL), CUSPARSE_STATUS_SUCCESS);
  ASSERT_EQ(cusparseLtDenseDescriptorInit(&lt.h, &c8, 16, 8, 16, 16, CUDA_R_16BF, CUSPARSE_ORDER_COL), CUSPARSE_STATUS_SUCCESS);
  ASSERT_EQ(cusparseLtMatmulDescriptorInit(&lt.h, &narrow, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_NON_TRANSPOSE, &d, &b8,
                                           &c8, &c8, CUSPARSE_COMPUTE_32F),
            CUSPARSE_STATUS_SUCCESS);
  cusparseLtMatmulAlgSelection_t alg8;
  ASSERT_EQ(cusparseLtMatmulAlgSelectionInit(&lt.h, &alg8, &narrow, CUSPARSELT_MATMUL_ALG_DEFAULT), CUSPARSE_STATUS_SUCCESS);
  refused(cusparseLtMatmulAlgSetAttribute(&lt.h, &alg8, CUSPARSELT_MATMUL_ALG_CONFIG_ID, &id, sizeof id), "algorithm attribute 0 = 1");
}

// The epilogue: D = ReLU(A B + bias) with the bias over D's rows, read through the plan's matmul
// descriptor at each product (a new pointer set after the plan is made serves the next product);
// switching the bias or the ReLU on after the plan is made is refused.
TEST(CudaEmulator, CusparseLtAddsTheBiasOfTheDescriptorAndAppliesTheRelu) {
  const int64_t m = 16, k = 32, n = 8;
  std::mt19937 rng(11);
  const std::vector<double> a = two_of_four(m, k, rng);
  const auto N = CUSPARSE_OPERATION_NON_TRANSPOSE;
  const auto order = CUSPARSE_ORDER_ROW;
  const std::vector<Bf16> sa = store(a, m, k, N, order), x(size_t(k * n), __float2bfloat16_rn(0.5f));
  Lt lt;
  cusparseLtMatDescriptor_t da, db, dc;
  ASSERT_EQ(cusparseLtStructuredDescriptorInit(&lt.h, &da, m, k, k, 16, CUDA_R_16BF, order, CUSPARSELT_SPARSITY_50_PERCENT),
            CUSPARSE_STATUS_SUCCESS);
  ASSERT_EQ(cusparseLtDenseDescriptorInit(&lt.h, &db, k, n, n, 16, CUDA_R_16BF, order), CUSPARSE_STATUS_SUCCESS);
  ASSERT_EQ(cusparseLtDenseDescriptorInit(&lt.h, &dc, m, n, n, 16, CUDA_R_16BF, order), CUSPARSE_STATUS_SUCCESS);
  cusparseLtMatmulDescriptor_t mm;
  ASSERT_EQ(cusparseLtMatmulDescriptorInit(&lt.h, &mm, N, N, &da, &db, &dc, &dc, CUSPARSE_COMPUTE_32F), CUSPARSE_STATUS_SUCCESS);
  alignas(16) Bf16 bias1[m], bias2[m];
  for (int64_t i = 0; i < m; ++i) bias1[i] = __float2bfloat16_rn(float(i % 5) - 2), bias2[i] = __float2bfloat16_rn(float(i % 3));
  const void* p1 = bias1;
  const int on = 1;
  ASSERT_EQ(cusparseLtMatmulDescSetAttribute(&lt.h, &mm, CUSPARSELT_MATMUL_ACTIVATION_RELU, &on, sizeof on), CUSPARSE_STATUS_SUCCESS);
  ASSERT_EQ(cusparseLtMatmulDescSetAttribute(&lt.h, &mm, CUSPARSELT_MATMUL_BIAS_POINTER, &p1, sizeof p1), CUSPARSE_STATUS_SUCCESS);
  cusparseLtMatmulAlgSelection_t alg;
  cusparseLtMatmulPlan_t plan;
  ASSERT_EQ(cusparseLtMatmulAlgSelectionInit(&lt.h, &alg, &mm, CUSPARSELT_MATMUL_ALG_DEFAULT), CUSPARSE_STATUS_SUCCESS);
  ASSERT_EQ(cusparseLtMatmulPlanInit(&lt.h, &plan, &mm, &alg), CUSPARSE_STATUS_SUCCESS);
  size_t bytes = 0, scratch = 0, workspace = 0;
  ASSERT_EQ(cusparseLtSpMMACompressedSize2(&lt.h, &da, &bytes, &scratch), CUSPARSE_STATUS_SUCCESS);
  std::vector<uint64_t> compressed(bytes / 8 + 1), buffer(scratch / 8 + 1);
  ASSERT_EQ(cusparseLtSpMMACompress2(&lt.h, &da, 1, N, sa.data(), compressed.data(), buffer.data(), nullptr), CUSPARSE_STATUS_SUCCESS);
  ASSERT_EQ(cusparseLtMatmulGetWorkspace(&lt.h, &plan, &workspace), CUSPARSE_STATUS_SUCCESS);
  std::vector<uint64_t> ws(workspace / 8 + 1);
  const float alpha = 1, beta = 0;
  for (const Bf16* bias : {bias1, bias2}) {
    const void* p = bias;
    ASSERT_EQ(cusparseLtMatmulDescSetAttribute(&lt.h, &mm, CUSPARSELT_MATMUL_BIAS_POINTER, &p, sizeof p), CUSPARSE_STATUS_SUCCESS);
    std::vector<Bf16> d(size_t(m * n));
    ASSERT_EQ(cusparseLtMatmul(&lt.h, &plan, &alpha, compressed.data(), x.data(), &beta, d.data(), d.data(), ws.data(), nullptr, 0),
              CUSPARSE_STATUS_SUCCESS);
    for (int64_t i = 0; i < m; ++i) {
      double want = __bfloat162float(bias[i]);
      for (int64_t q = 0; q < k; ++q) want += 0.5 * a[size_t(i * k + q)];
      want = std::max(want, 0.0);
      for (int64_t j = 0; j < n; ++j) ASSERT_NEAR(__bfloat162float(d[size_t(i * n + j)]), want, std::abs(want) * 0x1p-8 + 1e-6) << i;
    }
  }
  const int off = 0;
  ASSERT_EQ(cusparseLtMatmulDescSetAttribute(&lt.h, &mm, CUSPARSELT_MATMUL_ACTIVATION_RELU, &off, sizeof off), CUSPARSE_STATUS_SUCCESS);
  std::vector<Bf16> d(size_t(m * n));
  const cusparseStatus_t s =
      cusparseLtMatmul(&lt.h, &plan, &alpha, compressed.data(), x.data(), &beta, d.data(), d.data(), ws.data(), nullptr, 0);
  EXPECT_NE(s, CUSPARSE_STATUS_SUCCESS);
  EXPECT_NE(std::string(cusparseLtGetErrorString(s)).find("switched on or off after the plan was made"), std::string::npos);
}

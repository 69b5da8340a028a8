#include <bit>
#include <cmath>
#include <sstream>

#include "core/parallel.h"
#include "cpu/simd/bf16.h"
#include "cpu/simd/normal.h"
#include "ops/scalar_fns.h"
#include "test_util.h"

using namespace sinter;
using sinter::test::all_close;
using sinter::test::throws_naming;
namespace simd = sinter::cpu::simd;
namespace fn = sinter::fn;

TEST(DType, HalfConversionsRoundToNearestEven) {
  // bf16: 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(float(bf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(float(bf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
  EXPECT_EQ(float(f16(1.0f + 1.0f / 2048)), 1.0f);
  EXPECT_EQ(float(f16(1.0f + 3.0f / 2048)), 1.0f + 4.0f / 2048);
  EXPECT_EQ(float(f16(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(float(f16(65520.0f))));
  EXPECT_EQ(float(f16(5.9604644775390625e-8f)), 5.9604644775390625e-8f);  // smallest subnormal
  EXPECT_TRUE(std::isnan(float(f16(NAN))));
  EXPECT_TRUE(std::isnan(float(bf16(NAN))));
  // Every f16 value survives a round trip through float.
  for (uint32_t b = 0; b < 0x10000; ++b) {
    f16 h;
    h.bits = uint16_t(b);
    const float f = float(h);
    if (std::isnan(f)) continue;
    EXPECT_EQ(f16(f).bits, h.bits) << b;
  }
}

TEST(DType, PromotionFollowsNumPy) {
  EXPECT_EQ(promote_types(DType::i32, DType::f32), DType::f32);
  EXPECT_EQ(promote_types(DType::boolean, DType::i8), DType::i8);
  EXPECT_EQ(promote_types(DType::bf16, DType::f16), DType::f32);
  EXPECT_EQ(promote_types(DType::f32, DType::f64), DType::f64);
  EXPECT_EQ(promote_types(DType::i64, DType::u8), DType::i64);
}

TEST(Shape, ActsLikeAVectorInlineAndOnTheHeap) {
  // Every edit is mirrored on a std::vector (the reference), across the inline/heap boundary.
  Shape s;
  std::vector<int64_t> ref;
  auto same = [&] { return s.size() == ref.size() && std::equal(s.begin(), s.end(), ref.begin()) && std::vector<int64_t>(s) == ref; };
  for (int64_t i = 0; i < 20; ++i) {
    s.push_back(i * 3 - 7);
    ref.push_back(i * 3 - 7);
    ASSERT_TRUE(same()) << "after push_back " << i;
  }
  EXPECT_GT(s.capacity(), Shape::kInline);
  s.insert(s.begin() + 2, 100);
  ref.insert(ref.begin() + 2, 100);
  s.erase(s.begin() + 5, s.begin() + 9);
  ref.erase(ref.begin() + 5, ref.begin() + 9);
  s.erase(s.begin());
  ref.erase(ref.begin());
  const int64_t more[] = {8, 9};
  s.insert(s.end(), std::begin(more), std::end(more));
  ref.insert(ref.end(), std::begin(more), std::end(more));
  EXPECT_TRUE(same());
  s.resize(4);
  ref.resize(4);
  s.resize(7, -1);
  ref.resize(7, -1);
  EXPECT_TRUE(same());

  // Copies and moves keep the elements and leave the source usable, heap or inline.
  for (size_t n : {size_t(3), size_t(6), size_t(7), size_t(13)}) {
    Shape a(n, 5);
    a.back() = 42;
    Shape b = a, c;
    c = b;
    EXPECT_EQ(c, a);
    Shape d = std::move(b);
    EXPECT_EQ(d, a);
    EXPECT_TRUE(b.empty());
    b.push_back(1);
    EXPECT_EQ(b, Shape{1});
    c = std::move(d);
    EXPECT_EQ(c.size(), n);
    EXPECT_EQ(c.back(), 42);
    const auto& same = c;
    c = same;  // self-assignment
    EXPECT_EQ(c.size(), n);
  }

  // Conversions and comparisons.
  const std::vector<int64_t> v{2, 3, 4};
  const Shape fromv = v;
  const std::vector<int64_t> back = fromv;
  EXPECT_EQ(back, v);
  EXPECT_EQ(fromv, (Shape{2, 3, 4}));
  EXPECT_NE(fromv, (Shape{2, 3}));
  EXPECT_LT((Shape{2, 3}), fromv);
  EXPECT_EQ(fromv.numel(), 24);
  EXPECT_EQ(Shape{}.numel(), 1);
  EXPECT_THROW(fromv.at(3), IndexError);
}

TEST(Shape, TensorsOfManyDimsWork) {
  // Nine dims: the shape and strides live on the heap; views, reductions and copies agree with
  // the same data seen as one flat vector.
  Tensor x = arange(0, 512, 1, DType::f32).reshape({2, 2, 2, 2, 2, 2, 2, 2, 2});
  EXPECT_EQ(x.dim(), 9);
  EXPECT_EQ(sum(x).item<float>(), 511.0f * 512 / 2);
  EXPECT_TRUE(all_close(sum(x, {0, 4, 8}).flatten(), sum(x.reshape({2, 2, 2, 2, 2, 2, 2, 2, 2}).permute({0, 4, 8, 1, 2, 3, 5, 6, 7}).reshape({8, 64}), {0})));
  Tensor p = x.permute({8, 7, 6, 5, 4, 3, 2, 1, 0}).contiguous();
  // Reversing all dims of a 2^9 cube reverses the bits of each flat index.
  std::vector<float> pv = p.to_vector<float>();
  for (int i = 0; i < 512; ++i) {
    int r = 0;
    for (int b = 0; b < 9; ++b) r |= ((i >> b) & 1) << (8 - b);
    ASSERT_EQ(pv[size_t(i)], float(r)) << i;
  }
  EXPECT_EQ(x.unsqueeze(3).dim(), 10);
  EXPECT_EQ(x.unsqueeze(3).squeeze(3).shape(), x.shape());
}

TEST(Tensor, FactoriesMakeWhatTheySay) {
  EXPECT_EQ(zeros({2, 3}).to_vector<float>(), std::vector<float>(6, 0.0f));
  EXPECT_EQ(full({2}, 7, DType::i32).to_vector<int32_t>(), (std::vector<int32_t>{7, 7}));
  EXPECT_EQ(arange(5).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(arange(1, 2, 0.25, DType::f32).to_vector<float>(), (std::vector<float>{1, 1.25, 1.5, 1.75}));
  EXPECT_EQ(linspace(0, 1, 5).to_vector<float>(), (std::vector<float>{0, 0.25, 0.5, 0.75, 1}));
  EXPECT_EQ(eye(2, 3).to_vector<float>(), (std::vector<float>{1, 0, 0, 0, 1, 0}));
  EXPECT_TRUE(throws_naming("arange", [] { arange(0, 1, 0); }));
  EXPECT_TRUE(throws_naming("full", [] { zeros({-1}); }));
}

TEST(Tensor, RandomValuesDoNotDependOnThreadCount) {
  const int saved = num_threads();
  set_num_threads(1);
  manual_seed(42);
  auto a = randn({1001}).to_vector<float>();
  auto u = rand({77}).to_vector<float>();
  auto i = randint(-5, 5, {33}).to_vector<int64_t>();
  set_num_threads(std::max(2, saved));
  manual_seed(42);
  EXPECT_EQ(randn({1001}).to_vector<float>(), a);
  EXPECT_EQ(rand({77}).to_vector<float>(), u);
  EXPECT_EQ(randint(-5, 5, {33}).to_vector<int64_t>(), i);
  set_num_threads(saved);
}

TEST(Tensor, RandomDistributionsHaveTheRightMoments) {
  manual_seed(1);
  Tensor n = randn({200000}, DType::f64);
  EXPECT_NEAR(mean(n).item<double>(), 0.0, 0.01);
  EXPECT_NEAR(stddev(n).item<double>(), 1.0, 0.01);
  Tensor u = rand({200000}, DType::f64);
  EXPECT_NEAR(mean(u).item<double>(), 0.5, 0.01);
  EXPECT_GE(min(u).item<double>(), 0.0);
  EXPECT_LT(max(u).item<double>(), 1.0);
  Tensor r = randint(3, 7, {10000});
  EXPECT_EQ(min(r).item<int64_t>(), 3);
  EXPECT_EQ(max(r).item<int64_t>(), 6);
}

TEST(Tensor, ViewsShareStorage) {
  Tensor x = arange(0, 24, 1, DType::f32).reshape({2, 3, 4});
  Tensor t = x.transpose(0, 2);
  EXPECT_EQ(t.shape(), Shape({4, 3, 2}));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.storage(), x.storage());
  EXPECT_EQ(x.select(1, 2).to_vector<float>(), (std::vector<float>{8, 9, 10, 11, 20, 21, 22, 23}));
  EXPECT_EQ(x.slice(2, 1, 4, 2).select(0, 0).to_vector<float>(), (std::vector<float>{1, 3, 5, 7, 9, 11}));
  EXPECT_EQ(x.narrow(2, -2, 2).shape(), Shape({2, 3, 2}));
  EXPECT_EQ(x.unsqueeze(1).shape(), Shape({2, 1, 3, 4}));
  EXPECT_EQ(x.unsqueeze(-1).shape(), Shape({2, 3, 4, 1}));
  EXPECT_EQ(x.unsqueeze(1).squeeze().shape(), Shape({2, 3, 4}));
  EXPECT_EQ(x.flatten(1).shape(), Shape({2, 12}));
  EXPECT_EQ(x.reshape({-1, 4}).shape(), Shape({6, 4}));
  Tensor e = arange(0, 3, 1, DType::f32).reshape({3, 1}).expand({3, 4});
  EXPECT_EQ(e.stride(1), 0);
  EXPECT_EQ(e.contiguous().to_vector<float>(), (std::vector<float>{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2}));
  // A transposed tensor cannot be viewed flat; reshape copies.
  EXPECT_TRUE(throws_naming("view", [&] { t.view({24}); }));
  EXPECT_EQ(t.reshape({24}).to_vector<float>()[1], 12.0f);
  Tensor v = x.view({6, 4});
  {
    NoGradGuard g;
    v.fill_(1.0);
  }
  EXPECT_EQ(x.to_vector<float>(), std::vector<float>(24, 1.0f));
}

TEST(Tensor, InPlaceOpsBumpTheVersion) {
  Tensor x = zeros({3});
  const uint64_t v0 = x.version();
  x.add_(ones({3}));
  x.mul_(3.0);
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{3, 3, 3}));
  EXPECT_EQ(x.version(), v0 + 2);
  x.copy_(arange(3).to(DType::f32));
  x.sub_(ones({1}));
  x.div_(full({3}, 2.0));
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{-0.5, 0, 0.5}));
  x.zero_();
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{0, 0, 0}));
  EXPECT_TRUE(throws_naming("add_", [&] { x.add_(ones({4})); }));
  Tensor i = zeros({2}, DType::i32);
  EXPECT_TRUE(throws_naming("add_", [&] { i.add_(ones({2})); }));
}

TEST(Tensor, ConvertsDTypes) {
  Tensor x = tensor<float>({1.5f, -2.25f, 3.0f, 1e10f}).narrow(0, 0, 3);
  EXPECT_EQ(x.to(DType::i32).to_vector<int32_t>()[1], -2);
  EXPECT_EQ(x.to(DType::bf16).to(DType::f32).to_vector<float>()[0], 1.5f);
  EXPECT_EQ(x.to(DType::boolean).to_vector<bool>(), (std::vector<bool>{true, true, true}));
  EXPECT_EQ(x.to(DType::f64).select(0, 0).item_double(), 1.5);
  EXPECT_EQ(tensor<float>({1e10f}).to(DType::bf16).item<float>(), float(bf16(1e10f)));
}

TEST(Tensor, PrintsReadably) {
  std::ostringstream os;
  os << tensor<float>({1.5f, 2.0f, -3.25f}, {3});
  EXPECT_EQ(os.str(), "tensor([1.5000, 2.0000, -3.2500], shape=(3), dtype=f32)");
  std::ostringstream big;
  big << zeros({100, 100});
  EXPECT_NE(big.str().find("..."), std::string::npos);
  EXPECT_LT(big.str().size(), 1000u);
  std::ostringstream b;
  b << tensor<bool>({true, false});
  EXPECT_EQ(b.str(), "tensor([true, false], shape=(2), dtype=bool)");
  std::ostringstream s;
  s << Tensor::symbolic({2, 3});
  EXPECT_EQ(s.str(), "tensor(symbolic, shape=(2, 3), dtype=f32)");
}

TEST(Tensor, FromBlobWrapsWithoutCopying) {
  std::vector<float> data{1, 2, 3, 4};
  bool freed = false;
  {
    Tensor t = from_blob(data.data(), {2, 2}, DType::f32, [&](void*) { freed = true; });
    EXPECT_EQ(t.data<float>(), data.data());
    EXPECT_EQ(t.t().contiguous().to_vector<float>(), (std::vector<float>{1, 3, 2, 4}));
  }
  EXPECT_TRUE(freed);
  EXPECT_TRUE(throws_naming("data", [] { zeros({2}).data<int32_t>(); }));
  EXPECT_TRUE(throws_naming("item", [] { zeros({2}).item<float>(); }));
}

TEST(Tensor, SymbolicTensorsHaveNoData) {
  Tensor s = Tensor::symbolic({4, 5}, DType::bf16);
  EXPECT_TRUE(s.is_symbolic());
  EXPECT_TRUE(throws_naming("data", [&] { s.data_ptr(); }));
  Tensor y = matmul(s, Tensor::symbolic({5, 2}, DType::bf16));
  EXPECT_TRUE(y.is_symbolic());
  EXPECT_EQ(y.shape(), Shape({4, 2}));
}

// The norms sum four rows at once (cpu/nn.cpp, simd::lane_sums), each in its own lane order: a
// row's result does not depend on its neighbours.
TEST(Kernels, ANormRowHasTheSameBitsAloneAndAmongOtherRows) {
  manual_seed(11);
  for (DType dt : {DType::f32, DType::bf16, DType::f64})
    for (int64_t D : {5, 37, 1000}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " D=" + std::to_string(D));
      const Tensor x = (randn({9, D}) * 3.0 + 1.0).to(dt), w = randn({D}).to(dt), b = randn({D}).to(dt);
      const Tensor ln = layer_norm(x, w, b), rms = rms_norm(x, w);
      for (int64_t r = 0; r < 9; ++r) {
        const Tensor row = x.slice(0, r, r + 1, 1);
        EXPECT_TRUE(test::bitwise_equal(ln.slice(0, r, r + 1, 1), layer_norm(row, w, b))) << "row " << r;
        EXPECT_TRUE(test::bitwise_equal(rms.slice(0, r, r + 1, 1), rms_norm(row, w))) << "row " << r;
      }
    }
}

// Rows past 16384 elements are reduced in chunks in parallel (src/cpu/reduce.cpp): the result is
// the plain loop's, ties go to the first index across chunks, the first NaN wins, and the bits do
// not depend on the thread count.
TEST(Kernels, LongReductionsGiveTheLoopsResultAtAnyThreadCount) {
  manual_seed(12);
  const int64_t n = 50000;
  std::vector<float> v = (rand({2, n}) - 2.0).to_vector<float>();  // in [-2, -1)
  float* r1 = v.data() + n;
  // row 1's max: four zeros; the first (-0) wins, across chunks and across the kernel's two sets of
  // registers (108 and 116 fall in different sets with 8 or 16 lanes)
  r1[108] = -0.0f, r1[116] = 0.0f, r1[20000] = 0.0f, r1[40000] = 0.0f;
  Tensor x = tensor(v, {2, n});
  double loop = 0;
  for (int64_t i = 0; i < n; ++i) loop += double(v[size_t(i)]);
  EXPECT_NEAR(sum(x, {1}).to_vector<float>()[0], loop, 1e-6 * std::abs(loop));
  const auto m = max(x, 1);
  EXPECT_EQ(m.indices.to_vector<int64_t>()[1], 108);
  EXPECT_TRUE(std::signbit(m.values.to_vector<float>()[1]));
  const std::vector<float> row0(v.begin(), v.begin() + n);
  EXPECT_EQ(argmin(x, 1).to_vector<int64_t>()[0], std::min_element(row0.begin(), row0.end()) - row0.begin());
  r1[30000] = NAN, r1[45000] = NAN;
  Tensor with_nan = tensor(v, {2, n});
  EXPECT_EQ(argmax(with_nan, 1).to_vector<int64_t>()[1], 30000);
  EXPECT_EQ(argmin(with_nan, 1).to_vector<int64_t>()[1], 30000);
  EXPECT_TRUE(std::isnan(max(with_nan).item<float>()));

  const int saved = num_threads();
  const Tensor big = randn({1 << 20}), cube = randn({4, 1500, 96});
  set_num_threads(1);
  const Tensor all1 = sum(big), mid1 = sum(cube, {1}), arg1 = argmax(big, 0);
  set_num_threads(std::max(2, saved));
  EXPECT_TRUE(test::bitwise_equal(sum(big), all1));
  EXPECT_TRUE(test::bitwise_equal(sum(cube, {1}), mid1));
  EXPECT_TRUE(test::bitwise_equal(argmax(big, 0), arg1));
  set_num_threads(saved);
}

// A copy whose source runs contiguously along another dim than the result's last (a transpose)
// goes in tiles (src/cpu/elementwise.cpp); every element lands where the index loop puts it, at
// sizes that are not multiples of the tile, with other dims around, and converting dtype.
TEST(Kernels, ATransposingCopyPutsEveryElementWhereALoopDoes) {
  manual_seed(13);
  const Tensor x = randn({50, 3, 37});
  const std::vector<float> v = x.to_vector<float>();
  const Tensor y = x.permute({2, 1, 0}).contiguous();  // (37, 3, 50): x's last dim becomes the first
  ASSERT_EQ(y.shape(), Shape({37, 3, 50}));
  const std::vector<float> got = y.to_vector<float>();
  const std::vector<float> half = x.permute({2, 1, 0}).to(DType::bf16).to(DType::f32).to_vector<float>();
  for (int64_t i = 0; i < 37; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 50; ++k) {
        const float want = v[size_t((k * 3 + j) * 37 + i)];
        ASSERT_EQ(got[size_t((i * 3 + j) * 50 + k)], want) << i << "," << j << "," << k;
        ASSERT_EQ(half[size_t((i * 3 + j) * 50 + k)], float(bf16(want))) << i << "," << j << "," << k;
      }
  const Tensor m = randn({33, 70});
  EXPECT_TRUE(test::bitwise_equal(m.t().contiguous().t().contiguous(), m));
}

// bf16 elementwise ops and softmax run through float blocks (src/cpu/loops.h) or, for + - * /, in
// registers (src/cpu/simd/bf16.h), rounded as bf16(float) rounds (NaN, inf, subnormals); reductions
// and argmax on widened registers: each gives what the f32 kernel gives on the widened values,
// rounded once; x.pow(2) is x * x; clamp keeps NaN.
TEST(Kernels, HalfPrecisionOpsComputeInFloatAsTheF32KernelsDo) {
  manual_seed(14);
  const Tensor xb = randn({3, 700}).to(DType::bf16), wb = randn({700}).to(DType::bf16);
  const Tensor xf = xb.to(DType::f32), wf = wb.to(DType::f32);
  EXPECT_TRUE(test::bitwise_equal(silu(xb), silu(xf).to(DType::bf16)));
  EXPECT_TRUE(test::bitwise_equal(mul(xb, wb), mul(xf, wf).to(DType::bf16)));
  EXPECT_TRUE(test::bitwise_equal(add(xb, 0.375), add(xf, 0.375).to(DType::bf16)));  // a scalar bf16 holds exactly
  EXPECT_TRUE(test::bitwise_equal(softmax(xb, -1), softmax(xf, -1).to(DType::bf16)));
  const std::vector<float> v = xf.to_vector<float>();
  const std::vector<float> s = sum(xb, {1}).to(DType::f32).to_vector<float>();
  for (int64_t r = 0; r < 3; ++r) {
    double want = 0;
    for (int64_t i = 0; i < 700; ++i) want += double(v[size_t(r * 700 + i)]);
    EXPECT_NEAR(s[size_t(r)], want, std::abs(want) / 256 + 1e-6) << "row " << r;  // one bf16 rounding
  }
  std::vector<float> with_nan = v;
  with_nan[1000] = NAN;  // row 1, column 300
  const Tensor nb = tensor(with_nan, {3, 700}).to(DType::bf16);
  std::vector<float> odd = with_nan;
  odd[5] = -NAN, odd[6] = INFINITY, odd[7] = 3e38f, odd[8] = 1e-40f;  // in the register-wide part of row 0
  const Tensor ob = tensor(odd, {3, 700}).to(DType::bf16), of = ob.to(DType::f32);
  EXPECT_TRUE(test::bitwise_equal(mul(ob, wb), mul(of, wf).to(DType::bf16)));  // NaNs keep sign and payload, overflow is inf
  EXPECT_TRUE(test::bitwise_equal(div(ob, wb), div(of, wf).to(DType::bf16)));
  EXPECT_TRUE(test::bitwise_equal(sub(ob, 0.5), sub(of, 0.5).to(DType::bf16)));
  EXPECT_TRUE(test::bitwise_equal(silu(ob), silu(of).to(DType::bf16)));
  const std::vector<int64_t> am = argmax(nb, 1).to_vector<int64_t>();
  EXPECT_EQ(am[1], 300);
  for (int64_t r : {0, 2}) {
    const auto row = v.begin() + r * 700;
    EXPECT_EQ(am[size_t(r)], std::max_element(row, row + 700) - row) << "row " << r;
  }
  const Tensor x = randn({1000});
  EXPECT_TRUE(test::bitwise_equal(pow(x, 2.0), x * x));
  const Tensor xd = x.to(DType::f64);
  EXPECT_TRUE(test::bitwise_equal(pow(xd, 2.0), xd * xd));
  std::vector<float> c = x.to_vector<float>();
  c[7] = NAN;
  const std::vector<float> got = clamp(tensor(c, {1000}), -0.5, 0.5).to_vector<float>();
  for (size_t i = 0; i < c.size(); ++i) {
    if (std::isnan(c[i])) EXPECT_TRUE(std::isnan(got[i]));
    else EXPECT_EQ(got[i], std::min(0.5f, std::max(-0.5f, c[i]))) << i;
  }
}

// softmax over a leading or middle dim of a contiguous f32 tensor runs down its columns where they
// lie (src/cpu/reduce.cpp softmax_cols); it agrees with the last-dim kernel on the transposed rows,
// NaN and all -inf columns included.
TEST(Kernels, SoftmaxDownColumnsAgreesWithTheRowKernel) {
  manual_seed(15);
  std::vector<float> v = (randn({300, 37}) * 3.0).to_vector<float>();
  for (int64_t r = 0; r < 300; ++r) v[size_t(r * 37 + 5)] = -INFINITY;  // column 5 all -inf
  v[size_t(17 * 37 + 9)] = NAN;                                         // column 9 holds a NaN
  const Tensor x = tensor(v, {300, 37});
  for (bool log : {false, true}) {
    SCOPED_TRACE(log ? "log_softmax" : "softmax");
    const Tensor cols = log ? log_softmax(x, 0) : softmax(x, 0);
    const Tensor rows = (log ? log_softmax(x.t().contiguous(), 1) : softmax(x.t().contiguous(), 1)).t().contiguous();
    const std::vector<float> a = cols.to_vector<float>(), b = rows.to_vector<float>();
    for (size_t i = 0; i < a.size(); ++i) {
      if (std::isnan(b[i])) EXPECT_TRUE(std::isnan(a[i])) << i;
      else EXPECT_NEAR(a[i], b[i], 1e-5f * (1.0f + std::abs(b[i]))) << i;
    }
  }
  const Tensor x3 = randn({4, 50, 20});
  EXPECT_TRUE(test::all_close(softmax(x3, 1), softmax(x3.transpose(1, 2).contiguous(), 2).transpose(1, 2), 1e-6, 1e-6));
}

// Normal draws compute Box-Muller's log, sin and cos a register at a time (src/cpu/simd/normal.h):
// within 1 ulp of long double over what the draws feed them (the ends, the reductions' boundaries,
// random words), and f32 draws equal libm's Box-Muller rounded to float.
TEST(Kernels, NormalDrawsMatchLibmsBoxMuller) {
  using simd::vdouble;
  auto ulps = [](double got, long double want) {
    const double w = double(want);
    return double(std::fabs((long double)got - want)) / (std::nextafter(std::fabs(w), INFINITY) - std::fabs(w));
  };
  std::vector<uint32_t> words = {0, 1, 2, 3, 0x7fffffff, 0x80000000, 0xb504f333, 0xb504f334, 0x3fffffff, 0x40000000,
                                 0x40000001, 0xbfffffff, 0xc0000000, 0x1fffffff, 0x20000000, 0x60000000, 0xfffffffe, 0xffffffff};
  uint32_t r[4];
  for (uint64_t b = 0; b < 20000; ++b) philox(9, b, r), words.insert(words.end(), r, r + 4);
  double worst_log = 0, worst_trig = 0;
  for (size_t i = 0; i + simd::kDoubles <= words.size(); i += simd::kDoubles) {
    vdouble u1, th, s, c;
    for (int l = 0; l < simd::kDoubles; ++l)
      u1[l] = (double(words[i + size_t(l)]) + 1.0) * 0x1p-32, th[l] = 6.283185307179586 * double(words[i + size_t(l)]) * 0x1p-32;
    const vdouble lg = simd::log_unit(u1);
    simd::sincos_turn(th, s, c);
    for (int l = 0; l < simd::kDoubles; ++l) {
      if (u1[l] != 1.0) worst_log = std::max(worst_log, ulps(lg[l], std::log((long double)u1[l])));
      else EXPECT_EQ(lg[l], 0.0);
      worst_trig = std::max({worst_trig, ulps(s[l], std::sin((long double)th[l])), ulps(c[l], std::cos((long double)th[l]))});
    }
  }
  EXPECT_LE(worst_log, 1.0);
  EXPECT_LE(worst_trig, 1.0);
  manual_seed(21);
  const int64_t n = (1 << 20) + 37;  // whole batches and a tail
  const uint64_t ctr = default_generator().offset;
  const std::vector<float> got = randn({n}).to_vector<float>();
  int differ = 0;
  for (int64_t i = 0; i < n; ++i) {
    philox(21, ctr + uint64_t(i / 4), r);
    const int k = int(i % 4) / 2 * 2;
    const double u1 = (double(r[k]) + 1.0) / 4294967296.0, u2 = double(r[k + 1]) / 4294967296.0;
    const double rad = std::sqrt(-2.0 * std::log(u1)), th = 6.283185307179586 * u2;
    const float want = float(i % 2 == 0 ? rad * std::cos(th) : rad * std::sin(th));
    if (got[size_t(i)] != want) {
      ++differ;
      ASSERT_TRUE(got[size_t(i)] == std::nextafter(want, INFINITY) || got[size_t(i)] == std::nextafter(want, -INFINITY)) << i;
    }
  }
  EXPECT_LE(differ, 4);
}

// Float sums add a lane's 16 values (rows) or 8 rows (columns) in f32 before going on in double
// (src/cpu/simd/lanes.h, reduce.cpp): within 2^-20 of the sum of magnitudes of the loop in double,
// at lengths around the blocks' edges; logsumexp's float rows and log's polynomial against libm.
TEST(Kernels, FloatSumsInBlocksStayWithinTheLoopsBound) {
  manual_seed(15);
  for (const int64_t n : {1, 127, 128, 129, 255, 256, 257, 1000, 4099}) {
    const Tensor x = randn({3, n}) * 100.0 + 1.0;
    const std::vector<float> v = x.to_vector<float>();
    const Tensor xb = x.to(DType::bf16);
    for (const bool half : {false, true}) {
      const std::vector<float> s = (half ? sum(xb, {1}).to(DType::f32) : sum(x, {1})).to_vector<float>();
      const std::vector<float> w = half ? xb.to(DType::f32).to_vector<float>() : v;
      for (int64_t r = 0; r < 3; ++r) {
        double loop = 0, mag = 0;
        for (int64_t i = 0; i < n; ++i) loop += double(w[size_t(r * n + i)]), mag += std::fabs(double(w[size_t(r * n + i)]));
        const double rounding = std::fabs(loop) * (half ? 0x1p-8 : 0x1p-23);  // the result's dtype
        EXPECT_NEAR(s[size_t(r)], loop, mag * 0x1p-20 + rounding) << n << " row " << r;
      }
    }
    const Tensor cols = randn({n, 37}) * 100.0, cs = sum(cols, {0});
    const std::vector<float> cv = cols.to_vector<float>(), got = cs.to_vector<float>();
    for (int64_t c = 0; c < 37; ++c) {
      double loop = 0, mag = 0;
      for (int64_t r = 0; r < n; ++r) loop += double(cv[size_t(r * 37 + c)]), mag += std::fabs(double(cv[size_t(r * 37 + c)]));
      EXPECT_NEAR(got[size_t(c)], loop, mag * 0x1p-20 + std::fabs(loop) * 0x1p-23) << n << " col " << c;
    }
  }
  const Tensor rows = tensor(std::vector<float>{1, 2, 3, -INFINITY, -INFINITY, -INFINITY, INFINITY, NAN, 1, 5, -INFINITY, 7}, {4, 3});
  const std::vector<float> lse = logsumexp(rows, {1}).to_vector<float>();
  EXPECT_NEAR(lse[0], std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)), 1e-6);
  EXPECT_EQ(lse[1], -INFINITY);
  EXPECT_TRUE(std::isnan(lse[2]));
  EXPECT_NEAR(lse[3], 7.0 + std::log(1.0 + std::exp(-2.0)), 1e-6);
  double worst = 0;
  for (uint64_t b = 0; b < 0x7f800000u; b += 4099) {
    const float x = std::bit_cast<float>(uint32_t(b)), got = fn::log_f32(x);
    const double want = std::log(double(x)), w = std::fabs(double(float(want)));
    worst = std::max(worst, std::fabs(double(got) - want) / (double(std::nextafter(float(w), INFINITY)) - w));
  }
  EXPECT_LE(worst, 1.0);
  const std::vector<float> specials = log(tensor(std::vector<float>{0.0f, -0.0f, -1.0f, INFINITY, -INFINITY, NAN, 1.0f}, {7})).to_vector<float>();
  EXPECT_EQ(specials[0], -INFINITY);
  EXPECT_EQ(specials[1], -INFINITY);
  EXPECT_TRUE(std::isnan(specials[2]) && std::isnan(specials[4]) && std::isnan(specials[5]));
  EXPECT_EQ(specials[3], INFINITY);
  EXPECT_EQ(specials[6], 0.0f);
  EXPECT_EQ(arange(-5, 3000000, 3).to_vector<int64_t>()[999999], -5 + 3 * 999999);
}

// The register-wide bf16 narrowing (cpu/simd/bf16.h) gives bf16(float)'s bits on patterns across
// the range: ties to even, NaNs whose low half would carry into the sign, infinities, subnormals.
TEST(Kernels, RegisterWideBf16RoundingIsTheScalarOne) {
#if defined(__AVX2__)
  std::vector<float> v;
  for (uint64_t b = 0; b <= 0xffffffffu; b += 40009) v.push_back(std::bit_cast<float>(uint32_t(b)));
  for (const uint32_t b : {0x7fffffffu, 0xffffffffu, 0x7f800001u, 0x7fc0ffffu, 0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0x00008000u})
    v.push_back(std::bit_cast<float>(b));
  while (v.size() % 16) v.push_back(0.0f);
  std::vector<bf16> natural(v.size()), unpacked(v.size());
  for (size_t i = 0; i < v.size(); i += 16) {
    cpu::simd::narrow16(natural.data() + i, _mm256_loadu_ps(&v[i]), _mm256_loadu_ps(&v[i + 8]));
    std::vector<bf16> in(16);
    for (size_t j = 0; j < 16; ++j) in[j].bits = uint16_t(std::bit_cast<uint32_t>(v[i + j]) >> 16);
    __m256 lo, hi;  // unpack then pack: each value comes back where it was, as bf16(float(x)) (NaNs quieted)
    cpu::simd::unpack16(in.data(), lo, hi);
    cpu::simd::pack16(unpacked.data() + i, lo, hi);
    for (size_t j = 0; j < 16; ++j) ASSERT_EQ(unpacked[i + j].bits, bf16(float(in[j])).bits) << i + j;
  }
  for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(natural[i].bits, bf16(v[i]).bits) << std::bit_cast<uint32_t>(v[i]);
#else
  GTEST_SKIP() << "built without AVX2: the register-wide bf16 path is not compiled";
#endif
}

// sin and cos of floats run a branch-free pass in double up to 2^19 and libm past it
// (src/ops/scalar_fns.h, cpu/elementwise.cpp): within 1 ulp of libm's double result rounded, on
// bit patterns across the range, past 2^19, on NaN and inf, in f32 and through bf16's float blocks.
TEST(Kernels, SinAndCosOfFloatsStayWithinAnUlpOfLibm) {
  std::vector<float> v;
  for (uint64_t b = 0; b < 0x7f800000u; b += 40009) v.push_back(std::bit_cast<float>(uint32_t(b))), v.push_back(-v.back());
  for (const float e : {0.7853982f, 1.5707964f, 3.1415927f, 4.712389f, 6.2831855f, 524288.0f, 524288.06f, 1e30f, INFINITY, -INFINITY, NAN})
    v.push_back(e);
  const Tensor x = tensor(v, {int64_t(v.size())});
  for (const bool is_cos : {false, true}) {
    const std::vector<float> got = (is_cos ? cos(x) : sin(x)).to_vector<float>();
    double worst = 0;
    for (size_t i = 0; i < v.size(); ++i) {
      const double want = is_cos ? std::cos(double(v[i])) : std::sin(double(v[i]));
      if (std::isnan(want)) { EXPECT_TRUE(std::isnan(got[i])) << v[i]; continue; }
      const float w = std::fabs(float(want));
      const double ulp = double(std::nextafter(w, INFINITY)) - double(w);
      worst = std::max(worst, std::fabs(double(got[i]) - want) / std::max(ulp, 1e-45));
    }
    EXPECT_LE(worst, 1.0) << (is_cos ? "cos" : "sin");
  }
  const Tensor xb = x.narrow(0, 0, 4000).to(DType::bf16);
  const std::vector<float> half = sin(xb).to(DType::f32).to_vector<float>(), wide = sin(xb.to(DType::f32)).to_vector<float>();
  for (size_t i = 0; i < half.size(); ++i) ASSERT_EQ(std::bit_cast<uint32_t>(half[i]), std::bit_cast<uint32_t>(float(bf16(wide[i])))) << i;
}

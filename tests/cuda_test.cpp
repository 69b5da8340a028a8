// The CUDA backend against the CPU: copies, elementwise ops (bit for bit where both sides run
// Sinter's own functors), errors. Without a usable GPU every test that needs one skips with the
// reason; SINTER_REQUIRE_GPU=1 turns the skip into a failure, so a device run cannot pass by skipping.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "cuda_test_util.h"
#include "train_util.h"

using namespace sinter;

namespace {

const Device kGpu = Device::cuda(0);

// Ulps between two f32 tensors' elements, the largest (NaNs must sit at the same places).
int64_t max_ulps(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_vector<float>(), y = b.to_vector<float>();
  int64_t worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i]) || std::isnan(y[i])) {
      if (std::isnan(x[i]) != std::isnan(y[i])) return INT64_MAX;
      continue;
    }
    int32_t u, v;
    std::memcpy(&u, &x[i], 4), std::memcpy(&v, &y[i], 4);
    const int64_t iu = u < 0 ? int64_t(INT32_MIN) - u : u, iv = v < 0 ? int64_t(INT32_MIN) - v : v;
    worst = std::max<int64_t>(worst, std::llabs(iu - iv));
  }
  return worst;
}

}  // namespace

TEST(CudaBackend, SaysWhyItIsUnavailableAndAllocationNamesTheReason) {
  if (cuda::available()) {
    EXPECT_GE(cuda::device_count(), 1);
    EXPECT_EQ(cuda::unavailable_reason(), "");
    return;
  }
  EXPECT_EQ(cuda::device_count(), 0);
  EXPECT_FALSE(cuda::unavailable_reason().empty());
  try {
    (void)ones({2, 3}).to(kGpu);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA device: " + cuda::unavailable_reason()), std::string::npos) << e.what();
  }
}

TEST(CudaBackend, CopiesRoundTripEveryDtypeAndLayout) {
  NEEDS_GPU();
  manual_seed(3);
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i8, DType::u8, DType::i32, DType::i64, DType::boolean}) {
    const Tensor x = (randn({5, 7}) * 3).to(dt);
    for (const Tensor& t : {x, x.transpose(0, 1), x.slice(1, 1, 6)}) {
      const Tensor g = t.to(kGpu);
      EXPECT_EQ(g.device(), kGpu);
      EXPECT_TRUE(test::bitwise_equal(g.to(Device::cpu()), t.contiguous())) << dt;
      EXPECT_TRUE(test::bitwise_equal(g.transpose(0, 1).contiguous().to(Device::cpu()), t.transpose(0, 1).contiguous())) << dt;
    }
  }
}

TEST(CudaBackend, ElementwiseOpsEqualTheCpuBitForBitWhereBothRunSintersFunctors) {
  NEEDS_GPU();
  manual_seed(4);
  const Tensor x = randn({33, 65}) * 4, y = randn({33, 65}) * 4 + 0.5, pos = abs(x) + 0.01;
  const Tensor gx = x.to(kGpu), gy = y.to(kGpu), gpos = pos.to(kGpu);
  auto same = [](const Tensor& cpu, const Tensor& gpu, int64_t ulps, const char* what) {
    EXPECT_LE(max_ulps(cpu, gpu.to(Device::cpu())), ulps) << what;
  };
  same(neg(x), neg(gx), 0, "neg");
  same(exp(x), exp(gx), 0, "exp");
  same(tanh(x), tanh(gx), 0, "tanh");
  same(sigmoid(x), sigmoid(gx), 0, "sigmoid");
  same(gelu(x), gelu(gx), 0, "gelu");
  same(gelu(x, true), gelu(gx, true), 0, "gelu_tanh");
  same(silu(x), silu(gx), 0, "silu");
  same(erf(x), erf(gx), 0, "erf");
  same(sqrt(pos), sqrt(gpos), 0, "sqrt");
  same(rsqrt(pos), rsqrt(gpos), 0, "rsqrt");
  same(x + y, gx + gy, 0, "add");
  same(x * y, gx * gy, 0, "mul");
  same(x / y, gx / gy, 0, "div");
  same(maximum(x, y), maximum(gx, gy), 0, "maximum");
  same(log(pos), log(gpos), 2, "log");  // each side's math library
  same(sin(x), sin(gx), 2, "sin");
  same(cos(x), cos(gx), 2, "cos");
  same(pow(pos, y), pow(gpos, gy), 2, "pow");
  // Broadcasting, strided inputs, bf16 and comparisons.
  const Tensor a = randn({3, 1, 5}), b = randn({4, 5}).transpose(0, 1).contiguous().transpose(0, 1);
  same(a + b, a.to(kGpu) + b.to(kGpu), 0, "add broadcast strided");
  const Tensor h = x.to(DType::bf16);
  EXPECT_TRUE(test::bitwise_equal(gelu(h), gelu(h.to(kGpu)).to(Device::cpu())));
  EXPECT_TRUE(test::bitwise_equal(lt(x, y), lt(gx, gy).to(Device::cpu())));
  EXPECT_TRUE(test::bitwise_equal(where(lt(x, y), x, y), where(lt(gx, gy), gx, gy).to(Device::cpu())));
}

// sum, mean and prod over consecutive dims with kept dims after them read x in place by columns
// (src/cuda/reduce.cu: one run of rows, or several combined by a second kernel); other dims take
// the rows path (a thread per row of up to 16). Against the f64 sum of the same (rounded) x:
// within the output's rounding plus 1e-5 of the sum of |x| (f32 adds in another order); integer
// and bool sums exactly.
TEST(CudaBackend, ReductionsByColumnsAndByRowsMatchTheF64Sum) {
  NEEDS_GPU();
  manual_seed(11);
  struct Case {
    Shape shape, dims;
  };
  const Case cases[] = {{{1000, 33}, {0}},   {{20000, 3}, {0}},   {{5, 7, 40}, {1}}, {{3, 200, 4, 9}, {1, 2}},
                        {{70, 64}, {0, 1}}, {{2, 300, 4}, {0, 2}}, {{0, 5}, {0}},     {{6, 0}, {0}},
                        {{70000, 4}, {1}},  {{300, 16}, {1}},    {{100, 17}, {1}}, {{9, 5, 3}, {0, 2}}};
  for (const Case& c : cases) {
    std::ostringstream name;
    name << "shape " << c.shape << " dims " << c.dims;
    const std::string what = name.str();
    double n = 1;  // values per output
    for (const int64_t d : c.dims) n *= double(c.shape[size_t(d)]);
    const Tensor x = randn(c.shape);
    for (const DType dt : {DType::f32, DType::bf16, DType::f64}) {
      const Tensor xd = x.to(dt), x64 = xd.to(DType::f64), gx = xd.to(kGpu);
      const Tensor want = sum(x64, c.dims), slack = sum(abs(x64), c.dims) * 1e-5;
      const double rounding = dt == DType::bf16 ? std::ldexp(1.0, -8) : dt == DType::f32 ? std::ldexp(1.0, -24) : 0;
      auto close = [&](const Tensor& got, const Tensor& ref, const char* op) {
        ASSERT_EQ(got.shape(), ref.shape()) << op << " " << what;
        const Tensor err = abs(got.to(Device::cpu()).to(DType::f64) - ref) - abs(ref) * rounding - slack;
        EXPECT_TRUE(err.numel() == 0 || max(err).item<double>() <= 0) << op << " " << dtype_name(dt) << " " << what;
      };
      close(sum(gx, c.dims), want, "sum");
      if (n > 0) close(mean(gx, c.dims), want / n, "mean");
    }
    const Tensor xi = (x * 10).to(DType::i64), xb = gt(x, zeros_like(x));
    EXPECT_TRUE(test::bitwise_equal(sum(xi.to(kGpu), c.dims).to(Device::cpu()), sum(xi, c.dims))) << "i64 " << what;
    const Tensor x32 = xi.to(DType::i32);
    EXPECT_TRUE(test::bitwise_equal(sum(x32.to(kGpu), c.dims).to(Device::cpu()), sum(x32, c.dims))) << "i32 " << what;
    EXPECT_TRUE(test::bitwise_equal(sum(xb.to(kGpu), c.dims).to(Device::cpu()), sum(xb, c.dims))) << "bool " << what;
  }
  const Tensor p = rand({600, 17}) * 0.2 + 0.9;  // prod over rows split in runs
  const Tensor p64 = prod(p.to(DType::f64), {0});
  EXPECT_LE(max(abs(prod(p.to(kGpu), {0}).to(Device::cpu()).to(DType::f64) / p64 - 1)).item<double>(), 1e-4);
  const Tensor q64 = prod(p.to(DType::f64), {1});  // rows of 17, and of 16 (a thread each)
  EXPECT_LE(max(abs(prod(p.to(kGpu), {1}).to(Device::cpu()).to(DType::f64) / q64 - 1)).item<double>(), 1e-5);
  const Tensor r = p.narrow(1, 0, 16), r64 = prod(r.to(DType::f64), {1});
  EXPECT_LE(max(abs(prod(r.to(kGpu), {1}).to(Device::cpu()).to(DType::f64) / r64 - 1)).item<double>(), 1e-5);
}

// topk of more than 64 values a row sorts the rows, and rows past 4096 of f32 or bf16 select by
// radix (src/cuda/topk.cu): values and indices equal the CPU's for every k, order and dtype, with
// ties, NaN and both zeros, along a middle dim, in rows shorter and longer than a shared-memory
// tile, of lengths that are no power of two.
TEST(CudaBackend, TopkOfManyValuesEqualsTheCpus) {
  NEEDS_GPU();
  manual_seed(12);
  struct Case {
    Shape shape;
    int64_t dim, k;
    double scale = 4;  // 0.3: nearly all zeros, so the k reach into them
  };
  const Case cases[] = {{{3, 3000}, 1, 3000}, {{3, 3000}, 1, 65},   {{2, 300, 3}, 1, 300},     {{1, 20000}, 1, 1000},
                        {{4, 100}, 1, 90},    {{2, 5000}, 1, 50},   {{2, 4500}, 1, 1024},      {{3, 4097, 2}, 1, 7},
                        {{1, 20000}, 1, 1025}, {{2, 5000}, 1, 200, 0.3}, {{2, 3000}, 1, 200, 0.3}};
  for (const Case& c : cases) {
    const Tensor xi = (randn(c.shape) * c.scale).to(DType::i64);  // many ties
    Tensor x = where(lt(rand(c.shape), full({}, 0.01)), full({}, NAN), xi.to(DType::f32));
    x = where(lt(rand(c.shape), full({}, 0.05)), full({}, -0.0), x);  // -0 ties +0
    for (const DType dt : {DType::f32, DType::bf16, DType::f64, DType::i64}) {
      const Tensor xd = dt == DType::i64 ? xi : x.to(dt), gx = xd.to(kGpu);
      for (const bool largest : {true, false}) {
        std::ostringstream what;
        what << "shape " << c.shape << " dim " << c.dim << " k " << c.k << " " << dtype_name(dt) << (largest ? " largest" : " smallest");
        const ValuesIndices want = topk(xd, c.k, c.dim, largest), got = topk(gx, c.k, c.dim, largest);
        EXPECT_TRUE(test::bitwise_equal(got.values.to(Device::cpu()), want.values)) << what.str();
        EXPECT_TRUE(test::bitwise_equal(got.indices.to(Device::cpu()), want.indices)) << what.str();
      }
    }
  }
}

// multinomial over rows past 1024 probabilities takes a block per row (src/cuda/index.cu): the
// same draws as the CPU's from the same seed, with and without replacement, zeros skipped, and a
// bad row raised at the next wait as the CPU raises it.
TEST(CudaBackend, MultinomialOverLongRowsDrawsAsTheCpu) {
  NEEDS_GPU();
  manual_seed(13);
  Tensor p = rand({3, 50000});
  p = where(lt(p, full({}, 0.3)), zeros({}), p);  // empty categories
  for (const bool replacement : {true, false}) {
    manual_seed(4);
    const Tensor want = multinomial(p, 6, replacement);
    manual_seed(4);
    const Tensor got = multinomial(p.to(kGpu), 6, replacement);
    EXPECT_TRUE(test::bitwise_equal(got.to(Device::cpu()), want)) << (replacement ? "with" : "without") << " replacement";
  }
  const Tensor at = arange(3000).reshape({1, 3000});
  const Tensor last = where(eq(at, full({}, 2999, DType::i64)), ones({}), zeros({})).expand({2, 3000}).contiguous();
  EXPECT_EQ(multinomial(last.to(kGpu), 3, true).to(Device::cpu()).to_vector<int64_t>(), std::vector<int64_t>(6, 2999));
  const Tensor bad = where(eq(at, full({}, 1234, DType::i64)), full({}, -1.0), rand({2, 3000}));
  try {
    (void)multinomial(bad.to(kGpu), 1, true).to(Device::cpu());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("[multinomial] row 0 has a probability that is negative or not finite"), std::string::npos) << m;
  }
}

TEST(CudaBackend, MixingDevicesInOneOpNamesBoth) {
  NEEDS_GPU();
  try {
    (void)add(ones({2}), ones({2}).to(kGpu));
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("[add]", 0), 0u) << m;
    EXPECT_NE(m.find("cuda:0"), std::string::npos) << m;
    EXPECT_NE(m.find("cpu"), std::string::npos) << m;
  }
}

TEST(CudaBackend, AnAllocationLargerThanTheGpuNamesTheBytesAndTheNextOpWorks) {
  NEEDS_GPU();
  try {
    (void)Tensor::empty({int64_t(1) << 40}, DType::f32, kGpu);  // 4 TiB
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("out of memory"), std::string::npos) << m;
    EXPECT_NE(m.find("asked for 4398046511104 bytes"), std::string::npos) << m;
  }
  EXPECT_EQ((ones({3}).to(kGpu) + ones({3}).to(kGpu)).to(Device::cpu()).to_vector<float>(), std::vector<float>(3, 2.0f));
}

TEST(CudaBackend, HostReadsOfDeviceDataCopyExplicitly) {
  NEEDS_GPU();
  const Tensor g = full({2, 2}, 1.5).to(kGpu);
  EXPECT_TRUE(test::throws_naming("data", [&] { (void)g.data<float>(); }));
  EXPECT_EQ(g.to_vector<float>(), std::vector<float>(4, 1.5f));  // copies to the host first
}

TEST(CudaBackend, FactoriesAndRandomDrawsEqualTheCpus) {
  NEEDS_GPU();
  manual_seed(7);
  const Tensor u = rand({1001}), n = randn({1001}), i = randint(-5, 9, {1001}), h = rand({37}, DType::bf16);
  manual_seed(7);
  const Tensor gu = rand({1001}, DType::f32, kGpu), gn = randn({1001}, DType::f32, kGpu), gi = randint(-5, 9, {1001}, DType::i64, kGpu),
               gh = rand({37}, DType::bf16, kGpu);
  EXPECT_TRUE(test::bitwise_equal(u, gu.to(Device::cpu())));
  EXPECT_TRUE(test::bitwise_equal(i, gi.to(Device::cpu())));
  EXPECT_TRUE(test::bitwise_equal(h, gh.to(Device::cpu())));
  EXPECT_LE(max_ulps(n, gn.to(Device::cpu())), 2);  // each side's log, cos and sin in double
  EXPECT_TRUE(test::bitwise_equal(full({3, 5}, -2.5, DType::bf16), full({3, 5}, -2.5, DType::bf16, kGpu).to(Device::cpu())));
  EXPECT_TRUE(test::bitwise_equal(zeros_like(u), zeros_like(gu).to(Device::cpu())));
}

TEST(CudaBackend, ItemAndPrintingReadTheDevice) {
  NEEDS_GPU();
  const Tensor g = full({1, 1}, 2.5, DType::f32, kGpu);
  EXPECT_EQ(g.item<float>(), 2.5f);
  EXPECT_EQ(full({2}, 1.0).to_string().substr(0, 20), full({2}, 1.0, DType::f32, kGpu).to_string().substr(0, 20));
  EXPECT_NE(full({2}, 1.0, DType::f32, kGpu).to_string().find("device=cuda:0"), std::string::npos);
}

TEST(CudaBackend, ACpuScalarMeetsADeviceTensorAsAValue) {
  NEEDS_GPU();
  const Tensor x = randn({4, 3});
  const Tensor g = x.to(kGpu);
  EXPECT_TRUE(test::bitwise_equal((x * 2.5).to(DType::f32), (g * 2.5).to(Device::cpu())));   // the scalar is copied over
  EXPECT_TRUE(test::bitwise_equal(scalar_tensor(1.0, DType::f32) - x, (scalar_tensor(1.0, DType::f32) - g).to(Device::cpu())));
  EXPECT_TRUE(test::throws_naming("add", [&] { (void)add(randn({3}), g); }));  // a CPU tensor with dims is not a scalar
}

TEST(CudaBackend, AModelForwardAndBackwardOnTheGpuMatchTheCpu) {
  NEEDS_GPU();
  for (const char* type : {"gpt2", "llama"}) {
    const nn::ModelConfig cfg = test::micro_config(type);
    manual_seed(11);
    nn::GPT cpu_model(cfg);
    manual_seed(11);
    nn::GPT gpu_model(cfg);
    gpu_model.to(kGpu);
    const Tensor tokens = randint(0, cfg.vocab_size, {2, 17}), targets = randint(0, cfg.vocab_size, {2, 17});
    const Tensor loss_cpu = cross_entropy(cpu_model.forward(tokens), targets);
    const Tensor loss_gpu = cross_entropy(gpu_model.forward(tokens.to(kGpu)), targets.to(kGpu));
    EXPECT_NEAR(loss_gpu.to(Device::cpu()).item<float>(), loss_cpu.item<float>(), 1e-4 * std::abs(loss_cpu.item<float>())) << type;
    loss_cpu.backward();
    loss_gpu.backward();
    const auto pc = cpu_model.named_parameters(), pg = gpu_model.named_parameters();
    ASSERT_EQ(pc.size(), pg.size());
    for (size_t i = 0; i < pc.size(); ++i)
      EXPECT_TRUE(test::all_close(pg[i].second->grad().to(Device::cpu()), pc[i].second->grad(), 1e-3, 1e-5)) << type << " " << pc[i].first;
  }
}

// torch.autocast's rule on CUDA: matmul and attention on f32 tensors compute in bf16 (the inputs
// rounded to bf16) and return f32, with f32 gradients for the f32 inputs.
TEST(CudaBackend, AutocastRunsMatmulAndAttentionInBf16) {
  NEEDS_GPU();
  const Tensor a = randn({8, 16}), b = randn({16, 4});
  const Tensor q = randn({1, 2, 5, 8}), k = randn({1, 2, 5, 8}), v = randn({1, 2, 5, 8});
  auto rounded = [](const Tensor& t) { return t.to(DType::bf16).to(DType::f32); };
  const Tensor ga = a.to(kGpu).requires_grad_();
  Tensor y, o;
  {
    AutocastGuard autocast(DType::bf16);
    y = matmul(ga, b.to(kGpu));
    o = scaled_dot_product_attention(q.to(kGpu), k.to(kGpu), v.to(kGpu), {}, 0.0, true);
  }
  EXPECT_EQ(y.dtype(), DType::f32);
  EXPECT_EQ(o.dtype(), DType::f32);
  EXPECT_TRUE(test::all_close(y.to(Device::cpu()), matmul(rounded(a), rounded(b)), 1e-2, 1e-2));
  EXPECT_TRUE(test::all_close(o.to(Device::cpu()), scaled_dot_product_attention(rounded(q), rounded(k), rounded(v), {}, 0.0, true), 2e-2, 2e-2));
  sum(y).backward();
  EXPECT_EQ(ga.grad().dtype(), DType::f32);
}

// sdpa on CUDA (the flash kernels, src/cuda/flash.cu) against the CPU's flash kernels and the math
// reference in f64: the output and the three gradients, over GQA, boolean and additive masks, a
// sliding window, odd lengths (1, 37, 1000) and head dims 64 to 256. f32 agrees within 1e-5 of the
// largest value; bf16 within bf16 rounding (2^-7 of the largest value) of the f64 reference on the
// same bf16 inputs.
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "cuda_test_util.h"

using namespace sinter;

namespace {

const Device kGpu = Device::cuda();

struct AttnCase {
  int64_t B, Hq, Hkv, Lq, Lkv, D;
  bool causal;
  const char* mask;  // "none", "bool" or "additive"
  int64_t window = 0;
};

std::string describe(const AttnCase& c) {
  char s[160];
  std::snprintf(s, sizeof s, "B%lld Hq%lld Hkv%lld Lq%lld Lkv%lld D%lld%s mask %s", (long long)c.B, (long long)c.Hq, (long long)c.Hkv,
                (long long)c.Lq, (long long)c.Lkv, (long long)c.D, c.causal ? " causal" : "", c.mask);
  return c.window ? std::string(s).append(" window ").append(std::to_string(c.window)) : std::string(s);
}

struct Inputs {
  Tensor q, k, v, mask, grad;
};

Inputs make_inputs(const AttnCase& c) {
  manual_seed(uint64_t(c.Lq * 131 + c.D));
  Inputs in{randn({c.B, c.Hq, c.Lq, c.D}), randn({c.B, c.Hkv, c.Lkv, c.D}), randn({c.B, c.Hkv, c.Lkv, c.D}), {},
            randn({c.B, c.Hq, c.Lq, c.D})};
  if (std::string(c.mask) == "bool") in.mask = gt(rand({c.B, 1, c.Lq, c.Lkv}), full({}, 0.3));  // some rows see nothing
  if (std::string(c.mask) == "additive") in.mask = randn({1, c.Hq, c.Lq, c.Lkv});
  return in;
}

struct Outputs {
  Tensor o, dq, dk, dv;
};

// The call on `dev` in `dt` (inputs rounded to dt first), outputs and gradients back as f64 on the host.
Outputs run(const Inputs& in, const AttnCase& c, Device dev, DType dt, SDPABackend be) {
  auto leaf = [&](const Tensor& t) { return t.to(dt).to(dev).detach().requires_grad_(); };
  const Tensor q = leaf(in.q), k = leaf(in.k), v = leaf(in.v);
  const Tensor mask = !in.mask.defined() ? Tensor() : in.mask.dtype() == DType::boolean ? in.mask.to(dev) : in.mask.to(dt).to(dev);
  const Tensor o = scaled_dot_product_attention(q, k, v, mask, 0.0, c.causal, std::nullopt, c.Hq != c.Hkv, be, c.window);
  sum(o * in.grad.to(dt).to(dev)).backward();
  auto host = [](const Tensor& t) { return t.to(Device::cpu()).to(DType::f64); };
  return {host(o), host(q.grad()), host(k.grad()), host(v.grad())};
}

// t as bf16 on the GPU in a view whose rows are D + 1 elements apart, the first 2 bytes past its
// buffer's start: rows off 16-byte boundaries (element loads).
Tensor unaligned(const Tensor& t) {
  return cat({zeros({t.size(0), t.size(1), t.size(2), 1}), t}, 3).to(DType::bf16).to(kGpu).narrow(3, 1, t.size(3));
}

// max |a - b| / max |b|: how far a is from b at the scale of b, or of `floor` where b is smaller (a
// gradient that is zero in exact arithmetic, as dq and dk over a single key, is rounding residue).
double relative_error(const Tensor& a, const Tensor& b, double floor) {
  const double scale = std::max(max(abs(b)).item<double>(), floor);
  return max(abs(a - b)).item<double>() / (scale > 0 ? scale : 1.0);
}

void expect_close(const Outputs& got, const Outputs& want, double tol, const std::string& what) {
  const char* names[] = {"o", "dq", "dk", "dv"};
  const Tensor* g[] = {&got.o, &got.dq, &got.dk, &got.dv};
  const Tensor* w[] = {&want.o, &want.dq, &want.dk, &want.dv};
  double e[4];
  const double floor = max(abs(want.o)).item<double>();  // the output's scale
  for (int i = 0; i < 4; ++i) EXPECT_LE(e[i] = relative_error(*g[i], *w[i], floor), tol) << names[i] << " " << what;
  std::printf("%s: o %.1e dq %.1e dk %.1e dv %.1e (tolerance %.1e)\n", what.c_str(), e[0], e[1], e[2], e[3], tol);
}

const std::vector<AttnCase>& cases() {
  static const std::vector<AttnCase> c{
      {1, 2, 2, 1, 1, 64, true, "none"},          {2, 4, 2, 37, 37, 80, true, "none"},
      {1, 2, 2, 37, 1000, 96, false, "bool"},     {1, 2, 1, 1000, 1000, 128, true, "none"},
      {1, 1, 1, 100, 100, 256, false, "additive"}, {1, 2, 2, 37, 37, 64, true, "none", 8},
      {1, 8, 2, 1000, 1000, 64, true, "none"},     {1, 2, 2, 1, 37, 128, true, "none"}};
  return c;
}

}  // namespace

TEST(CudaAttention, TheDeviceChoosesFlashForF32AndBf16UpToHeadDim256) {
  NEEDS_GPU();
  const Tensor q = randn({1, 2, 4, 128}).to(kGpu), k = randn({1, 2, 4, 128}).to(kGpu);
  EXPECT_EQ(sdpa_choose(q, k, {}, 0.0).backend, SDPABackend::flash) << sdpa_choose(q, k, {}, 0.0).reason;
  EXPECT_EQ(sdpa_choose(q.to(DType::bf16), k.to(DType::bf16), {}, 0.0).backend, SDPABackend::flash);
  const Tensor q512 = randn({1, 1, 4, 512}).to(kGpu);
  EXPECT_EQ(sdpa_choose(q512, q512, {}, 0.0).backend, SDPABackend::math) << "head dim 512 is past the flash kernels' 256";
}

TEST(CudaAttention, F32ForwardAndGradientsMatchTheCpuFlashKernelAndTheF64Reference) {
  NEEDS_GPU();
  for (const AttnCase& c : cases()) {
    const Inputs in = make_inputs(c);
    const Outputs gpu = run(in, c, kGpu, DType::f32, SDPABackend::automatic);
    expect_close(gpu, run(in, c, Device::cpu(), DType::f32, SDPABackend::flash), 1e-5, "against the CPU flash kernel, " + describe(c));
    expect_close(gpu, run(in, c, Device::cpu(), DType::f64, SDPABackend::math), 1e-5, "against the f64 reference, " + describe(c));
  }
}

// bf16 through each CUDA kernel: Sinter's flash kernels within 2^-7 of the largest value (the
// f32-tile kernels keep P and dS in f32; the tensor-core kernels, head dims 64-128, round P and dS
// to bf16 for their products and measure within 2^-7.8); cuDNN within 2^-6 where it is found.
TEST(CudaAttention, Bf16ForwardAndGradientsAreWithinBf16RoundingOfTheReference) {
  NEEDS_GPU();
  const Tensor probe = randn({1, 2, 8, 64}, DType::bf16, kGpu);
  const std::string reason = sdpa_choose(probe, probe, {}, 0.0).reason;
  std::printf("bf16 sdpa on CUDA: %s\n", reason.c_str());
  for (const bool cudnn : {false, true}) {
    if (cudnn && reason.find("cuDNN's fused attention") == std::string::npos) {
      if (cuda::emulated()) continue;  // the emulated device has no cuDNN
      ADD_FAILURE() << "cuDNN's attention does not run here: " << reason;  // the device run provides cuDNN
      continue;
    }
    if (!cudnn) setenv("SINTER_CUDNN_ATTENTION", "0", 1);
    for (const AttnCase& c : cases()) {
      Inputs in = make_inputs(c);
      for (Tensor* t : {&in.q, &in.k, &in.v, &in.grad}) *t = t->to(DType::bf16).to(DType::f32);  // the reference sees the same inputs
      if (in.mask.defined() && in.mask.dtype() != DType::boolean) in.mask = in.mask.to(DType::bf16).to(DType::f32);
      const Outputs gpu = run(in, c, kGpu, DType::bf16, SDPABackend::automatic);
      const Tensor qc = in.q.to(DType::bf16).to(kGpu), kc = in.k.to(DType::bf16).to(kGpu);
      const bool tc = !cudnn && sdpa_choose(qc, kc, {}, 0.0).reason.find("tensor-core") != std::string::npos;
      expect_close(gpu, run(in, c, Device::cpu(), DType::f64, SDPABackend::math), std::ldexp(1.0, cudnn ? -6 : -7),
                   std::string(cudnn ? "cuDNN" : tc ? "flash (tensor cores)" : "flash") + " bf16, " + describe(c));
    }
    unsetenv("SINTER_CUDNN_ATTENTION");
  }
}

// A decode step: one query over a KV cache of 64 positions holding 40, the length a device tensor;
// f32, and bf16 at head dims 64, 128 and 256 from rows 16-byte aligned (16-byte loads) and from
// views whose rows are not (element loads), against the CPU on the same bf16-rounded inputs.
TEST(CudaAttention, ADecodeStepReadsTheCacheLengthOnTheDevice) {
  NEEDS_GPU();
  const Tensor n = scalar_tensor(40, DType::i64);
  auto decode = [&](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& len) {
    return scaled_dot_product_attention(q, k, v, {}, 0.0, true, std::nullopt, true, SDPABackend::automatic, 0, len);
  };
  for (const int64_t D : {64, 128, 256}) {
    manual_seed(5);
    auto bf = [](const Tensor& t) { return t.to(DType::bf16).to(DType::f32); };
    const Tensor q = bf(randn({1, 8, 1, D})), k = bf(randn({1, 2, 64, D})), v = bf(randn({1, 2, 64, D}));
    const Tensor want = decode(q, k, v, n).to(DType::f64);
    auto error = [&](const Tensor& got) { return relative_error(got.to(Device::cpu()).to(DType::f64), want, 0.0); };
    EXPECT_LE(error(decode(q.to(kGpu), k.to(kGpu), v.to(kGpu), n.to(kGpu))), 1e-5) << "f32, head dim " << D;
    auto gpu = [](const Tensor& t) { return t.to(DType::bf16).to(kGpu); };
    EXPECT_LE(error(decode(gpu(q), gpu(k), gpu(v), n.to(kGpu))), std::ldexp(1.0, -7)) << "bf16, head dim " << D;
    EXPECT_LE(error(decode(gpu(q), unaligned(k), unaligned(v), n.to(kGpu))), std::ldexp(1.0, -7)) << "bf16 unaligned, head dim " << D;
  }
}

// The bf16 tensor-core kernels (cuDNN turned off where it is found) with what cuDNN is not given:
// dropout (the CPU's Philox draws, so both devices drop the same elements), forward and the three
// gradients, from operands whose rows are 16-byte aligned (whole-chunk loads) and from views whose
// rows are not (element loads); and a KV cache's length with a chunk of queries. Against the CPU
// on the same bf16-rounded inputs in f32, within bf16 rounding.
TEST(CudaAttention, TheBf16TensorCoreKernelsTakeDropoutUnalignedRowsAndACacheLength) {
  NEEDS_GPU();
  setenv("SINTER_CUDNN_ATTENTION", "0", 1);
  auto bf = [](const Tensor& t) { return t.to(DType::bf16).to(DType::f32); };
  manual_seed(9);
  const Tensor q = bf(randn({1, 4, 70, 64})), k = bf(randn({1, 2, 130, 64})), v = bf(randn({1, 2, 130, 64}));
  const Tensor dout = bf(randn({1, 4, 70, 64}));
  auto gpu = [](const Tensor& t) { return t.to(DType::bf16).to(kGpu); };
  const std::string why = sdpa_choose(gpu(q), gpu(k), {}, 0.2).reason;
  EXPECT_NE(why.find("tensor-core"), std::string::npos) << why;
  for (const bool aligned : {true, false})
    for (const double p : {0.0, 0.2}) {
      auto attend = [&](Device dev, auto cast) {  // o, dq, dk, dv as f64 on the host
        const Tensor ql = cast(q).detach().requires_grad_(), kl = cast(k).detach().requires_grad_();
        const Tensor vl = cast(v).detach().requires_grad_();
        manual_seed(11);
        const Tensor o = scaled_dot_product_attention(ql, kl, vl, {}, p, true, std::nullopt, true,
                                                      dev == Device::cpu() ? SDPABackend::flash : SDPABackend::automatic);
        sum(o * cast(dout)).backward();
        std::vector<Tensor> r;
        for (const Tensor& t : {o, ql.grad(), kl.grad(), vl.grad()}) r.push_back(t.to(Device::cpu()).to(DType::f64));
        return r;
      };
      const std::vector<Tensor> got = aligned ? attend(kGpu, gpu) : attend(kGpu, unaligned);
      const std::vector<Tensor> want = attend(Device::cpu(), [](const Tensor& t) { return t; });
      const char* names[] = {"o", "dq", "dk", "dv"};
      for (int i = 0; i < 4; ++i)
        EXPECT_LE(relative_error(got[i], want[i], 0.0), std::ldexp(1.0, -7))
            << names[i] << ", dropout " << p << (aligned ? "" : ", unaligned rows");
    }
  const Tensor chunk = q.narrow(2, 0, 5), n = scalar_tensor(37, DType::i64);  // 5 queries at positions 32-36 of a cache holding 37
  const Tensor got = scaled_dot_product_attention(gpu(chunk), gpu(k), gpu(v), {}, 0.0, true, std::nullopt, true, SDPABackend::automatic,
                                                  0, n.to(kGpu));
  const Tensor want = scaled_dot_product_attention(chunk, k, v, {}, 0.0, true, std::nullopt, true, SDPABackend::automatic, 0, n);
  EXPECT_LE(relative_error(got.to(Device::cpu()).to(DType::f64), want.to(DType::f64), 0.0), std::ldexp(1.0, -7));
  unsetenv("SINTER_CUDNN_ATTENTION");
}

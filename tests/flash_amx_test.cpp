// bf16 attention on a CPU with AMX (src/cpu/attention/flash_amx.cpp, flash_amx_backward.cpp): the
// forward's products on the tile unit where a kv head has more than 4 query rows, the backward's
// always, against the f64 math backend on the same bf16 values, output and gradients. The cases
// cover what the kernels pad and split by: head dims past a chunk of 32 and q's apart from v's,
// lengths past a job of 32 rows and a step of 128 keys, GQA, causal top-left and bottom-right
// (rows that see nothing), windows, boolean and additive masks, operands as strided views.
// Elsewhere the same cases check the f32 kernels that serve these calls; the choice says which ran.
#include <sstream>

#include "test_util.h"

namespace sinter {
namespace {

double rel_err(const Tensor& a, const Tensor& b) {
  const Tensor a64 = a.to(DType::f64), b64 = b.to(DType::f64);
  return max(abs(a64 - b64)).item_double() / std::max(max(abs(b64)).item_double(), 1.0);
}

struct Case {
  int64_t D, Dv, Lq, Lkv, Hkv, group;
  bool causal;
  int mask;  // 0 none, 1 boolean (B, 1, Lq, Lkv) with a row that sees nothing, 2 additive (Lq, Lkv)
  int64_t window;
  bool strided;  // q, k, v as (B, L, H, D) views transposed to (B, H, L, D)
  std::string name() const {
    std::ostringstream s;
    s << "D=" << D << " Dv=" << Dv << " Lq=" << Lq << " Lkv=" << Lkv << " GQA " << group << ":1" << (causal ? " causal" : "")
      << (mask == 1 ? " bool mask" : mask == 2 ? " additive mask" : "") << (window ? " window=" + std::to_string(window) : "")
      << (strided ? " strided" : "");
    return s.str();
  }
};

Tensor operand(int64_t B, int64_t H, int64_t L, int64_t D, bool strided) {
  return strided ? randn({B, L, H, D}).to(DType::bf16).transpose(1, 2) : randn({B, H, L, D}).to(DType::bf16);
}

void check(const Case& c) {
  manual_seed(uint64_t(c.D * 11 + c.Lq * 7 + c.Lkv));
  const int64_t B = 2, Hq = c.Hkv * c.group;
  const Tensor q = operand(B, Hq, c.Lq, c.D, c.strided), k = operand(B, c.Hkv, c.Lkv, c.D, c.strided),
               v = operand(B, c.Hkv, c.Lkv, c.Dv, c.strided), dout = randn({B, Hq, c.Lq, c.Dv});
  Tensor mask;
  if (c.mask == 1) {
    mask = lt(rand({B, 1, c.Lq, c.Lkv}), full({}, 0.8));
    mask.narrow(2, 1, 1).fill_(0.0);
  } else if (c.mask == 2) {
    mask = randn({c.Lq, c.Lkv}) * 2.0;
  }
  SCOPED_TRACE(c.name() + "; " + sdpa_choose(q, k, mask, 0.0).reason);
  auto run = [&](const Tensor& q0, const Tensor& k0, const Tensor& v0, SDPABackend backend) {
    Tensor qq = q0.detach().requires_grad_(), kk = k0.detach().requires_grad_(), vv = v0.detach().requires_grad_();
    Tensor o = scaled_dot_product_attention(qq, kk, vv, mask, 0.0, c.causal, {}, c.group > 1, backend, c.window);
    auto g = autograd::grad({sum(o.to(DType::f64) * dout.to(DType::f64))}, {qq, kk, vv});
    return std::vector<Tensor>{o.detach(), g[0], g[1], g[2]};
  };
  const auto f = run(q, k, v, SDPABackend::flash);
  const auto m = run(q.to(DType::f64), k.to(DType::f64), v.to(DType::f64), SDPABackend::math);
  EXPECT_EQ(f[0].dtype(), DType::bf16);
  EXPECT_LE(rel_err(f[0], m[0]), 8e-3) << "output";  // P and the output each rounded to bf16 once
  const char* names[] = {"dq", "dk", "dv"};
  for (size_t i = 1; i < 4; ++i) EXPECT_LE(rel_err(f[i], m[i]), 2e-2) << names[i - 1];
}

TEST(FlashAmx, Bf16PrefillMatchesF64Math) {
  const std::pair<int64_t, int64_t> dims[] = {{16, 16}, {40, 40}, {64, 64}, {80, 80}, {128, 128}, {256, 256}, {3, 8}, {72, 67}, {200, 205}};
  const std::pair<int64_t, int64_t> lengths[] = {{5, 5}, {37, 37}, {129, 300}, {300, 129}, {1, 1000}, {2, 40}};
  int n = 0;
  for (auto [D, Dv] : dims)
    for (auto [Lq, Lkv] : lengths) {
      const int i = n++;
      const int64_t group = Lq <= 2 ? (Lq == 1 ? 8 : 4) : i % 3 == 0 ? 4 : 1;  // decode-sized Lq: enough heads for a job of 8
      const bool causal = i % 2 == 0;
      const int mask = causal ? 0 : 1 + (i / 2) % 2;
      const int64_t window = causal && i % 4 == 0 ? std::max<int64_t>(Lkv / 3, 1) : 0;
      check({D, Dv, Lq, Lkv, 1, group, causal, mask, window, i % 5 == 1});
    }
}

TEST(FlashAmx, TheChoiceSaysWhichKernelRuns) {
  const Tensor q = randn({1, 8, 37, 64}).to(DType::bf16), k = randn({1, 8, 37, 64}).to(DType::bf16);
  const std::string reason = sdpa_choose(q, k, {}, 0.0).reason;
  if (reason.find("AMX") == std::string::npos) GTEST_SKIP() << "no AMX on this CPU (or SINTER_AMX=0): " << reason;
  EXPECT_NE(reason.find("forward and backward on AMX"), std::string::npos) << reason;
  // decode (at most 4 query rows per kv head): the forward stays on the kernel that reads the cache in place
  const std::string decode = sdpa_choose(randn({1, 8, 1, 64}).to(DType::bf16), randn({1, 2, 300, 64}).to(DType::bf16), {}, 0.0).reason;
  EXPECT_NE(decode.find("the forward reads K and V in place"), std::string::npos) << decode;
  EXPECT_EQ(sdpa_choose(q.to(DType::f32), k.to(DType::f32), {}, 0.0).reason.find("AMX"), std::string::npos);
}

}  // namespace
}  // namespace sinter

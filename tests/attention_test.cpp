// Flash against math through the public API: the sweep of the flash-attention issue (head dims
// 32/64/80/128; lengths 1, 7, 129, 1000, not multiples of the tile; Lq != Lkv; causal or not;
// boolean and additive masks; GQA 1/4/8; sliding windows; dropout, the same Philox mask both
// ways), forward and backward; head dims that are no multiple of the vector width. Error:
// max |flash - math| / max(max |math|, 1), per tensor: relative for values of the inputs' unit
// scale, absolute near 0 (with one visible key dq and dk are 0 in theory, and each backend leaves
// ~1e-6 of rounding in dP - delta, which cancels exactly in exact arithmetic).
#include <cmath>
#include <sstream>

#include "test_util.h"

namespace sinter {
namespace {

double rel_err(const Tensor& a, const Tensor& b) {
  const Tensor a64 = a.to(DType::f64), b64 = b.to(DType::f64);
  const double den = max(abs(b64)).item_double();
  return max(abs(a64 - b64)).item_double() / std::max(den, 1.0);
}

struct SweepCase {
  int64_t D, Lq, Lkv, Hkv, group;
  bool causal;
  int mask;  // 0 none, 1 boolean (B, 1, Lq, Lkv), 2 additive (Lq, Lkv)
  int64_t window;
  double dropout;
  int64_t Dv = 0;  // v's head dim: D where 0
  std::string name() const {
    std::ostringstream s;
    s << "D=" << D << (Dv ? " Dv=" + std::to_string(Dv) : "") << " Lq=" << Lq << " Lkv=" << Lkv << " GQA " << group << ":1" << (causal ? " causal" : "")
      << (mask == 1 ? " bool mask" : mask == 2 ? " additive mask" : "") << (window ? " window=" + std::to_string(window) : "")
      << (dropout > 0 ? " dropout=" + std::to_string(dropout) : "");
    return s.str();
  }
};

struct Outputs {
  Tensor o, dq, dk, dv;
};

Outputs run(const SweepCase& c, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, const Tensor& dout,
            SDPABackend backend) {
  Tensor qq = q.detach().requires_grad_(), kk = k.detach().requires_grad_(), vv = v.detach().requires_grad_();
  manual_seed(1234);  // the same generator state: the same dropout reservation both ways
  Tensor o = scaled_dot_product_attention(qq, kk, vv, mask, c.dropout, c.causal, {}, c.group > 1, backend, c.window);
  auto g = autograd::grad({sum(o * dout)}, {qq, kk, vv});
  return {o.detach(), g[0], g[1], g[2]};
}

void check(const SweepCase& c, double tol = 1e-5) {
  SCOPED_TRACE(c.name());
  manual_seed(uint64_t(c.D * 7 + c.Lq * 13 + c.Lkv));
  const int64_t B = 2, Hq = c.Hkv * c.group;
  const int64_t Dv = c.Dv ? c.Dv : c.D;
  Tensor q = randn({B, Hq, c.Lq, c.D}), k = randn({B, c.Hkv, c.Lkv, c.D}), v = randn({B, c.Hkv, c.Lkv, Dv});
  EXPECT_EQ(sdpa_choose(q, k, {}, 0.0).backend, SDPABackend::flash) << "head dims " << c.D << "/" << Dv;
  Tensor mask;
  if (c.mask == 1) {
    mask = lt(rand({B, 1, c.Lq, c.Lkv}), full({}, 0.8));  // true: attend
    if (c.Lq > 2) mask.narrow(2, 1, 1).fill_(0.0);      // a row that sees nothing: 0 both ways
  } else if (c.mask == 2) {
    mask = randn({c.Lq, c.Lkv}) * 2.0;
  }
  Tensor dout = randn({B, Hq, c.Lq, Dv});
  const Outputs f = run(c, q, k, v, mask, dout, SDPABackend::flash), m = run(c, q, k, v, mask, dout, SDPABackend::math);
  EXPECT_LE(rel_err(f.o, m.o), tol) << "output";
  EXPECT_LE(rel_err(f.dq, m.dq), tol) << "dq";
  EXPECT_LE(rel_err(f.dk, m.dk), tol) << "dk";
  EXPECT_LE(rel_err(f.dv, m.dv), tol) << "dv";
  if (c.dropout > 0) {  // the mask really dropped something: without it the outputs differ
    const Outputs plain = run(SweepCase{c.D, c.Lq, c.Lkv, c.Hkv, c.group, c.causal, c.mask, c.window, 0.0, c.Dv}, q, k, v, mask, dout,
                              SDPABackend::flash);
    EXPECT_GT(rel_err(plain.o, f.o), 1e-3);
  }
}

TEST(FlashSweep, HeadDimsLengthsAndLayouts) {
  // Every head dim against every length pair; the features rotate so each meets each head dim.
  const int64_t dims[] = {32, 64, 80, 128};
  const std::pair<int64_t, int64_t> lengths[] = {{1, 1}, {7, 7}, {129, 129}, {1, 1000}, {7, 129}, {129, 7}, {129, 1000}, {1000, 1000}};
  const int64_t groups[] = {1, 4, 8};
  int n = 0;
  for (int64_t D : dims)
    for (auto [Lq, Lkv] : lengths) {
      const int i = n++;
      const int64_t group = groups[i % 3], Hkv = Lq * Lkv >= 1000 * 1000 ? 1 : 2;
      const bool causal = i % 2 == 0;
      const int mask = causal ? 0 : 1 + (i / 2) % 2;
      const int64_t window = causal && i % 4 == 0 ? std::max<int64_t>(Lkv / 3, 1) : 0;
      const double dropout = i % 3 == 1 ? 0.2 : 0.0;
      check({D, Lq, Lkv, Hkv, group, causal, mask, window, dropout});
    }
}

// Head dims that are no multiple of the vector width (nor of two of them), and v's head dim apart
// from q's: the fast kernels read the tails masked (forward) or pad them (backward). Decode rows
// (1-4 per KV head) across the 1024-key tiles, short and tiled prefill, masks and dropout.
TEST(FlashSweep, EveryHeadDimRunsTheFastKernel) {
  const int64_t dims[] = {3, 16, 20, 40, 72, 96, 112, 200};
  const std::pair<int64_t, int64_t> lengths[] = {{1, 1030}, {2, 40}, {37, 37}, {129, 200}};
  int n = 0;
  for (int64_t D : dims)
    for (auto [Lq, Lkv] : lengths) {
      const int i = n++;
      const int64_t Dv = i % 3 == 0 ? D + 5 : i % 3 == 1 ? std::max<int64_t>(D - 1, 1) : D;
      const int64_t group = i % 2 == 0 ? 4 : 1;
      const bool causal = i % 4 < 2;
      const int mask = causal ? 0 : 1 + (i / 4) % 2;
      check({D, Lq, Lkv, 2, group, causal, mask, 0, i % 5 == 2 ? 0.2 : 0.0, Dv});
    }
}

TEST(FlashSweep, EveryFeatureOnBothPaths) {
  // Explicit combinations: GQA 8 with a boolean mask and dropout, a window with dropout, an
  // additive mask on a decode row, causal with Lq > Lkv (rows that see nothing).
  check({64, 129, 129, 1, 8, false, 1, 0, 0.1});
  check({128, 1000, 1000, 1, 1, true, 0, 300, 0.3});
  check({80, 1, 1000, 2, 4, false, 2, 0, 0.0});
  check({32, 129, 7, 2, 1, true, 0, 0, 0.0});
  check({16, 7, 129, 1, 4, false, 2, 0, 0.5});
  // decode rows (1-4 query rows per KV head) across the 1024-key decode tiles
  check({64, 1, 1500, 1, 3, false, 2, 0, 0.1});
  check({32, 1, 2100, 2, 2, true, 0, 1100, 0.0});
  check({128, 2, 1030, 1, 2, true, 0, 0, 0.0});
}

TEST(FlashSweep, Bf16InputsAccumulateInF32) {
  manual_seed(5);
  const int64_t D = 64, L = 129;
  Tensor q = randn({1, 8, L, D}).to(DType::bf16), k = randn({1, 2, L, D}).to(DType::bf16), v = randn({1, 2, L, D}).to(DType::bf16);
  EXPECT_EQ(sdpa_choose(q, k, {}, 0.0).backend, SDPABackend::flash);
  Tensor qq = q.detach().requires_grad_(), kk = k.detach().requires_grad_();
  Tensor o = scaled_dot_product_attention(qq, kk, v, {}, 0.0, true, {}, true, SDPABackend::flash);
  EXPECT_EQ(o.dtype(), DType::bf16);
  // The f32 math backend on the same (bf16-rounded) values: within bf16's rounding of the output.
  Tensor q32 = q.to(DType::f32).requires_grad_(), k32 = k.to(DType::f32).requires_grad_();
  Tensor ref = scaled_dot_product_attention(q32, k32, v.to(DType::f32), {}, 0.0, true, {}, true, SDPABackend::math);
  EXPECT_LE(rel_err(o, ref), 8e-3);
  Tensor dout = randn(o.shape());
  auto g = autograd::grad({sum(o.to(DType::f32) * dout)}, {qq, kk});
  auto gr = autograd::grad({sum(ref * dout)}, {q32, k32});
  EXPECT_EQ(g[0].dtype(), DType::bf16);
  EXPECT_LE(rel_err(g[0], gr[0]), 2e-2);
  EXPECT_LE(rel_err(g[1], gr[1]), 2e-2);
}

// q, k, v as a model makes them: heads of one packed (B, L, (Hq + 2 Hkv) D) projection, transposed
// to (B, H, L, D) views (rows (Hq + 2 Hkv) D apart), and an output gradient that is a transposed
// view too. The kernels read and write them where they lie; flash against math, forward and
// backward, on the f32 kernels (D = 64; D = 80, a tail where a register holds 16 floats), f64 and bf16.
TEST(FlashSweep, StridedOperandsFromAPackedProjection) {
  struct Case {
    int64_t D, L, Hkv, group;
    bool causal;
    DType dt;
    double tol;
  };
  for (const Case& c : {Case{64, 129, 2, 2, true, DType::f32, 1e-5}, Case{64, 1, 1, 4, false, DType::f32, 1e-5},
                        Case{80, 70, 2, 1, true, DType::f32, 1e-5}, Case{32, 45, 1, 3, false, DType::f64, 1e-10},
                        Case{64, 66, 2, 2, true, DType::bf16, 2e-2}}) {
    SCOPED_TRACE("D=" + std::to_string(c.D) + " L=" + std::to_string(c.L) + " " + std::string(dtype_name(c.dt)));
    manual_seed(uint64_t(c.D + c.L));
    const int64_t B = 2, Hq = c.Hkv * c.group, W = (Hq + 2 * c.Hkv) * c.D;
    const Tensor x = randn({B, c.L, W}).to(c.dt), w = randn({B, c.L, Hq * c.D});
    auto heads = [&](const Tensor& t, int64_t at, int64_t h) { return t.narrow(2, at * c.D, h * c.D).reshape({B, c.L, h, c.D}).transpose(1, 2); };
    auto run = [&](SDPABackend backend, bool packed) {
      Tensor xx = x.detach().requires_grad_();
      Tensor q = heads(xx, 0, Hq), k = heads(xx, Hq, c.Hkv), v = heads(xx, Hq + c.Hkv, c.Hkv);
      if (!packed) q = q.contiguous(), k = k.contiguous(), v = v.contiguous();
      Tensor o = scaled_dot_product_attention(q, k, v, {}, 0.0, c.causal, {}, c.group > 1, backend);
      Tensor y = o.transpose(1, 2).reshape({B, c.L, Hq * c.D});  // the output projection's input
      return std::pair{o.detach(), autograd::grad({sum(y.to(DType::f32) * w)}, {xx})[0]};
    };
    const auto [fo, fg] = run(SDPABackend::flash, true);
    const auto [mo, mg] = run(SDPABackend::math, false);
    EXPECT_FALSE(heads(x, 0, Hq).is_contiguous());
    EXPECT_LE(rel_err(fo, mo), c.tol) << "output";
    EXPECT_LE(rel_err(fg, mg), c.tol) << "gradient of the packed projection";
  }
}

TEST(FlashSweep, ChoiceAndErrors) {
  manual_seed(6);
  Tensor q = randn({1, 4, 9, 32}), k = randn({1, 2, 9, 32});
  Tensor bool_mask = lt(rand({9, 9}), full({}, 0.5)), add_mask = randn({1, 1, 9, 9});
  // masks and dropout now run on flash; a mask that wants a gradient goes to math, saying why
  EXPECT_EQ(sdpa_choose(q, k, bool_mask, 0.1).backend, SDPABackend::flash);
  EXPECT_EQ(sdpa_choose(q, k, add_mask, 0.0).backend, SDPABackend::flash);  // measured faster at every length
  EXPECT_EQ(sdpa_choose(q.to(DType::f64), k.to(DType::f64), add_mask, 0.0).backend, SDPABackend::math);  // no fast f64 kernel
  Tensor wants_grad = add_mask.detach().requires_grad_();
  const SDPAChoice c = sdpa_choose(q, k, wants_grad, 0.0);
  EXPECT_EQ(c.backend, SDPABackend::math);
  EXPECT_NE(c.reason.find("requires grad"), std::string::npos) << c.reason;
  EXPECT_TRUE(test::throws_naming("sdpa", [&] {
    scaled_dot_product_attention(q, k, k, randn({9, 8}), 0.0, false, {}, true);  // does not broadcast
  }));
  EXPECT_TRUE(test::throws_naming("sdpa", [&] { scaled_dot_product_attention(q, k, k, {}, 1.0, false, {}, true); }));
}

// An additive mask over a few hundred keys (where the two backends are closest on AVX2 CPUs):
// the automatic call computes what flash does, forward and backward, and math agrees.
TEST(FlashSweep, AnAdditiveMaskOverAFewHundredKeysMatchesMath) {
  manual_seed(11);
  const int64_t L = 200;
  Tensor q = randn({1, 2, L, 64}), k = randn({1, 2, L, 64}), v = randn({1, 2, L, 64}), m = randn({1, 1, L, L});
  EXPECT_EQ(sdpa_choose(q, k, m, 0.0).backend, SDPABackend::flash);
  Tensor dout = randn({1, 2, L, 64});
  auto run = [&](SDPABackend b) {
    Tensor qq = q.detach().requires_grad_(), kk = k.detach().requires_grad_(), vv = v.detach().requires_grad_();
    Tensor o = scaled_dot_product_attention(qq, kk, vv, m, 0.0, false, {}, false, b);
    auto g = autograd::grad({sum(o * dout)}, {qq, kk, vv});
    return std::vector<Tensor>{o, g[0], g[1], g[2]};
  };
  const auto a = run(SDPABackend::automatic), flash = run(SDPABackend::flash), math = run(SDPABackend::math);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(test::bitwise_equal(a[i], flash[i])) << "output " << i;
    EXPECT_LE(rel_err(a[i], math[i]), 1e-5) << "output " << i;
  }
}

// Decode on bf16 (at most 4 query rows per kv head): K and V are read where they lie, widened as
// they are loaded, instead of copied to f32 first. The f32 kernel on the widened tensors is the
// reference, bit for bit: the same f32 arithmetic on the same values. Head dims with a tail of a
// register, a KV cache filled part way (kv_len), GQA 4:1 and 2:1, causal or an additive mask.
TEST(FlashSweep, Bf16DecodeReadsTheCacheInPlaceAsTheF32KernelDoes) {
  manual_seed(8);
  struct Case {
    int64_t D, Lq, Hkv, group, n;
    bool mask;
  };
  for (const Case& c : {Case{64, 1, 4, 1, 1500, false}, Case{40, 1, 2, 4, 700, true}, Case{72, 2, 2, 2, 333, false},
                        Case{16, 1, 1, 3, 1025, true}, Case{128, 4, 1, 1, 90, false}}) {
    SCOPED_TRACE("D=" + std::to_string(c.D) + " Lq=" + std::to_string(c.Lq) + " group=" + std::to_string(c.group));
    const int64_t B = 2, Hq = c.Hkv * c.group, cap = c.n + 37;
    const Tensor q = randn({B, Hq, c.Lq, c.D}).to(DType::bf16);
    const Tensor kc = randn({B, c.Hkv, cap, c.D}).to(DType::bf16), vc = randn({B, c.Hkv, cap, c.D}).to(DType::bf16);
    const Tensor mask = c.mask ? randn({1, 1, c.Lq, cap}) : Tensor();
    const Tensor kv_len = full({}, double(c.n), DType::i64);
    const Tensor o = scaled_dot_product_attention(q, kc, vc, mask, 0.0, !c.mask, {}, c.group > 1, SDPABackend::flash, 0, kv_len);
    const Tensor ref = scaled_dot_product_attention(q.to(DType::f32), kc.to(DType::f32), vc.to(DType::f32), mask, 0.0, !c.mask, {},
                                                   c.group > 1, SDPABackend::flash, 0, kv_len);
    ASSERT_EQ(o.dtype(), DType::bf16);
    EXPECT_TRUE(test::bitwise_equal(o, ref.to(DType::bf16)));
    // and within bf16's rounding of the f64 math on the same values (the cache's first n positions)
    const Tensor math = scaled_dot_product_attention(q.to(DType::f64), kc.narrow(2, 0, c.n).to(DType::f64), vc.narrow(2, 0, c.n).to(DType::f64),
                                                    c.mask ? mask.narrow(3, 0, c.n).to(DType::f64) : Tensor(), 0.0, !c.mask, {}, c.group > 1,
                                                    SDPABackend::math);
    EXPECT_LE(rel_err(o, math), 8e-3);
  }
}

}  // namespace
}  // namespace sinter

// Specs for the attention ops: sdpa (the flash kernels against a plain softmax(q k^T) v) and its
// fused backward (see op_specs.h).
#include <algorithm>
#include <cmath>

#include "op_specs.h"

namespace sinter::test {
using namespace spec;

void add_attention_specs(std::map<std::string, Spec>& m) {
  struct AttnShape { Shape q, kv; bool causal; double scale; };
  const std::vector<AttnShape> attn_shapes{
      {{1, 2, 5, 4}, {1, 2, 5, 4}, false, 0.5},   {{2, 4, 7, 8}, {2, 2, 7, 8}, true, 0.35},
      {{1, 4, 3, 16}, {1, 1, 9, 16}, true, 0.25},  {{1, 1, 1, 8}, {1, 1, 70, 8}, true, 0.3},
      {{1, 2, 40, 8}, {1, 2, 40, 8}, true, 0.3},   {{1, 1, 70, 4}, {1, 1, 130, 4}, false, 0.5},
      {{1, 1, 6, 4}, {1, 1, 3, 4}, true, 0.5},     {{1, 1, 0, 4}, {1, 1, 3, 4}, false, 0.5},
      // head dims the register-blocked f32 kernel takes, lengths across several 64-wide tiles
      {{1, 2, 70, 32}, {1, 1, 130, 32}, true, 0.2}, {{2, 2, 65, 64}, {2, 2, 65, 64}, false, 0.125},
      {{1, 4, 1, 32}, {1, 1, 100, 32}, true, 0.2},  {{1, 1, 130, 16}, {1, 1, 130, 16}, true, 0.25}};
  auto attn_attrs = [](bool causal, double scale, int64_t window = 0) {
    Attrs a{{"causal", causal}, {"scale", scale}};
    if (window > 0) a.set("window", window);
    return a;
  };
  // sdpa's attrs: the geometry's, the backend, which optional inputs come.
  auto sdpa_attrs = [attn_attrs](bool causal, double scale, int64_t window, bool mask, const char* backend, bool kv_len = false) {
    Attrs a = attn_attrs(causal, scale, window);
    a.set("gqa", true), a.set("backend", std::string(backend)), a.set("mask", mask), a.set("kv_len", kv_len);
    return a;
  };
  // Visible keys [first, lim) of query row i: causal masks align to the bottom right; a sliding
  // window keeps the last `window` of them.
  auto visible = [](int64_t i, int64_t Lq, int64_t Lkv, const Attrs& a) {
    const int64_t lim = a.b("causal") ? std::clamp<int64_t>(i + Lkv - Lq + 1, 0, Lkv) : Lkv;
    const int64_t w = a.has("window") ? a.i("window") : 0;
    return std::pair<int64_t, int64_t>{w > 0 ? std::clamp<int64_t>(lim - w, 0, lim) : 0, lim};
  };
  // The additive mask's value at (b, h, i, j) (4-D, broadcast over its size-1 dims), 0 without one;
  // the dropout multiplier there, as the dropout op draws element ((b Hq + h) Lq + i) Lkv + j.
  auto mask_at = [](const std::vector<R>& in, size_t at_input, int64_t b, int64_t h, int64_t i, int64_t j) {
    if (in.size() <= at_input) return 0.0;
    const R& m = in[at_input];
    if (m.shape.empty()) return 0.0;  // sdpa's kv_len, not a mask
    const std::vector<int64_t> idx{b, h, i, j};
    std::vector<int64_t> mi(4);
    for (size_t d = 0; d < 4; ++d) mi[d] = m.shape[d] == 1 ? 0 : idx[d];
    const double v = at(m, mi);
    return m.dtype == DType::boolean ? (v != 0 ? 0.0 : -INFINITY) : v;
  };
  auto keep_at = [](const Attrs& a, int64_t b, int64_t h, int64_t i, int64_t j, int64_t Hq, int64_t Lq, int64_t Lkv) {
    if (!a.has("dropout_p")) return 1.0;
    const double p = a.f("dropout_p");
    const uint64_t e = uint64_t(((b * Hq + h) * Lq + i) * Lkv + j);
    return philox_uniform(uint64_t(a.i("seed")), uint64_t(a.i("counter")), e) >= float(p) ? 1.0 / (1.0 - p) : 0.0;
  };
  auto with_dropout = [](Attrs a, double p, int64_t seed, int64_t counter) {
    a.set("dropout_p", p), a.set("seed", seed), a.set("counter", counter);
    return a;
  };
  Spec fl;
  // Every case on both backends: flash (the register-blocked kernel where the head dims allow, the
  // generic one elsewhere) and math (the reference in ops), plus the kernel's own choice.
  auto sdpa_cases = [attn_shapes, sdpa_attrs, with_dropout](const char* backend) {
    auto attn_attrs = [&](bool causal, double scale, int64_t window = 0) { return sdpa_attrs(causal, scale, window, false, backend); };
    auto masked = [&](bool causal, double scale) { return sdpa_attrs(causal, scale, 0, true, backend); };
    std::vector<Case> c;
    for (auto& a : attn_shapes) c.push_back({{rn(a.q), rn(a.kv), rn(a.kv)}, attn_attrs(a.causal, a.scale)});
    c.push_back({{rn({1, 2, 9, 4}, DType::f64), rn({1, 1, 9, 4}, DType::f64), rn({1, 1, 9, 4}, DType::f64)}, attn_attrs(true, 0.5)});
    // sliding windows: generic path (D = 8) and the fast kernel across tiles, with GQA
    c.push_back({{rn({1, 1, 40, 8}), rn({1, 1, 40, 8}), rn({1, 1, 40, 8})}, attn_attrs(true, 0.3, 5)});
    c.push_back({{rn({1, 2, 150, 32}), rn({1, 1, 170, 32}), rn({1, 1, 170, 32})}, attn_attrs(true, 0.2, 70)});
    c.push_back({{rn({1, 4, 1, 32}), rn({1, 1, 100, 32}), rn({1, 1, 100, 32})}, attn_attrs(true, 0.2, 9)});
    // additive masks (broadcast over batch, heads or rows; f32 with f64 inputs) on both paths
    c.push_back({{rn({2, 2, 7, 8}), rn({2, 1, 9, 8}), rn({2, 1, 9, 8}), rn({1, 2, 7, 9})}, masked(false, 0.4)});
    c.push_back({{rn({1, 4, 70, 32}), rn({1, 2, 130, 32}), rn({1, 2, 130, 32}), rn({1, 1, 70, 130})}, masked(false, 0.2)});
    c.push_back({{rn({1, 2, 3, 16}), rn({1, 2, 80, 16}), rn({1, 2, 80, 16}), rn({2, 1, 80}).reshape({1, 2, 1, 80})}, masked(false, 0.25)});
    c.push_back({{rn({1, 1, 5, 4}, DType::f64), rn({1, 1, 6, 4}, DType::f64), rn({1, 1, 6, 4}, DType::f64), rn({1, 1, 5, 6})},
                 masked(false, 0.5)});
    // a boolean mask (true = keep), with a row that keeps nothing: 0 and lse -inf
    Tensor keep = bools({1, 2, 6, 70});
    keep.narrow(2, 2, 1).fill_(0.0);
    c.push_back({{rn({1, 2, 6, 32}), rn({1, 2, 70, 32}), rn({1, 2, 70, 32}), keep}, masked(false, 0.3)});
    // a row masked everywhere: 0 and lse -inf
    Tensor mask = rn({1, 1, 6, 70});
    mask.narrow(2, 2, 1).fill_(-INFINITY);
    c.push_back({{rn({1, 2, 6, 32}), rn({1, 2, 70, 32}), rn({1, 2, 70, 32}), mask}, masked(false, 0.3)});
    // dropout, alone and with a window, GQA and a mask, generic and fast paths
    c.push_back({{rn({1, 2, 9, 8}), rn({1, 1, 11, 8}), rn({1, 1, 11, 8})}, with_dropout(attn_attrs(true, 0.4), 0.3, 11, 5)});
    c.push_back({{rn({1, 4, 70, 32}), rn({1, 2, 130, 32}), rn({1, 2, 130, 32})}, with_dropout(attn_attrs(true, 0.2, 40), 0.2, 3, 7)});
    c.push_back({{rn({2, 2, 33, 16}), rn({2, 2, 65, 16}), rn({2, 2, 65, 16}), rn({2, 1, 33, 65})},
                 with_dropout(masked(false, 0.25), 0.5, 9, 0)});
    // a KV cache of 100 positions filled to kv_len: a decode row and a chunk of 5 (causal aligns to kv_len)
    c.push_back({{rn({1, 4, 1, 32}), rn({1, 1, 100, 32}), rn({1, 1, 100, 32}), full({}, 37.0, DType::i64)},
                 sdpa_attrs(true, 0.2, 0, false, backend, true)});
    c.push_back({{rn({1, 2, 5, 8}, DType::f64), rn({1, 2, 20, 8}, DType::f64), rn({1, 2, 20, 8}, DType::f64), full({}, 9.0, DType::i64)},
                 sdpa_attrs(true, 0.4, 0, false, backend, true)});
    return c;
  };
  fl.cases = [sdpa_cases] {
    std::vector<Case> c;
    for (const char* backend : {"auto", "flash", "math"})
      for (Case& k : sdpa_cases(backend)) c.push_back(k);
    return c;
  };
  fl.ref = [visible, mask_at, keep_at](const std::vector<R>& in, const Attrs& a) {
    const R &q = in[0], &k = in[1], &v = in[2];
    const int64_t B = q.shape[0], Hq = q.shape[1], Lq = q.shape[2], D = q.shape[3], Hkv = k.shape[1], Lkv0 = k.shape[2];
    const int64_t Lkv = a.b("kv_len") ? int64_t(in.back().v[0]) : Lkv0;  // keys past kv_len do not exist
    const double scale = a.f("scale");
    R o{q.shape, std::vector<double>(q.v.size()), q.dtype};
    R lse{{B, Hq, Lq}, std::vector<double>(size_t(B * Hq * Lq)), q.dtype == DType::f64 ? DType::f64 : DType::f32};
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < Hq; ++h)
        for (int64_t i = 0; i < Lq; ++i) {
          const int64_t hk = h / (Hq / Hkv);
          const auto [first, lim] = visible(i, Lq, Lkv, a);
          std::vector<double> sc;
          double mx = -INFINITY, z = 0;
          for (int64_t j = first; j < lim; ++j) {
            double d = 0;
            for (int64_t e = 0; e < D; ++e) d += at(q, {b, h, i, e}) * at(k, {b, hk, j, e});
            sc.push_back(d * scale + mask_at(in, 3, b, h, i, j));
            mx = std::max(mx, sc.back());
          }
          const bool empty = mx == -INFINITY;  // nothing visible: 0, lse -inf
          for (double x : sc) z += empty ? 0.0 : std::exp(x - mx);
          const double l = empty ? -INFINITY : mx + std::log(z);
          lse.v[size_t((b * Hq + h) * Lq + i)] = l;
          for (int64_t e = 0; e < D; ++e) {
            double acc = 0;
            for (int64_t j = first; j < lim && !empty; ++j)
              acc += std::exp(sc[size_t(j - first)] - l) * keep_at(a, b, h, i, j, Hq, Lq, Lkv0) * at(v, {b, hk, j, e});
            o.v[size_t(((b * Hq + h) * Lq + i) * D + e)] = acc;
          }
        }
    return std::vector<R>{o, lse};
  };
  fl.bad = [sdpa_attrs, with_dropout] {
    auto plain = [&](bool causal, double scale, int64_t window = 0) { return sdpa_attrs(causal, scale, window, false, "auto"); };
    Attrs no_gqa = plain(false, 1.0);
    no_gqa.set("gqa", false);
    Attrs bad_backend = plain(false, 1.0);
    bad_backend.set("backend", std::string("fast"));
    return std::vector<Case>{{{rn({1, 2, 3, 4}), rn({1, 2, 3, 5}), rn({1, 2, 3, 5})}, plain(false, 1.0)},
                             {{rn({1, 1, 3, 4}), rn({1, 1, 3, 4}), rn({1, 1, 3, 4})}, plain(false, 1.0, 2)},
                             {{rn({1, 3, 3, 4}), rn({1, 2, 3, 4}), rn({1, 2, 3, 4})}, plain(false, 1.0)},
                             {{rn({1, 4, 3, 4}), rn({1, 2, 3, 4}), rn({1, 2, 3, 4})}, no_gqa},
                             {{rn({3, 3, 4}), rn({3, 3, 4}), rn({3, 3, 4})}, plain(false, 1.0)},
                             {{ints({1, 1, 2, 2}, 0, 3), ints({1, 1, 2, 2}, 0, 3), ints({1, 1, 2, 2}, 0, 3)}, plain(false, 1.0)},
                             {{rn({1, 1, 2, 2}), rn({1, 1, 2, 2}, DType::f64), rn({1, 1, 2, 2})}, plain(false, 1.0)},
                             {{rn({1, 1, 3, 4}), rn({1, 1, 5, 4}), rn({1, 1, 5, 4}), rn({1, 1, 4, 5})}, sdpa_attrs(false, 1.0, 0, true, "auto")},
                             {{rn({1, 1, 3, 4}), rn({1, 1, 5, 4}), rn({1, 1, 5, 4}), ints({1, 1, 3, 5}, 0, 2)}, sdpa_attrs(false, 1.0, 0, true, "auto")},
                             {{rn({1, 1, 3, 4}), rn({1, 1, 5, 4}), rn({1, 1, 5, 4})}, with_dropout(plain(false, 1.0), 1.0, 0, 0)},
                             {{rn({1, 1, 3, 4}), rn({1, 1, 5, 4}), rn({1, 1, 5, 4})}, bad_backend},
                             {{rn({1, 1, 3, 4}), rn({1, 1, 5, 4}), rn({1, 1, 5, 4})}, sdpa_attrs(false, 1.0, 0, true, "auto")},
                             {{rn({1, 1, 1, 4}), rn({1, 1, 5, 4}), rn({1, 1, 5, 4}), full({1}, 3.0, DType::i64)}, sdpa_attrs(true, 1.0, 0, false, "auto", true)},
                             {{rn({1, 1, 1, 4}), rn({1, 1, 5, 4}), rn({1, 1, 5, 4}), full({}, 9.0, DType::i64)}, sdpa_attrs(true, 1.0, 0, false, "auto", true)}};
  };
  fl.grad_cases = [sdpa_attrs, with_dropout] {  // both backends' backward: flash's kernel and math's autograd
    std::vector<Case> c;
    for (const char* be : {"flash", "math"}) {
      auto attn_attrs = [&](bool causal, double scale, int64_t window = 0) { return sdpa_attrs(causal, scale, window, false, be); };
      for (Case& k : small_f64({{{rn({1, 2, 3, 4}), rn({1, 1, 5, 4}), rn({1, 1, 5, 4})}, attn_attrs(true, 0.5)},
                                {{rn({1, 2, 4, 3}), rn({1, 2, 4, 3}), rn({1, 2, 4, 3})}, attn_attrs(false, 0.6)},
                                {{rn({1, 1, 5, 3}), rn({1, 1, 5, 3}), rn({1, 1, 5, 3})}, attn_attrs(true, 0.6, 2)},
                                {{rn({1, 2, 4, 3}), rn({1, 1, 5, 3}), rn({1, 1, 5, 3})}, with_dropout(attn_attrs(true, 0.6), 0.4, 2, 1)}}))
        c.push_back(k);
      // an additive mask (f32: a constant here, the f64 inputs are differentiated)
      c.push_back({{rn({1, 2, 3, 3}, DType::f64), rn({1, 1, 4, 3}, DType::f64), rn({1, 1, 4, 3}, DType::f64), rn({1, 2, 3, 4})},
                   with_dropout(sdpa_attrs(false, 0.6, 0, true, be), 0.25, 4, 3)});
    }
    return c;
  };
  m["sdpa"] = fl;

  Spec fb;
  auto backward_case = [sdpa_attrs, with_dropout](const Shape& qs, const Shape& kvs, bool causal, double scale, DType dt,
                                                   int64_t window = 0, Shape mask_shape = {}, double dropout = 0) {
    Tensor q = rn(qs, dt), k = rn(kvs, dt), v = rn(kvs, dt);
    Attrs a = sdpa_attrs(causal, scale, window, !mask_shape.empty(), "flash");
    if (dropout > 0) a = with_dropout(a, dropout, 17, 2);
    std::vector<Tensor> in{q, k, v};
    if (!mask_shape.empty()) in.push_back(rn(mask_shape, dt));
    auto fwd = call(get_op("sdpa"), in, a);
    Case c{{q, k, v, fwd[0], fwd[1], rn(fwd[0].shape(), dt), rn(fwd[1].shape(), dt)}, a};
    if (!mask_shape.empty()) c.in.push_back(in[3]);
    return c;
  };
  fb.cases = [backward_case] {
    return std::vector<Case>{backward_case({1, 2, 5, 4}, {1, 2, 5, 4}, false, 0.5, DType::f32),
                             backward_case({2, 4, 7, 8}, {2, 2, 7, 8}, true, 0.35, DType::f32),
                             backward_case({1, 4, 3, 16}, {1, 1, 9, 16}, true, 0.25, DType::f32),
                             backward_case({1, 2, 40, 8}, {1, 2, 70, 8}, true, 0.3, DType::f32),
                             backward_case({1, 2, 6, 4}, {1, 1, 6, 4}, true, 0.5, DType::f64),
                             // the register-blocked f32 backward: several tiles, GQA, Lq != Lkv, decode row
                             backward_case({1, 4, 70, 32}, {1, 2, 130, 32}, true, 0.2, DType::f32),
                             backward_case({2, 2, 65, 64}, {2, 2, 65, 64}, false, 0.125, DType::f32),
                             backward_case({1, 2, 1, 32}, {1, 1, 80, 32}, true, 0.2, DType::f32),
                             backward_case({1, 1, 130, 16}, {1, 1, 100, 16}, true, 0.25, DType::f32),
                             // sliding windows, generic and fast paths
                             backward_case({1, 1, 40, 8}, {1, 1, 40, 8}, true, 0.3, DType::f32, 5),
                             backward_case({1, 2, 150, 32}, {1, 1, 170, 32}, true, 0.2, DType::f32, 70),
                             // masks and dropout, generic and fast paths
                             backward_case({1, 2, 7, 8}, {1, 1, 9, 8}, false, 0.3, DType::f32, 0, {1, 2, 7, 9}),
                             backward_case({1, 4, 70, 32}, {1, 2, 130, 32}, false, 0.2, DType::f32, 0, {1, 1, 70, 130}),
                             backward_case({1, 2, 9, 8}, {1, 1, 11, 8}, true, 0.4, DType::f32, 0, {}, 0.3),
                             backward_case({1, 4, 70, 32}, {1, 2, 130, 32}, true, 0.2, DType::f32, 40, {}, 0.2),
                             backward_case({2, 2, 33, 16}, {2, 2, 65, 16}, false, 0.25, DType::f32, 0, {2, 1, 33, 65}, 0.5)};
  };
  fb.ref = [visible, mask_at, keep_at](const std::vector<R>& in, const Attrs& a) {
    const R &q = in[0], &k = in[1], &v = in[2], &o = in[3], &lse = in[4], &dout = in[5], &dlse = in[6];
    const int64_t B = q.shape[0], Hq = q.shape[1], Lq = q.shape[2], D = q.shape[3], Hkv = k.shape[1], Lkv = k.shape[2];
    const double scale = a.f("scale");
    R dq{q.shape, std::vector<double>(q.v.size()), q.dtype}, dk{k.shape, std::vector<double>(k.v.size()), k.dtype},
        dv{v.shape, std::vector<double>(v.v.size()), v.dtype};
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < Hq; ++h)
        for (int64_t i = 0; i < Lq; ++i) {
          const int64_t hk = h / (Hq / Hkv);
          const auto [first, lim] = visible(i, Lq, Lkv, a);
          const double l = at(lse, {b, h, i});
          if (!std::isfinite(l)) continue;
          double delta = -at(dlse, {b, h, i});
          for (int64_t e = 0; e < D; ++e) delta += at(dout, {b, h, i, e}) * at(o, {b, h, i, e});
          for (int64_t j = first; j < lim; ++j) {
            double s = 0, dp = 0;
            for (int64_t e = 0; e < D; ++e) {
              s += at(q, {b, h, i, e}) * at(k, {b, hk, j, e});
              dp += at(dout, {b, h, i, e}) * at(v, {b, hk, j, e});
            }
            const double z = keep_at(a, b, h, i, j, Hq, Lq, Lkv);
            const double p = std::exp(s * scale + mask_at(in, 7, b, h, i, j) - l), ds = p * (dp * z - delta);
            for (int64_t e = 0; e < D; ++e) {
              dv.v[size_t(ravel({b, hk, j, e}, v.shape))] += p * z * at(dout, {b, h, i, e});
              dq.v[size_t(ravel({b, h, i, e}, q.shape))] += scale * ds * at(k, {b, hk, j, e});
              dk.v[size_t(ravel({b, hk, j, e}, k.shape))] += scale * ds * at(q, {b, h, i, e});
            }
          }
        }
    return std::vector<R>{dq, dk, dv};
  };
  fb.bad = [backward_case] {
    Case c = backward_case({1, 2, 5, 4}, {1, 2, 5, 4}, false, 0.5, DType::f32);
    Case wrong_o = c, wrong_dtype = c;
    wrong_o.in[3] = rn({1, 2, 4, 4});
    wrong_dtype.in[6] = rn({1, 2, 5}, DType::f64);
    return std::vector<Case>{wrong_o, wrong_dtype};
  };
  m["sdpa_flash_backward"] = fb;
}

}  // namespace sinter::test

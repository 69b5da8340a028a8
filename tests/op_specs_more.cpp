// Specs for shape, linalg, nn and index ops (see op_specs.h; attention: op_specs_attention.cpp).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "op_specs.h"

namespace sinter::test {
using namespace spec;
namespace {

Attrs dim_attr(int64_t d) { return {{"dim", d}}; }

// Builds an R of `shape` whose element at each index is f(index).
R build(const Shape& shape, DType dt, const std::function<double(const std::vector<int64_t>&)>& f) {
  R o{shape, std::vector<double>(size_t(shape.numel())), dt};
  for (int64_t i = 0; i < shape.numel(); ++i) o.v[size_t(i)] = f(unravel(i, shape));
  return o;
}

double matmul_elem(const R& a, const R& b, const std::vector<int64_t>& bi_a, const std::vector<int64_t>& bi_b, int64_t i,
                   int64_t j, int64_t K) {
  double s = 0;
  for (int64_t k = 0; k < K; ++k) {
    auto ia = bi_a, ib = bi_b;
    ia.push_back(i);
    ia.push_back(k);
    ib.push_back(k);
    ib.push_back(j);
    s += at(a, ia) * at(b, ib);
  }
  return s;
}

}  // namespace

void add_more_specs(std::map<std::string, Spec>& m) {
  // ---- views and copies ----
  Spec v;
  v.cases = [] {
    return std::vector<Case>{{{rn({3, 4})}, {{"shape", Shape{4, 3}}}},  {{rn({2, 3, 4})}, {{"shape", Shape{6, 4}}}},
                             {{rn({12})}, {{"shape", Shape{2, -1, 3}}}}, {{rn({})}, {{"shape", Shape{1, 1}}}},
                             {{rn({0, 4})}, {{"shape", Shape{4, 0}}}},   {{ints({6}, 0, 9)}, {{"shape", Shape{3, 2}}}}};
  };
  v.ref = [](const std::vector<R>& in, const Attrs& a) {
    Shape s = a.ints("shape");
    for (auto& d : s) if (d == -1) d = in[0].shape.numel() / -Shape(s).numel();
    return std::vector<R>{{s, in[0].v, in[0].dtype}};
  };
  v.bad = [] {
    return std::vector<Case>{{{rn({3, 4})}, {{"shape", Shape{5, 3}}}}, {{rn({3, 4})}, {{"shape", Shape{-1, -1}}}},
                             {{rn({4, 3}).t()}, {{"shape", Shape{12}}}}};
  };
  v.grad_cases = [v] { return small_f64(v.cases()); };
  m["view"] = v;

  Spec p;
  p.cases = [] {
    return std::vector<Case>{{{rn({2, 3, 4})}, {{"dims", Shape{2, 0, 1}}}}, {{rn({3, 4})}, {{"dims", Shape{1, 0}}}},
                             {{rn({})}, {{"dims", Shape{}}}},               {{rn({2, 0, 3})}, {{"dims", Shape{-1, 1, 0}}}},
                             {{ints({2, 3}, 0, 5)}, {{"dims", Shape{1, 0}}}}};
  };
  p.ref = [](const std::vector<R>& in, const Attrs& a) {
    const Shape& dims = a.ints("dims");
    const int64_t n = int64_t(dims.size());
    Shape os;
    for (int64_t d : dims) os.push_back(in[0].shape[size_t(wrap(d, n))]);
    return std::vector<R>{build(os, in[0].dtype, [&](const std::vector<int64_t>& idx) {
      std::vector<int64_t> src(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) src[size_t(wrap(dims[size_t(i)], n))] = idx[size_t(i)];
      return at(in[0], src);
    })};
  };
  p.bad = [] {
    return std::vector<Case>{{{rn({2, 3})}, {{"dims", Shape{0}}}}, {{rn({2, 3})}, {{"dims", Shape{0, 0}}}},
                             {{rn({2, 3})}, {{"dims", Shape{0, 2}}}}};
  };
  p.grad_cases = [p] { return small_f64(p.cases()); };
  m["permute"] = p;

  Spec s;
  auto slice_attrs = [](int64_t d, int64_t b, int64_t e, int64_t st) {
    return Attrs{{"dim", d}, {"start", b}, {"end", e}, {"step", st}};
  };
  s.cases = [slice_attrs] {
    return std::vector<Case>{{{rn({5, 4})}, slice_attrs(0, 1, 4, 1)},  {{rn({5, 7})}, slice_attrs(1, 1, 7, 3)},
                             {{rn({2, 9, 3})}, slice_attrs(-2, 0, 9, 2)}, {{rn({4})}, slice_attrs(0, 2, 2, 1)},
                             {{rn({6})}, slice_attrs(0, 5, 6, 4)},     {{ints({6}, 0, 9)}, slice_attrs(0, 0, 6, 2)}};
  };
  s.ref = [](const std::vector<R>& in, const Attrs& a) {
    const int64_t d = wrap(a.i("dim"), int64_t(in[0].shape.size())), b = a.i("start"), e = a.i("end"), st = a.i("step");
    Shape os = in[0].shape;
    os[size_t(d)] = (e - b + st - 1) / st;
    return std::vector<R>{build(os, in[0].dtype, [&](std::vector<int64_t> idx) {
      idx[size_t(d)] = b + idx[size_t(d)] * st;
      return at(in[0], idx);
    })};
  };
  s.bad = [slice_attrs] {
    return std::vector<Case>{{{rn({5})}, slice_attrs(0, 2, 9, 1)}, {{rn({5})}, slice_attrs(0, 0, 3, 0)},
                             {{rn({5})}, slice_attrs(1, 0, 3, 1)}, {{rn({})}, slice_attrs(0, 0, 0, 1)}};
  };
  s.grad_cases = [s] { return small_f64(s.cases()); };
  m["slice"] = s;

  Spec e;
  e.cases = [] {
    return std::vector<Case>{{{rn({3, 1})}, {{"shape", Shape{3, 4}}}},     {{rn({4})}, {{"shape", Shape{2, 3, 4}}}},
                             {{rn({1, 2, 1})}, {{"shape", Shape{2, -1, 3}}}}, {{rn({})}, {{"shape", Shape{0, 2}}}},
                             {{ints({1}, 0, 9)}, {{"shape", Shape{5}}}}};
  };
  e.ref = [](const std::vector<R>& in, const Attrs& a) {
    Shape os = a.ints("shape");
    const size_t off = os.size() - in[0].shape.size();
    for (size_t i = off; i < os.size(); ++i) if (os[i] == -1) os[i] = in[0].shape[i - off];
    return std::vector<R>{build(os, in[0].dtype, [&](const std::vector<int64_t>& idx) {
      std::vector<int64_t> src;
      for (size_t i = off; i < os.size(); ++i) src.push_back(in[0].shape[i - off] == 1 ? 0 : idx[i]);
      return at(in[0], src);
    })};
  };
  e.bad = [] {
    return std::vector<Case>{{{rn({3, 2})}, {{"shape", Shape{3, 4}}}}, {{rn({3})}, {{"shape", Shape{-1, 3}}}},
                             {{rn({2, 3})}, {{"shape", Shape{3}}}}};
  };
  e.grad_cases = [e] { return small_f64(e.cases()); };
  m["expand"] = e;

  Spec cp;
  cp.cases = [] {
    return std::vector<Case>{{{rn({3, 4}).t()}, {}}, {{rn({})}, {}}, {{rn({0, 3})}, {}}, {{ints({5}, 0, 3, DType::u8)}, {}},
                             {{rn({7}, DType::bf16)}, {}}};
  };
  cp.ref = [](const std::vector<R>& in, const Attrs&) { return std::vector<R>{in[0]}; };
  cp.bad = [] { return std::vector<Case>{{{rn({2}), rn({2})}, {}}}; };
  cp.grad_cases = [cp] { return small_f64(cp.cases()); };
  m["copy"] = cp;

  Spec ct;
  ct.cases = [] {
    return std::vector<Case>{{{rn({2, 3}), rn({4, 3})}, dim_attr(0)},
                             {{rn({2, 3}), rn({2, 1}), rn({2, 0})}, dim_attr(-1)},
                             {{rn({5})}, dim_attr(0)},
                             {{ints({2}, 0, 5, DType::i32), rn({3})}, dim_attr(0)},
                             {{rn({2, 2, 2}), rn({2, 3, 2})}, dim_attr(1)}};
  };
  ct.ref = [](const std::vector<R>& in, const Attrs& a) {
    const int64_t d = wrap(a.i("dim"), int64_t(in[0].shape.size()));
    Shape os = in[0].shape;
    os[size_t(d)] = 0;
    DType dt = in[0].dtype;
    for (auto& r : in) { os[size_t(d)] += r.shape[size_t(d)]; dt = promote_types(dt, r.dtype); }
    return std::vector<R>{build(os, dt, [&](std::vector<int64_t> idx) {
      for (auto& r : in) {
        if (idx[size_t(d)] < r.shape[size_t(d)]) return at(r, idx);
        idx[size_t(d)] -= r.shape[size_t(d)];
      }
      return double(NAN);
    })};
  };
  ct.bad = [] {
    return std::vector<Case>{{{rn({2, 3}), rn({2, 4})}, dim_attr(0)}, {{rn({2}), rn({2, 1})}, dim_attr(0)},
                             {{rn({}), rn({})}, dim_attr(0)}, {{rn({2})}, dim_attr(3)}};
  };
  ct.grad_cases = [] {
    return small_f64({{{rn({2, 3}), rn({4, 3})}, dim_attr(0)}, {{rn({2, 3}), rn({2, 1}), rn({2, 0})}, dim_attr(-1)}});
  };
  m["cat"] = ct;

  // ---- linear algebra ----
  Spec mm;
  mm.cases = [] {
    return std::vector<Case>{{{rn({4}), rn({4})}, {}},           {{rn({3}), rn({3, 5})}, {}},
                             {{rn({2, 3}), rn({3})}, {}},        {{rn({4, 3}), rn({3, 5})}, {}},
                             {{rn({2, 1, 3, 4}), rn({5, 4, 2})}, {}}, {{rn({3}), rn({2, 3, 4})}, {}},
                             {{rn({2, 3, 4}), rn({4})}, {}},     {{rn({3, 0}), rn({0, 2})}, {}},
                             {{rn({0, 3}), rn({3, 2})}, {}},     {{rn({5, 4}).t(), rn({6, 5}).t()}, {}},
                             {{rn({2, 6, 3}), rn({3, 4})}, {}},  {{ints({2, 3}, -3, 4), ints({3, 2}, -3, 4)}, {}},
                             // shared weights: transposed b folded into one GEMM; a batch that cannot fold
                             {{rn({2, 6, 3}), rn({4, 3}).t()}, {}}, {{rn({2, 3, 6}).transpose(1, 2), rn({3, 4})}, {}},
                             {{rn({65, 70}), rn({70, 33})}, {}}, {{rn({3, 4}, DType::f64), rn({4, 2}, DType::f64)}, {}},
                             // the plain GEMM's 2 x 8 register tiles and their edges, over a transposed b; integers too
                             {{rn({2, 5, 7}, DType::f64), rn({2, 12, 7}, DType::f64).transpose(1, 2)}, {}},
                             {{ints({5, 7}, -3, 4), ints({12, 7}, -3, 4).t()}, {}}};
  };
  mm.ref = [](const std::vector<R>& in, const Attrs&) {
    R a = in[0], b = in[1];
    const bool a1 = a.shape.size() == 1, b1 = b.shape.size() == 1;
    if (a1) a.shape.insert(a.shape.begin(), 1);
    if (b1) b.shape.push_back(1);
    const int64_t n = a.shape[a.shape.size() - 2], K = a.shape.back(), mcols = b.shape.back();
    Shape ba(a.shape.begin(), a.shape.end() - 2), bb(b.shape.begin(), b.shape.end() - 2);
    const size_t nb = std::max(ba.size(), bb.size());
    Shape batch(nb);
    for (size_t i = 0; i < nb; ++i) {
      const int64_t x = i < nb - ba.size() ? 1 : ba[i - (nb - ba.size())], y = i < nb - bb.size() ? 1 : bb[i - (nb - bb.size())];
      batch[i] = x == 1 ? y : x;
    }
    Shape full = batch;
    full.push_back(n);
    full.push_back(mcols);
    R r = build(full, in[0].dtype, [&](const std::vector<int64_t>& idx) {
      std::vector<int64_t> ia, ib;
      for (size_t i = 0; i < ba.size(); ++i) ia.push_back(ba[i] == 1 ? 0 : idx[nb - ba.size() + i]);
      for (size_t i = 0; i < bb.size(); ++i) ib.push_back(bb[i] == 1 ? 0 : idx[nb - bb.size() + i]);
      return matmul_elem(a, b, ia, ib, idx[nb], idx[nb + 1], K);
    });
    Shape out = batch;
    if (!a1) out.push_back(n);
    if (!b1) out.push_back(mcols);
    r.shape = out;
    return std::vector<R>{r};
  };
  mm.bad = [] {
    return std::vector<Case>{{{rn({2, 3}), rn({4, 5})}, {}}, {{rn({2, 3, 4}), rn({3, 4, 2})}, {}}, {{rn({}), rn({3})}, {}},
                             {{rn({2, 3}), rn({3, 2}, DType::f64)}, {}}, {{bools({2, 2}), bools({2, 2})}, {}}};
  };
  mm.grad_cases = [mm] { return small_f64(mm.cases()); };
  m["matmul"] = mm;

  Spec li;
  li.cases = [] {
    return std::vector<Case>{{{rn({4, 3}), rn({5, 3}), rn({5})}, {}},   {{rn({2, 3, 4}), rn({6, 4})}, {}},
                             {{rn({3}), rn({2, 3}), rn({2})}, {}},       {{rn({0, 3}), rn({2, 3}), rn({2})}, {}},
                             {{rn({3, 4}).t(), rn({2, 3})}, {}},        {{rn({17, 64}), rn({40, 64}), rn({40})}, {}},
                             {{rn({2, 5}, DType::f64), rn({3, 5}, DType::f64), rn({3}, DType::f64)}, {}},
                             // decode-sized products (the few-rows kernel): vector body + tails in K and N,
                             // one, two and three rows at a time, with and without bias
                             {{rn({1, 37}), rn({9, 37}), rn({9})}, {}}, {{rn({5, 1, 70}), rn({13, 70})}, {}},
                             {{rn({3, 70}), rn({11, 70}), rn({11})}, {}}, {{rn({4, 70}), rn({9, 70}), rn({9})}, {}},
                             {{rn({2, 128}), rn({384, 128}), rn({384})}, {}}, {{rn({8, 16}), rn({4, 16})}, {}},
                             // bf16 weights and activations: the same kernel reading bf16 (M <= 8), and
                             // the widening path past it
                             {{rn({1, 37}).to(DType::bf16), rn({9, 37}).to(DType::bf16), rn({9}).to(DType::bf16)}, {}},
                             {{rn({5, 1, 70}).to(DType::bf16), rn({13, 70}).to(DType::bf16)}, {}},
                             {{rn({8, 264}).to(DType::bf16), rn({40, 264}).to(DType::bf16), rn({40}).to(DType::bf16)}, {}},
                             {{rn({12, 24}).to(DType::bf16), rn({6, 24}).to(DType::bf16), rn({6}).to(DType::bf16)}, {}},
                             {{rn({3, 264}).to(DType::bf16), rn({300, 264}).to(DType::bf16)}, {}},  // three weight blocks
                             {{rn({4, 264}).to(DType::bf16), rn({300, 264}).to(DType::bf16), rn({300}).to(DType::bf16)}, {}},
                             // M <= 8 takes the few-rows kernel however large the weight (here 4.5 MB; scaled:
                             // 1024-term sums at f32 tolerance); one row of bf16 too (oneDNN's bf16 GEMV otherwise)
                             {{rn({3, 1024}), rn({1100, 1024}) * 0.03, rn({1100})}, {}},
                             {{rn({1, 1024}), rn({1100, 1024}) * 0.03}, {}},
                             {{rn({1, 1024}).to(DType::bf16), (rn({1100, 1024}) * 0.03).to(DType::bf16), rn({1100}).to(DType::bf16)}, {}}};
  };
  li.ref = [](const std::vector<R>& in, const Attrs&) {
    const R &x = in[0], &w = in[1];
    const int64_t K = w.shape[1], N = w.shape[0], M = x.shape.numel() / K;
    Shape os = x.shape;
    os.back() = N;
    R o{os, std::vector<double>(size_t(M * N)), x.dtype};
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = in.size() == 3 ? in[2].v[size_t(j)] : 0.0;
        for (int64_t k = 0; k < K; ++k) s += x.v[size_t(i * K + k)] * w.v[size_t(j * K + k)];
        o.v[size_t(i * N + j)] = s;
      }
    return std::vector<R>{o};
  };
  li.bad = [] {
    return std::vector<Case>{{{rn({4, 3}), rn({5, 4})}, {}}, {{rn({4, 3}), rn({5, 3}), rn({4})}, {}}, {{rn({4, 3})}, {}},
                             {{rn({4, 3}), rn({5, 3}, DType::f64)}, {}}, {{ints({2, 3}, 0, 2), ints({2, 3}, 0, 2)}, {}}};
  };
  li.grad_cases = [li] { return small_f64(li.cases()); };
  m["linear"] = li;

  // ---- nn ----
  Spec em;
  em.cases = [] {
    return std::vector<Case>{{{rn({10, 4}), ints({3, 5}, 0, 10)}, {}}, {{rn({3, 2}), ints({}, 0, 3)}, {}},
                             {{rn({5, 3}), ints({0}, 0, 5)}, {}},      {{rn({6, 8}), ints({7}, 0, 6, DType::i32)}, {}}};
  };
  em.ref = [](const std::vector<R>& in, const Attrs&) {
    const int64_t D = in[0].shape[1];
    Shape os = in[1].shape;
    os.push_back(D);
    return std::vector<R>{build(os, in[0].dtype, [&](const std::vector<int64_t>& idx) {
      std::vector<int64_t> ii(idx.begin(), idx.end() - 1);
      const int64_t row = int64_t(at(in[1], ii));
      return in[0].v[size_t(row * D + idx.back())];
    })};
  };
  em.bad = [] {
    return std::vector<Case>{{{rn({4, 2}), tensor<int64_t>({1, 4})}, {}}, {{rn({4, 2}), tensor<int64_t>({-1})}, {}},
                             {{rn({4}), ints({2}, 0, 4)}, {}}, {{rn({4, 2}), rn({2})}, {}}};
  };
  em.grad_cases = [] { return small_f64({{{rn({6, 3}), tensor<int64_t>({1, 4, 1, 0}, {2, 2})}, {}}}); };
  m["embedding"] = em;

  auto norm_ref = [](bool layer) {
    return [layer](const std::vector<R>& in, const Attrs& a) {
      const R& x = in[0];
      const int64_t D = x.shape.back(), rows = D ? x.shape.numel() / D : 0;
      R o{x.shape, x.v, x.dtype};
      for (int64_t r = 0; r < rows; ++r) {
        double mu = 0, ss = 0;
        for (int64_t i = 0; i < D; ++i) mu += x.v[size_t(r * D + i)];
        mu = layer ? mu / double(D) : 0.0;
        for (int64_t i = 0; i < D; ++i) ss += (x.v[size_t(r * D + i)] - mu) * (x.v[size_t(r * D + i)] - mu);
        const double inv = 1 / std::sqrt(ss / double(D) + a.f("eps"));
        for (int64_t i = 0; i < D; ++i)
          o.v[size_t(r * D + i)] = (x.v[size_t(r * D + i)] - mu) * inv * in[1].v[size_t(i)] + (layer ? in[2].v[size_t(i)] : 0.0);
      }
      return std::vector<R>{o};
    };
  };
  Spec ln;
  ln.cases = [] {
    return std::vector<Case>{{{rn({3, 8}), rn({8}), rn({8})}, {{"eps", 1e-5}}}, {{rn({2, 3, 5}), rn({5}), rn({5})}, {{"eps", 1e-3}}},
                             {{rn({0, 4}), rn({4}), rn({4})}, {{"eps", 1e-5}}},  {{rn({7}), rn({7}), rn({7})}, {{"eps", 1e-5}}},
                             {{rn({4, 300}), rn({300}), rn({300})}, {{"eps", 1e-5}}}};
  };
  ln.ref = norm_ref(true);
  ln.bad = [] {
    return std::vector<Case>{{{rn({3, 8}), rn({7}), rn({8})}, {{"eps", 1e-5}}},
                             {{ints({3, 8}, 0, 2), rn({8}), rn({8})}, {{"eps", 1e-5}}},
                             {{rn({3, 8}), rn({8}, DType::f64), rn({8})}, {{"eps", 1e-5}}}};
  };
  ln.grad_cases = [ln] { return small_f64(ln.cases()); };
  m["layer_norm"] = ln;

  Spec rms;
  rms.cases = [] {
    return std::vector<Case>{{{rn({3, 8}), rn({8})}, {{"eps", 1e-6}}}, {{rn({2, 3, 5}), rn({5})}, {{"eps", 1e-3}}},
                             {{rn({0, 4}), rn({4})}, {{"eps", 1e-6}}}, {{rn({4, 300}).slice(1, 0, 300, 1), rn({300})}, {{"eps", 1e-6}}}};
  };
  rms.ref = norm_ref(false);
  rms.bad = [] {
    return std::vector<Case>{{{rn({3, 8}), rn({3})}, {{"eps", 1e-6}}}, {{rn({}), rn({1})}, {{"eps", 1e-6}}}};
  };
  rms.grad_cases = [rms] { return small_f64(rms.cases()); };
  m["rms_norm"] = rms;

  Spec ro;
  auto rope_case = [](Shape xs) {
    const int64_t T = xs[xs.size() - 2], D = xs.back();
    return Case{{rn(xs), rn({T, D / 2}), rn({T, D / 2})}, {}};
  };
  ro.cases = [rope_case] {
    return std::vector<Case>{rope_case({2, 3, 4, 8}), rope_case({5, 2}), rope_case({2, 0, 4}), rope_case({1, 7, 6})};
  };
  ro.ref = [](const std::vector<R>& in, const Attrs&) {
    const R& x = in[0];
    const int64_t T = x.shape[x.shape.size() - 2], D = x.shape.back(), H = D / 2;
    return std::vector<R>{build(x.shape, x.dtype, [&](const std::vector<int64_t>& idx) {
      const int64_t t = idx[idx.size() - 2], i = idx.back();
      auto other = idx;
      const double c = in[1].v[size_t(t * H + i % H)], s = in[2].v[size_t(t * H + i % H)];
      (void)T;
      if (i < H) { other.back() = i + H; return at(x, idx) * c - at(x, other) * s; }
      other.back() = i - H;
      return at(x, idx) * c + at(x, other) * s;
    })};
  };
  ro.bad = [] {
    return std::vector<Case>{{{rn({2, 3, 5}), rn({3, 2}), rn({3, 2})}, {}}, {{rn({2, 3, 4}), rn({2, 2}), rn({3, 2})}, {}},
                             {{rn({4}), rn({1, 2}), rn({1, 2})}, {}}};
  };
  ro.grad_cases = [rope_case] { return small_f64({rope_case({2, 3, 4}), rope_case({1, 2, 2, 6})}); };
  m["rotary_embedding"] = ro;

  Spec ce;
  auto ce_attrs = [](int64_t ig, double ls) { return Attrs{{"ignore_index", ig}, {"label_smoothing", ls}}; };
  ce.cases = [ce_attrs] {
    return std::vector<Case>{{{rn({5, 7}), ints({5}, 0, 7)}, ce_attrs(-100, 0.0)},
                             {{rn({2, 3, 4}), ints({2, 3}, 0, 4)}, ce_attrs(-100, 0.1)},
                             {{rn({4, 3}), tensor<int64_t>({0, -1, 2, -1})}, ce_attrs(-1, 0.0)},
                             {{rn({3, 5}), tensor<int32_t>({4, 0, 2})}, ce_attrs(-100, 0.2)},
                             {{rn({64, 300}) * 3.0, ints({64}, 0, 300)}, ce_attrs(-100, 0.0)}};
  };
  ce.ref = [](const std::vector<R>& in, const Attrs& a) {
    const int64_t C = in[0].shape.back(), rows = in[1].shape.numel(), ig = a.i("ignore_index");
    const double ls = a.f("label_smoothing");
    double total = 0;
    int64_t count = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = int64_t(in[1].v[size_t(r)]);
      if (t == ig) continue;
      double mx = -INFINITY, s = 0, sum = 0;
      for (int64_t c = 0; c < C; ++c) mx = std::max(mx, in[0].v[size_t(r * C + c)]);
      for (int64_t c = 0; c < C; ++c) { s += std::exp(in[0].v[size_t(r * C + c)] - mx); sum += in[0].v[size_t(r * C + c)]; }
      const double lse = mx + std::log(s);
      total += (1 - ls) * (lse - in[0].v[size_t(r * C + t)]) + ls * (lse - sum / double(C));
      ++count;
    }
    return std::vector<R>{{Shape{}, {total / double(count)}, in[0].dtype}};
  };
  ce.bad = [ce_attrs] {
    return std::vector<Case>{{{rn({4, 3}), ints({5}, 0, 3)}, ce_attrs(-100, 0.0)},
                             {{rn({2, 3}), tensor<int64_t>({0, 3})}, ce_attrs(-100, 0.0)},
                             {{rn({2, 3}), rn({2})}, ce_attrs(-100, 0.0)},
                             {{rn({2, 3}), ints({2}, 0, 3)}, ce_attrs(-100, 1.5)}};
  };
  ce.grad_cases = [ce_attrs] {
    return small_f64({{{rn({4, 5}), tensor<int64_t>({1, -100, 4, 0})}, ce_attrs(-100, 0.0)},
                      {{rn({2, 2, 3}), ints({2, 2}, 0, 3)}, ce_attrs(-100, 0.3)}});
  };
  m["cross_entropy"] = ce;

  Spec dr;
  auto dr_attrs = [](double p, int64_t seed, int64_t ctr) { return Attrs{{"p", p}, {"seed", seed}, {"counter", ctr}}; };
  dr.cases = [dr_attrs] {
    return std::vector<Case>{{{rn({40, 50})}, dr_attrs(0.3, 7, 100)}, {{rn({5})}, dr_attrs(1.0, 1, 0)},
                             {{rn({0})}, dr_attrs(0.5, 1, 0)},         {{rn({3, 3}, DType::f64)}, dr_attrs(0.5, 3, 9)}};
  };
  dr.ref = [](const std::vector<R>& in, const Attrs& a) {
    const double p = a.f("p");
    R o = in[0];
    for (size_t i = 0; i < o.v.size(); ++i) {
      const float u = philox_uniform(uint64_t(a.i("seed")), uint64_t(a.i("counter")), i);
      o.v[i] = u >= float(p) ? o.v[i] / (1 - p) : 0.0;
    }
    return std::vector<R>{o};
  };
  dr.bad = [dr_attrs] {
    return std::vector<Case>{{{rn({3})}, dr_attrs(1.5, 0, 0)}, {{ints({3}, 0, 3)}, dr_attrs(0.5, 0, 0)}};
  };
  dr.grad_cases = [dr_attrs] { return small_f64({{{rn({6, 5})}, dr_attrs(0.4, 5, 2)}}); };
  m["dropout"] = dr;

  // ---- indexing ----
  Spec is;
  is.cases = [] {
    return std::vector<Case>{{{rn({5, 3}), tensor<int64_t>({4, 0, 4})}, dim_attr(0)},
                             {{rn({2, 6, 2}), ints({9}, 0, 6)}, dim_attr(1)},
                             {{rn({3, 2}), ints({0}, 0, 3)}, dim_attr(0)},
                             {{ints({4, 3}, 0, 9), tensor<int32_t>({2})}, dim_attr(-1)}};
  };
  is.ref = [](const std::vector<R>& in, const Attrs& a) {
    const int64_t d = wrap(a.i("dim"), int64_t(in[0].shape.size()));
    Shape os = in[0].shape;
    os[size_t(d)] = int64_t(in[1].v.size());
    return std::vector<R>{build(os, in[0].dtype, [&](std::vector<int64_t> idx) {
      idx[size_t(d)] = int64_t(in[1].v[size_t(idx[size_t(d)])]);
      return at(in[0], idx);
    })};
  };
  is.bad = [] {
    return std::vector<Case>{{{rn({5, 3}), tensor<int64_t>({5})}, dim_attr(0)}, {{rn({5, 3}), rn({2})}, dim_attr(0)},
                             {{rn({5, 3}), ints({2, 2}, 0, 2)}, dim_attr(0)}, {{rn({5, 3}), ints({2}, 0, 2)}, dim_attr(2)}};
  };
  is.grad_cases = [] { return small_f64({{{rn({5, 3}), tensor<int64_t>({4, 0, 4})}, dim_attr(0)}}); };
  m["index_select"] = is;

  Spec ga;
  ga.cases = [] {
    return std::vector<Case>{{{rn({4, 5}), ints({6, 5}, 0, 4)}, dim_attr(0)},
                             {{rn({4, 5}), ints({3, 2}, 0, 5)}, dim_attr(1)},
                             {{rn({2, 3, 4}), ints({2, 3, 7}, 0, 4)}, dim_attr(-1)},
                             {{rn({3, 5, 4}), ints({2, 6, 3}, 0, 5)}, dim_attr(1)},  // a middle dim, idx smaller elsewhere
                             {{rn({3, 3}), ints({0, 3}, 0, 3)}, dim_attr(0)}};
  };
  ga.ref = [](const std::vector<R>& in, const Attrs& a) {
    const int64_t d = wrap(a.i("dim"), int64_t(in[0].shape.size()));
    return std::vector<R>{build(in[1].shape, in[0].dtype, [&](std::vector<int64_t> idx) {
      const double j = at(in[1], idx);
      idx[size_t(d)] = int64_t(j);
      return at(in[0], idx);
    })};
  };
  ga.bad = [] {
    return std::vector<Case>{{{rn({4, 5}), ints({2}, 0, 4)}, dim_attr(0)}, {{rn({4, 5}), tensor<int64_t>({4}, {1, 1})}, dim_attr(0)},
                             {{rn({4, 5}), ints({2, 6}, 0, 4)}, dim_attr(0)},
                             // rows gathered from rows: each row's indices checked in the threads
                             {{rn({2, 5}), tensor<int64_t>({0, 1, 5, 2}, {2, 2})}, dim_attr(1)},
                             {{rn({2, 5}), tensor<int64_t>({0, -1, 4, 2}, {2, 2})}, dim_attr(-1)}};
  };
  ga.grad_cases = [] { return small_f64({{{rn({4, 5}), ints({6, 5}, 0, 4)}, dim_attr(0)}, {{rn({4, 5}), ints({3, 2}, 0, 5)}, dim_attr(1)}}); };
  m["gather"] = ga;

  Spec sa;
  sa.cases = [] {
    return std::vector<Case>{{{rn({4, 5}), ints({6, 5}, 0, 4), rn({6, 5})}, dim_attr(0)},
                             {{rn({4, 5}), ints({3, 2}, 0, 5), rn({3, 2})}, dim_attr(1)},
                             {{ints({5}, 0, 3), ints({8}, 0, 5), ints({8}, 0, 3)}, dim_attr(0)},
                             {{rn({3, 4, 6}), ints({3, 2, 9}, 0, 6), rn({3, 2, 9})}, dim_attr(2)},  // the last dim: rows in parallel
                             {{rn({3, 4, 6}), ints({2, 7, 5}, 0, 4), rn({2, 7, 5})}, dim_attr(1)},
                             {{rn({3}), ints({0}, 0, 3), rn({0})}, dim_attr(0)}};
  };
  sa.ref = [](const std::vector<R>& in, const Attrs& a) {
    const int64_t d = wrap(a.i("dim"), int64_t(in[0].shape.size()));
    R o = in[0];
    for (int64_t i = 0; i < in[1].shape.numel(); ++i) {
      auto idx = unravel(i, in[1].shape);
      idx[size_t(d)] = int64_t(in[1].v[size_t(i)]);
      o.v[size_t(ravel(idx, o.shape))] += in[2].v[size_t(i)];
    }
    return std::vector<R>{o};
  };
  sa.bad = [] {
    return std::vector<Case>{{{rn({4, 5}), ints({2, 5}, 0, 4), rn({3, 5})}, dim_attr(0)},
                             {{rn({4, 5}), tensor<int64_t>({9}, {1, 1}), rn({1, 1})}, dim_attr(0)},
                             {{rn({4, 5}), ints({2, 5}, 0, 4), rn({2, 5}, DType::f64)}, dim_attr(0)}};
  };
  sa.grad_cases = [] { return small_f64({{{rn({4, 5}), ints({6, 5}, 0, 4), rn({6, 5})}, dim_attr(0)}}); };
  m["scatter_add"] = sa;

  Spec mf;
  mf.cases = [] {
    return std::vector<Case>{{{rn({3, 4}), bools({3, 4})}, {{"value", -1.5}}}, {{rn({3, 4}), bools({4})}, {{"value", 0.0}}},
                             {{ints({5}, 0, 5), bools({5})}, {{"value", 7.0}}},  {{rn({0, 2}), bools({1, 2})}, {{"value", 1.0}}}};
  };
  mf.ref = [](const std::vector<R>& in, const Attrs& a) {
    return std::vector<R>{build(in[0].shape, in[0].dtype, [&](const std::vector<int64_t>& idx) {
      std::vector<int64_t> mi(idx.end() - int64_t(in[1].shape.size()), idx.end());
      for (size_t k = 0; k < mi.size(); ++k) if (in[1].shape[k] == 1) mi[k] = 0;
      return at(in[1], mi) != 0 ? a.f("value") : at(in[0], idx);
    })};
  };
  mf.bad = [] {
    return std::vector<Case>{{{rn({3, 4}), bools({2, 3, 4})}, {{"value", 0.0}}}, {{rn({3, 4}), rn({3, 4})}, {{"value", 0.0}}}};
  };
  mf.grad_cases = [] { return small_f64({{{rn({3, 4}), bools({3, 4})}, {{"value", -1.5}}}}); };
  m["masked_fill"] = mf;

  Spec tr;
  auto tri = [](int64_t d, bool up) { return Attrs{{"diagonal", d}, {"upper", up}}; };
  tr.cases = [tri] {
    return std::vector<Case>{{{rn({4, 5})}, tri(0, true)}, {{rn({2, 4, 3})}, tri(-1, false)}, {{rn({3, 3})}, tri(1, false)},
                             {{ints({3, 6}, 0, 9)}, tri(2, true)}, {{rn({0, 3})}, tri(0, true)}};
  };
  tr.ref = [](const std::vector<R>& in, const Attrs& a) {
    const int64_t dg = a.i("diagonal");
    const bool up = a.b("upper");
    return std::vector<R>{build(in[0].shape, in[0].dtype, [&](const std::vector<int64_t>& idx) {
      const int64_t r = idx[idx.size() - 2], c = idx.back();
      return (up ? c - r >= dg : c - r <= dg) ? at(in[0], idx) : 0.0;
    })};
  };
  tr.bad = [tri] { return std::vector<Case>{{{rn({4})}, tri(0, true)}}; };
  tr.grad_cases = [tri] { return small_f64({{{rn({4, 5})}, tri(0, true)}, {{rn({2, 4, 3})}, tri(-1, false)}}); };
  m["triangle"] = tr;

  Spec tk;
  auto tk_attrs = [](int64_t k, int64_t d, bool largest) { return Attrs{{"k", k}, {"dim", d}, {"largest", largest}}; };
  tk.cases = [tk_attrs] {
    return std::vector<Case>{{{rn({10})}, tk_attrs(3, 0, true)},        {{rn({4, 6})}, tk_attrs(2, 1, false)},
                             {{rn({5, 3})}, tk_attrs(5, 0, true)},      {{rn({3, 4})}, tk_attrs(0, -1, true)},
                             {{ints({3, 8}, 0, 4)}, tk_attrs(4, 1, true)}, {{rn({2, 50, 3})}, tk_attrs(7, 1, true)}};
  };
  tk.ref = [](const std::vector<R>& in, const Attrs& a) {
    const int64_t k = a.i("k"), d = a.i("dim");
    const bool largest = a.b("largest");
    auto order = [&](const std::vector<double>& l) {
      std::vector<int64_t> o(l.size());
      std::iota(o.begin(), o.end(), 0);
      std::stable_sort(o.begin(), o.end(), [&](int64_t i, int64_t j) { return largest ? l[size_t(i)] > l[size_t(j)] : l[size_t(i)] < l[size_t(j)]; });
      return o;
    };
    R vals = [&] {
      R x = in[0];
      const int64_t dd = wrap(d, int64_t(x.shape.size()));
      Shape os = x.shape;
      os[size_t(dd)] = k;
      Shape rest = x.shape;
      rest[size_t(dd)] = 1;
      R v{os, std::vector<double>(size_t(os.numel())), x.dtype}, ix{os, std::vector<double>(size_t(os.numel())), DType::i64};
      for (int64_t r = 0; r < rest.numel(); ++r) {
        auto idx = unravel(r, rest);
        std::vector<double> line;
        for (int64_t i = 0; i < x.shape[size_t(dd)]; ++i) { idx[size_t(dd)] = i; line.push_back(at(x, idx)); }
        auto o = order(line);
        for (int64_t i = 0; i < k; ++i) {
          idx[size_t(dd)] = i;
          v.v[size_t(ravel(idx, os))] = line[size_t(o[size_t(i)])];
          ix.v[size_t(ravel(idx, os))] = double(o[size_t(i)]);
        }
      }
      v.dtype = x.dtype;
      return std::vector<R>{v, ix}[0];
    }();
    // Recompute indices the same way (kept separate for readability).
    R x = in[0];
    const int64_t dd = wrap(d, int64_t(x.shape.size()));
    Shape os = x.shape;
    os[size_t(dd)] = k;
    R ix = build(os, DType::i64, [&](std::vector<int64_t> idx) {
      const int64_t pos = idx[size_t(dd)];
      std::vector<double> line;
      for (int64_t i = 0; i < x.shape[size_t(dd)]; ++i) { idx[size_t(dd)] = i; line.push_back(at(x, idx)); }
      return double(order(line)[size_t(pos)]);
    });
    return std::vector<R>{vals, ix};
  };
  tk.bad = [tk_attrs] {
    return std::vector<Case>{{{rn({4})}, tk_attrs(5, 0, true)}, {{rn({4})}, tk_attrs(-1, 0, true)}, {{rn({4})}, tk_attrs(1, 1, true)}};
  };
  tk.grad_cases = [tk_attrs] { return small_f64({{{rn({10})}, tk_attrs(3, 0, true)}, {{rn({4, 6})}, tk_attrs(2, 1, false)}}); };
  m["topk"] = tk;

  Spec oh;
  oh.cases = [] {
    return std::vector<Case>{{{ints({5}, 0, 4)}, {{"num_classes", int64_t(4)}}}, {{ints({2, 3}, 0, 7, DType::i32)}, {{"num_classes", int64_t(7)}}},
                             {{ints({0}, 0, 2)}, {{"num_classes", int64_t(2)}}}};
  };
  oh.ref = [](const std::vector<R>& in, const Attrs& a) {
    Shape os = in[0].shape;
    os.push_back(a.i("num_classes"));
    return std::vector<R>{build(os, DType::i64, [&](const std::vector<int64_t>& idx) {
      std::vector<int64_t> ii(idx.begin(), idx.end() - 1);
      return double(int64_t(at(in[0], ii)) == idx.back());
    })};
  };
  oh.bad = [] {
    return std::vector<Case>{{{tensor<int64_t>({0, 4})}, {{"num_classes", int64_t(4)}}}, {{rn({3})}, {{"num_classes", int64_t(4)}}},
                             {{ints({3}, 0, 2)}, {{"num_classes", int64_t(0)}}}};
  };
  m["one_hot"] = oh;

  Spec mn;
  auto mn_attrs = [](int64_t n, bool repl, int64_t ctr) {
    return Attrs{{"num_samples", n}, {"replacement", repl}, {"seed", int64_t(11)}, {"counter", ctr}};
  };
  mn.cases = [mn_attrs] {
    return std::vector<Case>{{{rand({6})}, mn_attrs(20, true, 0)},
                             {{rand({3, 5})}, mn_attrs(4, false, 8)},
                             {{tensor<float>({0, 1, 0, 3}, {4})}, mn_attrs(2, false, 3)},
                             {{tensor<double>({0, 0, 2}, {1, 3})}, mn_attrs(5, true, 1)}};
  };
  mn.ref = [](const std::vector<R>& in, const Attrs& a) {
    const int64_t P = in[0].shape.back(), R_ = in[0].shape.numel() / P, n = a.i("num_samples");
    const bool repl = a.b("replacement");
    Shape os = in[0].shape;
    os.back() = n;
    R o{os, {}, DType::i64};
    for (int64_t r = 0; r < R_; ++r) {
      std::vector<double> w(in[0].v.begin() + r * P, in[0].v.begin() + (r + 1) * P);
      for (int64_t s = 0; s < n; ++s) {
        double total = std::accumulate(w.begin(), w.end(), 0.0);
        const double u = double(philox_uniform(uint64_t(a.i("seed")), uint64_t(a.i("counter")), uint64_t(r * n + s))) * total;
        // Inverse CDF: the first category whose cumulative weight exceeds u.
        double acc = 0;
        int64_t pick = 0;
        for (int64_t i = 0; i < P; ++i) {
          if (w[size_t(i)] <= 0) continue;
          acc += w[size_t(i)];
          pick = i;
          if (u < acc) break;
        }
        o.v.push_back(double(pick));
        if (!repl) w[size_t(pick)] = 0;
      }
    }
    return std::vector<R>{o};
  };
  mn.bad = [mn_attrs] {
    return std::vector<Case>{{{tensor<float>({0.5f, -0.1f})}, mn_attrs(1, true, 0)},
                             {{tensor<float>({0, 0})}, mn_attrs(1, true, 0)},
                             {{rand({3})}, mn_attrs(4, false, 0)},
                             {{tensor<float>({0, 1, 0})}, mn_attrs(2, false, 0)},
                             {{ints({3}, 0, 3)}, mn_attrs(1, true, 0)},
                             {{rand({2, 2, 2})}, mn_attrs(1, true, 0)}};
  };
  m["multinomial"] = mn;
}

}  // namespace sinter::test

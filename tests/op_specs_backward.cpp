// Specs for the fused backward ops (layer_norm_backward, softmax_backward, ...): each is checked
// against central differences of its forward op's double reference, or a closed form in double.
#include <algorithm>
#include <cmath>

#include "op_specs.h"

namespace sinter::test {
using namespace spec;
namespace {

using RefFn = std::function<std::vector<R>(const std::vector<R>&, const Attrs&)>;

// d/d in[k] of sum(g * f(in)[0]), by central differences in double.
R fd_vjp(const RefFn& f, std::vector<R> in, const Attrs& a, const R& g, size_t k, DType dt) {
  R out{in[k].shape, std::vector<double>(in[k].v.size()), dt};
  const double h = 1e-6;
  for (size_t i = 0; i < in[k].v.size(); ++i) {
    const double v0 = in[k].v[i];
    auto dot = [&](double v) {
      in[k].v[i] = v;
      const R y = f(in, a)[0];
      double s = 0;
      for (size_t j = 0; j < y.v.size(); ++j) s += g.v[j] * y.v[j];
      return s;
    };
    out.v[i] = (dot(v0 + h) - dot(v0 - h)) / (2 * h);
    in[k].v[i] = v0;
  }
  return out;
}

}  // namespace

void add_backward_specs(std::map<std::string, Spec>& m) {
  // ---- layer_norm_backward / rms_norm_backward: (g, x, w) -> dx, dw[, db] ----
  for (bool layer : {true, false}) {
    const std::string fwd = layer ? "layer_norm" : "rms_norm";
    const RefFn f = m.at(fwd).ref;
    Spec s;
    s.cases = [] {
      auto c = [](Shape xs, double eps) {
        const int64_t D = xs.back();
        return Case{{rn(xs), rn(xs), rn({D})}, {{"eps", eps}}};
      };
      std::vector<Case> cs{c({3, 8}, 1e-5), c({2, 3, 5}, 1e-3), c({0, 4}, 1e-5), c({7}, 1e-5), c({4, 300}, 1e-5)};
      cs.push_back({{rn({4, 6}).t(), rn({6, 4}), rn({4})}, {{"eps", 1e-5}}});  // a strided gradient
      return cs;
    };
    s.ref = [f, layer](const std::vector<R>& in, const Attrs& a) {
      const R &g = in[0], &x = in[1], &w = in[2];
      std::vector<R> fin{x, w};
      if (layer) fin.push_back(R{w.shape, std::vector<double>(w.v.size(), 0.0), w.dtype});  // the bias
      std::vector<R> out{fd_vjp(f, fin, a, g, 0, x.dtype), fd_vjp(f, fin, a, g, 1, w.dtype)};
      if (layer) out.push_back(fd_vjp(f, fin, a, g, 2, w.dtype));
      return out;
    };
    s.bad = [] {
      return std::vector<Case>{{{rn({3, 8}), rn({3, 7}), rn({7})}, {{"eps", 1e-5}}},
                               {{rn({3, 8}), rn({3, 8}), rn({7})}, {{"eps", 1e-5}}},
                               {{rn({3, 8}, DType::f64), rn({3, 8}), rn({8})}, {{"eps", 1e-5}}}};
    };
    s.rtol = s.atol = 1e-4;  // differences of a double reference, against an f32 kernel
    m[fwd + "_backward"] = s;
  }

  // ---- softmax_backward / log_softmax_backward: (g, y) -> dx over the last dim ----
  for (bool log : {false, true}) {
    Spec s;
    s.cases = [log] {
      std::vector<Case> cs;
      for (Shape sh : {Shape{7}, Shape{3, 4}, Shape{2, 3, 5}, Shape{2, 0, 4}, Shape{16, 300}}) {
        Tensor x = rn(sh);
        cs.push_back({{rn(sh), log ? log_softmax(x, -1) : softmax(x, -1)}, {}});
      }
      return cs;
    };
    s.ref = [log](const std::vector<R>& in, const Attrs&) {
      const R &g = in[0], &y = in[1];
      const int64_t n = y.shape.back(), rows = n ? y.shape.numel() / n : 0;
      R dx{y.shape, std::vector<double>(y.v.size()), y.dtype};
      for (int64_t r = 0; r < rows; ++r) {
        double s = 0;
        for (int64_t i = 0; i < n; ++i) s += log ? g.v[size_t(r * n + i)] : g.v[size_t(r * n + i)] * y.v[size_t(r * n + i)];
        for (int64_t i = 0; i < n; ++i) {
          const size_t k = size_t(r * n + i);
          dx.v[k] = log ? g.v[k] - std::exp(y.v[k]) * s : y.v[k] * (g.v[k] - s);
        }
      }
      return std::vector<R>{dx};
    };
    s.bad = [] {
      return std::vector<Case>{{{rn({3, 4}), rn({3, 5})}, {}}, {{rn({}), rn({})}, {}}, {{ints({3}, 0, 2), ints({3}, 0, 2)}, {}}};
    };
    m[log ? "log_softmax_backward" : "softmax_backward"] = s;
  }

  // ---- causal_softmax: row i of each (Lq, Lkv) matrix over columns j <= i + offset ----
  {
    Spec s;
    auto off = [](int64_t o) { return Attrs{{"offset", o}}; };
    s.cases = [off] {
      return std::vector<Case>{{{rn({4, 4})}, off(0)},          {{rn({2, 3, 3, 7})}, off(4)}, {{rn({3, 5})}, off(2)},
                               {{rn({2, 0, 4})}, off(0)},       {{rn({1, 6})}, off(5)},       {{rn({64, 300})}, off(236)},
                               {{rn({5, 4}).t()}, off(0)},      {{rn({3, 3})}, off(-1)},  // the first row sees nothing: 0
                               {{rn({2, 9, 12})}, Attrs{{"offset", int64_t(3)}, {"window", int64_t(4)}}},
                               {{rn({6, 6})}, Attrs{{"offset", int64_t(0)}, {"window", int64_t(1)}}}};
    };
    s.ref = [](const std::vector<R>& in, const Attrs& a) {
      const R& x = in[0];
      const int64_t n = x.shape.back(), lq = x.shape[x.shape.size() - 2], rows = n ? x.shape.numel() / n : 0;
      R y{x.shape, std::vector<double>(x.v.size(), 0.0), x.dtype};
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t seen = std::clamp<int64_t>(r % lq + a.i("offset") + 1, 0, n);
        const int64_t first = a.has("window") ? std::max<int64_t>(seen - a.i("window"), 0) : 0;
        std::vector<double> line(x.v.begin() + r * n + first, x.v.begin() + r * n + seen);
        const auto p = softmax_line(line, false);
        for (int64_t j = 0; j < n; ++j)
          y.v[size_t(r * n + j)] = seen == first ? 0.0 : (j >= first && j < seen ? p[size_t(j - first)] : 0.0);
      }
      return std::vector<R>{y};
    };
    s.bad = [off] {
      return std::vector<Case>{{{rn({4})}, off(0)}, {{ints({2, 2}, 0, 3)}, off(0)},
                               {{rn({2, 2})}, Attrs{{"offset", int64_t(0)}, {"window", int64_t(-1)}}}};
    };
    s.grad_cases = [off] {
      return small_f64({{{rn({4, 4})}, off(0)}, {{rn({2, 2, 5})}, off(3)}, {{rn({3, 4})}, off(1)},
                        {{rn({4, 5})}, Attrs{{"offset", int64_t(1)}, {"window", int64_t(2)}}}});
    };
    m["causal_softmax"] = s;
  }

  // ---- cross_entropy_backward: (logits, target, g) -> dlogits ----
  {
    const RefFn f = m.at("cross_entropy").ref;
    Spec s;
    auto attrs = [](int64_t ig, double ls) { return Attrs{{"ignore_index", ig}, {"label_smoothing", ls}}; };
    s.cases = [attrs] {
      return std::vector<Case>{{{rn({5, 7}), ints({5}, 0, 7), rn({})}, attrs(-100, 0.0)},
                               {{rn({2, 3, 4}), ints({2, 3}, 0, 4), rn({})}, attrs(-100, 0.1)},
                               {{rn({4, 3}), tensor<int64_t>({0, -1, 2, -1}), rn({})}, attrs(-1, 0.0)},
                               {{rn({3, 5}), tensor<int32_t>({4, 0, 2}), rn({})}, attrs(-100, 0.2)},
                               {{rn({32, 300}) * 3.0, ints({32}, 0, 300), rn({})}, attrs(-100, 0.0)}};
    };
    s.ref = [f](const std::vector<R>& in, const Attrs& a) {
      return std::vector<R>{fd_vjp(f, {in[0], in[1]}, a, in[2], 0, in[0].dtype)};
    };
    s.bad = [attrs] {
      return std::vector<Case>{{{rn({4, 3}), ints({4}, 0, 3), rn({1})}, attrs(-100, 0.0)},
                               {{rn({4, 3}), ints({5}, 0, 3), rn({})}, attrs(-100, 0.0)},
                               {{rn({2, 3}), tensor<int64_t>({0, 3}), rn({})}, attrs(-100, 0.0)}};
    };
    s.rtol = s.atol = 1e-4;
    m["cross_entropy_backward"] = s;
  }

  // ---- embedding_backward: (g (..., D), indices (...)) -> (num_weights, D) ----
  {
    Spec s;
    auto nw = [](int64_t n) { return Attrs{{"num_weights", n}}; };
    s.cases = [nw] {
      return std::vector<Case>{{{rn({3, 5, 4}), ints({3, 5}, 0, 10)}, nw(10)}, {{rn({2}), ints({}, 0, 3)}, nw(3)},
                               {{rn({0, 3}), ints({0}, 0, 5)}, nw(5)},         {{rn({7, 8}), ints({7}, 0, 2, DType::i32)}, nw(2)},
                               {{rn({300, 16}), ints({300}, 0, 256)}, nw(256)}};
    };
    s.ref = [](const std::vector<R>& in, const Attrs& a) {
      const int64_t D = in[0].shape.back(), V = a.i("num_weights");
      R dw{Shape{V, D}, std::vector<double>(size_t(V * D), 0.0), in[0].dtype};
      for (size_t t = 0; t < in[1].v.size(); ++t)
        for (int64_t i = 0; i < D; ++i) dw.v[size_t(int64_t(in[1].v[t]) * D + i)] += in[0].v[t * size_t(D) + size_t(i)];
      return std::vector<R>{dw};
    };
    s.bad = [nw] {
      return std::vector<Case>{{{rn({3, 4}), tensor<int64_t>({0, 1, 5})}, nw(5)}, {{rn({3, 4}), ints({2}, 0, 5)}, nw(5)},
                               {{rn({3, 4}), rn({3})}, nw(5)}};
    };
    m["embedding_backward"] = s;
  }
}

}  // namespace sinter::test

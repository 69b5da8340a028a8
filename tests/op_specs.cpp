#include "op_specs.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

namespace sinter::test {

R ref_of(const Tensor& t) { return {t.shape(), to_double_vector(t), t.dtype()}; }

::testing::AssertionResult matches(const std::vector<Tensor>& out, const std::vector<R>& ref, const Spec& spec) {
  if (out.size() != ref.size()) return ::testing::AssertionFailure() << out.size() << " outputs, reference has " << ref.size();
  for (size_t k = 0; k < out.size(); ++k) {
    if (out[k].shape() != ref[k].shape)
      return ::testing::AssertionFailure() << "output " << k << " has shape " << out[k].shape() << ", reference " << ref[k].shape;
    if (out[k].dtype() != ref[k].dtype)
      return ::testing::AssertionFailure() << "output " << k << " has dtype " << out[k].dtype() << ", reference " << ref[k].dtype;
    const double rtol = std::max(spec.rtol * (is_floating(ref[k].dtype) ? 1.0 : 0.0), default_rtol(ref[k].dtype));
    const double atol = is_floating(ref[k].dtype) ? std::max(spec.atol, default_rtol(ref[k].dtype)) : 0.0;
    auto r = all_close(out[k], ref[k].v, rtol, atol);
    if (!r) return r << " (output " << k << ")";
  }
  return ::testing::AssertionSuccess();
}

std::string describe(const Case& c) {
  std::ostringstream os;
  os << "inputs:";
  for (auto& t : c.in) os << " " << t.shape() << ":" << t.dtype() << (t.is_contiguous() ? "" : "(strided)");
  os << " attrs " << c.attrs;
  return os.str();
}

using namespace spec;

namespace {

// ---- reference helpers: plain loops over row-major indices ----

Shape bshape(const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t x = i < n - a.size() ? 1 : a[i - (n - a.size())], y = i < n - b.size() ? 1 : b[i - (n - b.size())];
    out[i] = x == 1 ? y : x;
  }
  return out;
}
// Value of r at an index of a broadcast output shape.
double bget(const R& r, const std::vector<int64_t>& out_idx) {
  const size_t off = out_idx.size() - r.shape.size();
  int64_t lin = 0;
  for (size_t d = 0; d < r.shape.size(); ++d) lin = lin * r.shape[d] + (r.shape[d] == 1 ? 0 : out_idx[off + d]);
  return r.v[size_t(lin)];
}
R map1(const R& x, DType dt, const std::function<double(double)>& f) {
  R o{x.shape, x.v, dt};
  for (double& v : o.v) v = f(v);
  return o;
}
R mapn(const std::vector<R>& in, DType dt, const std::function<double(const std::vector<double>&)>& f) {
  Shape s = in[0].shape;
  for (auto& r : in) s = bshape(s, r.shape);
  R o{s, std::vector<double>(size_t(s.numel())), dt};
  std::vector<double> args(in.size());
  for (int64_t i = 0; i < s.numel(); ++i) {
    auto idx = unravel(i, s);
    for (size_t k = 0; k < in.size(); ++k) args[k] = bget(in[k], idx);
    o.v[size_t(i)] = f(args);
  }
  return o;
}
DType float_of(DType t) { return is_floating(t) ? t : DType::f32; }

// Reduction over `dims` (all if empty): calls f on each group's values, in row-major order.
R reduce_ref(const R& x, const Shape& dims0, bool keepdim, DType dt, const std::function<double(const std::vector<double>&)>& f) {
  const int64_t nd = int64_t(x.shape.size());
  std::vector<bool> red(size_t(nd), dims0.empty());
  for (int64_t d : dims0) red[size_t(wrap(d, nd))] = true;
  Shape os, kept;
  for (int64_t d = 0; d < nd; ++d) {
    if (!red[size_t(d)]) { os.push_back(x.shape[size_t(d)]); kept.push_back(x.shape[size_t(d)]); }
    else if (keepdim) os.push_back(1);
  }
  std::vector<std::vector<double>> groups(size_t(std::max<int64_t>(kept.numel(), 0)));
  for (int64_t i = 0; i < x.shape.numel(); ++i) {
    auto idx = unravel(i, x.shape);
    std::vector<int64_t> k;
    for (int64_t d = 0; d < nd; ++d) if (!red[size_t(d)]) k.push_back(idx[size_t(d)]);
    groups[size_t(ravel(k, kept))].push_back(x.v[size_t(i)]);
  }
  R o{os, {}, dt};
  for (auto& g : groups) o.v.push_back(f(g));
  return o;
}

// Applies f to each 1-D line along `dim`; f maps a line to a line of possibly another length.
R along(const R& x, int64_t dim, int64_t out_len, DType dt,
        const std::function<std::vector<double>(const std::vector<double>&)>& f) {
  const int64_t nd = int64_t(x.shape.size());
  if (nd == 0) return {x.shape, f(x.v), dt};
  dim = wrap(dim, nd);
  Shape os = x.shape;
  os[size_t(dim)] = out_len;
  R o{os, std::vector<double>(size_t(os.numel())), dt};
  Shape rest = x.shape;
  rest[size_t(dim)] = 1;
  for (int64_t r = 0; r < rest.numel(); ++r) {
    auto idx = unravel(r, rest);
    std::vector<double> line;
    for (int64_t i = 0; i < x.shape[size_t(dim)]; ++i) { idx[size_t(dim)] = i; line.push_back(x.v[size_t(ravel(idx, x.shape))]); }
    auto out = f(line);
    for (int64_t i = 0; i < out_len; ++i) { idx[size_t(dim)] = i; o.v[size_t(ravel(idx, os))] = out[size_t(i)]; }
  }
  return o;
}

// ---- case helpers ----

Tensor pos(const Shape& s, DType dt = DType::f32) { return (rand(s, DType::f64) * 2.0 + 0.5).to(dt); }

const std::vector<Shape>& unary_shapes() {
  static const std::vector<Shape> s{{}, {0}, {1}, {7}, {3, 5}, {2, 1, 4}, {2, 0, 3}, {33, 17}};
  return s;
}
const std::vector<std::pair<Shape, Shape>>& binary_shapes() {
  static const std::vector<std::pair<Shape, Shape>> s{
      {{}, {}}, {{5}, {5}}, {{3, 4}, {4}}, {{2, 1, 3}, {4, 1}}, {{}, {3}}, {{0, 3}, {1, 3}}, {{1}, {2, 3}}, {{40, 33}, {40, 33}}};
  return s;
}

std::vector<Case> unary_cases(std::function<Tensor(const Shape&)> gen, bool ints_too) {
  std::vector<Case> c;
  for (auto& s : unary_shapes()) c.push_back({{gen(s)}, {}});
  c.push_back({{gen({4, 3}).to(DType::f64)}, {}});
  c.push_back({{gen({9}).to(DType::bf16)}, {}});
  if (ints_too) c.push_back({{ints({6}, -5, 6, DType::i32)}, {}});
  return c;
}
std::vector<Case> binary_cases(std::function<Tensor(const Shape&)> ga, std::function<Tensor(const Shape&)> gb, bool ints_too) {
  std::vector<Case> c;
  for (auto& [a, b] : binary_shapes()) c.push_back({{ga(a), gb(b)}, {}});
  c.push_back({{ga({3}), gb({3}).to(DType::f64)}, {}});
  c.push_back({{ga({4}).to(DType::bf16), gb({4}).to(DType::bf16)}, {}});
  if (ints_too) {
    c.push_back({{ints({5}, 1, 5, DType::i32), ints({5}, 1, 4, DType::i64)}, {}});
    c.push_back({{ints({2, 3}, 1, 5, DType::i32), ga({3})}, {}});
  }
  return c;
}
double gelu_ref(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double gelu_tanh_ref(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }

void add_unary(std::map<std::string, Spec>& m, const std::string& name, std::function<double(double)> f, bool keep,
               std::function<Tensor(const Shape&)> gen = [](const Shape& s) { return rn(s); }) {
  Spec s;
  s.cases = [gen] { return unary_cases(gen, true); };
  s.ref = [f, keep](const std::vector<R>& in, const Attrs&) {
    return std::vector<R>{map1(in[0], keep ? in[0].dtype : float_of(in[0].dtype), f)};
  };
  s.bad = [name, keep] {
    std::vector<Case> b{{{rn({2}), rn({2})}, {}}};  // wrong arity
    if (keep) b.push_back({{bools({2})}, {}});
    return b;
  };
  s.grad_cases = [gen] { return small_f64(unary_cases(gen, false)); };
  m[name] = s;
}

void add_binary(std::map<std::string, Spec>& m, const std::string& name, std::function<double(double, double)> f,
                bool compare, bool true_div = false,
                std::function<Tensor(const Shape&)> ga = [](const Shape& s) { return rn(s); },
                std::function<Tensor(const Shape&)> gb = [](const Shape& s) { return rn(s); }) {
  Spec s;
  s.cases = [ga, gb] { return binary_cases(ga, gb, true); };
  s.ref = [f, compare, true_div](const std::vector<R>& in, const Attrs&) {
    DType dt = compare ? DType::boolean : promote_types(in[0].dtype, in[1].dtype);
    if (true_div && !is_floating(dt)) dt = DType::f32;
    return std::vector<R>{mapn(in, dt, [&](const std::vector<double>& a) {
      double r = f(a[0], a[1]);
      if (!compare && !is_floating(dt)) r = double(int64_t(r));
      return r;
    })};
  };
  s.bad = [compare] {
    std::vector<Case> b{{{rn({2, 3}), rn({4})}, {}}, {{rn({2})}, {}}};
    if (!compare) b.push_back({{bools({2}), bools({2})}, {}});
    return b;
  };
  if (!compare) s.grad_cases = [ga, gb] { return small_f64(binary_cases(ga, gb, false)); };
  m[name] = s;
}

Attrs reduce_attrs(const Shape& dims, bool keepdim) { return {{"dims", dims}, {"keepdim", keepdim}}; }

std::vector<Case> reduce_cases(std::function<Tensor(const Shape&)> gen, bool ints_too) {
  std::vector<Case> c{
      {{gen({})}, reduce_attrs({}, false)},
      {{gen({7})}, reduce_attrs({0}, false)},
      {{gen({3, 4})}, reduce_attrs({1}, true)},
      {{gen({3, 4})}, reduce_attrs({0}, false)},
      {{gen({2, 3, 4})}, reduce_attrs({0, 2}, false)},
      {{gen({2, 3, 4})}, reduce_attrs({-1, 1}, true)},
      {{gen({2, 1, 4})}, reduce_attrs({}, false)},
      {{gen({2, 0, 3})}, reduce_attrs({2}, false)},
      {{gen({1, 5})}, reduce_attrs({0}, true)},
      {{gen({64, 300})}, reduce_attrs({1}, false)},
      {{gen({600, 300})}, reduce_attrs({0}, false)},  // column sums: rows split in chunks across threads
      {{gen({3, 5, 6})}, reduce_attrs({1}, false)},     // a middle dim: sums over R of (P, R, C) as it lies
      {{gen({2, 600, 3})}, reduce_attrs({1}, true)},
      {{gen({3, 4}).to(DType::f64)}, reduce_attrs({1}, false)},
  };
  if (ints_too) c.push_back({{ints({3, 4}, -3, 4, DType::i32)}, reduce_attrs({1}, false)});
  return c;
}

void add_reduce(std::map<std::string, Spec>& m, const std::string& name, std::function<double(const std::vector<double>&)> f,
                bool float_only, bool ints_to_i64, std::function<Tensor(const Shape&)> gen = [](const Shape& s) { return rn(s); },
                bool differentiable = true) {
  Spec s;
  s.cases = [gen, float_only] { return reduce_cases(gen, !float_only); };
  s.ref = [f, ints_to_i64](const std::vector<R>& in, const Attrs& a) {
    const DType dt = ints_to_i64 && !is_floating(in[0].dtype) ? DType::i64 : in[0].dtype;
    return std::vector<R>{reduce_ref(in[0], a.ints("dims"), a.b("keepdim"), dt, f)};
  };
  s.bad = [float_only] {
    std::vector<Case> b{{{rn({2, 3})}, reduce_attrs({2}, false)}, {{rn({2, 3})}, reduce_attrs({1, -1}, false)}};
    if (float_only) b.push_back({{ints({3}, 0, 3)}, reduce_attrs({}, false)});
    return b;
  };
  if (differentiable)
    s.grad_cases = [gen] {
      std::vector<Case> c;
      for (auto& k : reduce_cases(gen, false)) if (k.in[0].numel() <= 40 && k.in[0].numel() > 0) c.push_back(k);
      return small_f64(c);
    };
  m[name] = s;
}

std::vector<Case> arg_cases() {
  return {{{rn({7})}, {{"dim", int64_t(0)}, {"keepdim", false}}},
          {{rn({3, 4})}, {{"dim", int64_t(1)}, {"keepdim", true}}},
          {{rn({3, 4})}, {{"dim", int64_t(-2)}, {"keepdim", false}}},
          {{rn({2, 3, 5})}, {{"dim", int64_t(1)}, {"keepdim", false}}},
          {{rn({0, 3})}, {{"dim", int64_t(1)}, {"keepdim", false}}},
          {{rn({4, 1})}, {{"dim", int64_t(1)}, {"keepdim", false}}},
          {{rn({2, 40000})}, {{"dim", int64_t(1)}, {"keepdim", false}}},  // rows in chunks reduced in parallel
          {{ints({3, 4}, -50, 50, DType::i32)}, {{"dim", int64_t(1)}, {"keepdim", false}}},
          {{rn({})}, {{"dim", int64_t(0)}, {"keepdim", false}}}};
}

void add_arg(std::map<std::string, Spec>& m, const std::string& name, bool is_max, bool with_values) {
  Spec s;
  s.cases = [] { return arg_cases(); };
  s.ref = [is_max, with_values](const std::vector<R>& in, const Attrs& a) {
    const int64_t dim = a.i("dim");
    const bool keep = a.b("keepdim");
    const Shape dims = in[0].shape.empty() ? Shape{} : Shape{dim};
    auto best = [&](const std::vector<double>& g, bool idx) {
      size_t b = 0;
      for (size_t i = 1; i < g.size(); ++i) if (is_max ? g[i] > g[b] : g[i] < g[b]) b = i;
      return idx ? double(b) : g[b];
    };
    std::vector<R> out;
    if (with_values) out.push_back(reduce_ref(in[0], dims, keep, in[0].dtype, [&](auto& g) { return best(g, false); }));
    out.push_back(reduce_ref(in[0], dims, keep, DType::i64, [&](auto& g) { return best(g, true); }));
    if (in[0].shape.empty()) for (auto& r : out) r.shape = {};
    return out;
  };
  s.bad = [] {
    return std::vector<Case>{{{rn({2, 3})}, {{"dim", int64_t(2)}, {"keepdim", false}}},
                             {{rn({2, 0})}, {{"dim", int64_t(1)}, {"keepdim", false}}}};
  };
  if (with_values)
    s.grad_cases = [] {
      std::vector<Case> c;
      for (auto& k : arg_cases()) if (k.in[0].numel() > 0 && is_floating(k.in[0].dtype())) c.push_back(k);
      return small_f64(c);
    };
  m[name] = s;
}


std::vector<Case> dim_cases(std::function<Tensor(const Shape&)> gen) {
  return {{{gen({7})}, {{"dim", int64_t(0)}}},       {{gen({3, 4})}, {{"dim", int64_t(1)}}},
          {{gen({3, 4})}, {{"dim", int64_t(0)}}},    {{gen({2, 3, 4})}, {{"dim", int64_t(-2)}}},
          {{gen({2, 0, 4})}, {{"dim", int64_t(2)}}}, {{gen({})}, {{"dim", int64_t(0)}}},
          {{gen({5, 1})}, {{"dim", int64_t(1)}}},    {{gen({16, 300})}, {{"dim", int64_t(1)}}}};
}

}  // namespace

// Defined in op_specs_more.cpp: shape, linalg, nn and index ops.
void add_more_specs(std::map<std::string, Spec>& m);
void add_attention_specs(std::map<std::string, Spec>& m);  // op_specs_attention.cpp
// Defined in op_specs_backward.cpp: the fused backward ops (needs the forward specs first).
void add_backward_specs(std::map<std::string, Spec>& m);
void add_sparse_specs(std::map<std::string, Spec>& m);
void add_dist_specs(std::map<std::string, Spec>& m);
void add_state_specs(std::map<std::string, Spec>& m);  // op_specs_state.cpp
void add_fused_specs(std::map<std::string, Spec>& m);  // op_specs_fused.cpp (needs the linear spec)
void add_kernel_specs(std::map<std::string, Spec>& m);  // op_specs_kernels.cpp

const std::map<std::string, Spec>& op_specs() {
  static const std::map<std::string, Spec> specs = [] {
    std::map<std::string, Spec> m;
    auto positive = [](const Shape& s) { return pos(s); };
    add_unary(m, "neg", [](double x) { return -x; }, true);
    add_unary(m, "abs", [](double x) { return std::fabs(x); }, true);
    add_unary(m, "exp", [](double x) { return std::exp(x); }, false);
    add_unary(m, "log", [](double x) { return std::log(x); }, false, positive);
    add_unary(m, "sqrt", [](double x) { return std::sqrt(x); }, false, positive);
    add_unary(m, "rsqrt", [](double x) { return 1 / std::sqrt(x); }, false, positive);
    add_unary(m, "sin", [](double x) { return std::sin(x); }, false);
    add_unary(m, "cos", [](double x) { return std::cos(x); }, false);
    add_unary(m, "tanh", [](double x) { return std::tanh(x); }, false);
    add_unary(m, "sigmoid", [](double x) { return 1 / (1 + std::exp(-x)); }, false);
    add_unary(m, "relu", [](double x) { return x > 0 ? x : 0; }, true);
    add_unary(m, "gelu", gelu_ref, false);
    add_unary(m, "gelu_tanh", gelu_tanh_ref, false);
    add_unary(m, "silu", [](double x) { return x / (1 + std::exp(-x)); }, false);
    add_unary(m, "erf", [](double x) { return std::erf(x); }, false);
    // The int case of the `keep` ops expects truncation toward zero, as C++ does.
    add_binary(m, "add", [](double a, double b) { return a + b; }, false);
    add_binary(m, "sub", [](double a, double b) { return a - b; }, false);
    add_binary(m, "mul", [](double a, double b) { return a * b; }, false);
    add_binary(m, "div", [](double a, double b) { return a / b; }, false, true, [](const Shape& s) { return rn(s); },
               [](const Shape& s) { return pos(s); });
    add_binary(m, "pow", [](double a, double b) { return std::pow(a, b); }, false, false, positive,
               [](const Shape& s) { return rn(s); });
    add_binary(m, "maximum", [](double a, double b) { return std::max(a, b); }, false);
    add_binary(m, "minimum", [](double a, double b) { return std::min(a, b); }, false);
    // Fused activation derivatives g f'(x), against central differences of the double references.
    auto fd = [](double (*f)(double)) {
      return [f](double g, double x) { const double h = 1e-5; return g * (f(x + h) - f(x - h)) / (2 * h); };
    };
    add_binary(m, "gelu_backward", fd(gelu_ref), false, true);
    add_binary(m, "gelu_tanh_backward", fd(gelu_tanh_ref), false, true);
    add_binary(m, "silu_backward", fd([](double x) { return x / (1 + std::exp(-x)); }), false, true);
    add_binary(m, "eq", [](double a, double b) { return double(a == b); }, true);
    add_binary(m, "ne", [](double a, double b) { return double(a != b); }, true);
    add_binary(m, "lt", [](double a, double b) { return double(a < b); }, true);
    add_binary(m, "le", [](double a, double b) { return double(a <= b); }, true);
    add_binary(m, "gt", [](double a, double b) { return double(a > b); }, true);
    add_binary(m, "ge", [](double a, double b) { return double(a >= b); }, true);
    // Integer cases of comparisons should see equal values sometimes.
    {
      Spec& eq = m["eq"];
      auto base = eq.cases;
      eq.cases = [base] {
        auto c = base();
        Tensor a = ints({20}, 0, 3);
        c.push_back({{a, ints({20}, 0, 3)}, {}});
        c.push_back({{a, a.to(DType::f32)}, {}});
        return c;
      };
    }

    Spec w;
    w.cases = [] {
      return std::vector<Case>{{{bools({3, 4}), rn({3, 4}), rn({4})}, {}},
                               {{bools({4}), rn({2, 1}), rn({})}, {}},
                               {{bools({0, 2}), rn({1, 2}), rn({2})}, {}},
                               {{bools({5}), ints({5}, 0, 9), rn({5}, DType::f64)}, {}}};
    };
    w.ref = [](const std::vector<R>& in, const Attrs&) {
      return std::vector<R>{mapn(in, promote_types(in[1].dtype, in[2].dtype),
                                 [](const std::vector<double>& a) { return a[0] != 0 ? a[1] : a[2]; })};
    };
    w.bad = [] {
      return std::vector<Case>{{{rn({3}), rn({3}), rn({3})}, {}}, {{bools({3}), rn({4}), rn({3})}, {}}};
    };
    w.grad_cases = [] { return small_f64({{{bools({3, 4}), rn({3, 4}), rn({4})}, {}}, {{bools({4}), rn({2, 1}), rn({})}, {}}}); };
    m["where"] = w;

    Spec cl;
    cl.cases = [] {
      return std::vector<Case>{{{rn({5, 6})}, {{"min", -0.5}, {"max", 0.5}}},
                               {{rn({7})}, {{"min", 0.0}}},
                               {{rn({0})}, {{"max", 1.0}}},
                               {{ints({8}, -9, 9, DType::i32)}, {{"min", int64_t(-2)}, {"max", int64_t(3)}}}};
    };
    cl.ref = [](const std::vector<R>& in, const Attrs& a) {
      return std::vector<R>{map1(in[0], in[0].dtype, [&](double x) {
        if (a.has("min")) x = std::max(x, a.f("min"));
        if (a.has("max")) x = std::min(x, a.f("max"));
        return x;
      })};
    };
    cl.bad = [] { return std::vector<Case>{{{bools({2})}, {{"min", 0.0}}}, {{rn({2})}, {{"min", 1.0}, {"max", 0.0}}}}; };
    cl.grad_cases = [] { return small_f64({{{rn({5, 6})}, {{"min", -0.5}, {"max", 0.5}}}, {{rn({7})}, {{"min", 0.0}}}}); };
    m["clamp"] = cl;

    Spec cs;
    cs.cases = [] {
      return std::vector<Case>{{{rn({3, 4}) * 10.0}, {{"dtype", DType::i32}}}, {{rn({9})}, {{"dtype", DType::bf16}}},
                               {{rn({9})}, {{"dtype", DType::f16}}},         {{ints({4}, -9, 9)}, {{"dtype", DType::f64}}},
                               {{bools({5})}, {{"dtype", DType::f32}}},      {{rn({5})}, {{"dtype", DType::boolean}}},
                               {{ints({6}, 0, 200)}, {{"dtype", DType::u8}}}, {{rn({0, 2})}, {{"dtype", DType::i8}}}};
    };
    cs.ref = [](const std::vector<R>& in, const Attrs& a) {
      const DType dt = a.dtype("dtype");
      return std::vector<R>{map1(in[0], dt, [dt](double x) {
        switch (dt) {
          case DType::bf16: return double(float(bf16(float(x))));
          case DType::f16: return double(float(f16(float(x))));
          case DType::f32: return double(float(x));
          case DType::boolean: return double(x != 0);
          case DType::f64: return x;
          default: return std::trunc(x);
        }
      })};
    };
    cs.bad = [] { return std::vector<Case>{{{rn({2}), rn({2})}, {{"dtype", DType::f32}}}}; };
    cs.grad_cases = [] { return small_f64({{{rn({3, 4})}, {{"dtype", DType::f64}}}}); };  // f32 output would drown finite differences
    m["cast"] = cs;

    add_reduce(m, "sum", [](const std::vector<double>& g) { return std::accumulate(g.begin(), g.end(), 0.0); }, false, true);
    add_reduce(m, "mean", [](const std::vector<double>& g) { return std::accumulate(g.begin(), g.end(), 0.0) / double(g.size()); },
               true, false);
    add_reduce(m, "prod", [](const std::vector<double>& g) { return std::accumulate(g.begin(), g.end(), 1.0, std::multiplies<>()); },
               false, true, [](const Shape& s) { return (rand(s, DType::f64) * 0.5 + 0.75).to(DType::f32); });
    add_reduce(m, "logsumexp", [](const std::vector<double>& g) {
      double mx = -INFINITY, s = 0;
      for (double v : g) mx = std::max(mx, v);
      if (std::isinf(mx)) return mx;
      for (double v : g) s += std::exp(v - mx);
      return mx + std::log(s);
    }, true, false);
    {
      Spec v;
      auto cases = [] {
        std::vector<Case> c;
        int64_t corr = 0;
        for (auto& k : reduce_cases([](const Shape& s) { return rn(s); }, false)) {
          k.attrs.set("correction", corr);
          corr = 1 - corr;
          c.push_back(k);
        }
        return c;
      };
      v.cases = cases;
      v.ref = [](const std::vector<R>& in, const Attrs& a) {
        const double corr = double(a.i("correction"));
        return std::vector<R>{reduce_ref(in[0], a.ints("dims"), a.b("keepdim"), in[0].dtype, [&](const std::vector<double>& g) {
          double mu = 0, ss = 0;
          for (double x : g) mu += x;
          mu /= double(g.size());
          for (double x : g) ss += (x - mu) * (x - mu);
          return ss / std::max(0.0, double(g.size()) - corr);
        })};
      };
      v.bad = [] {
        return std::vector<Case>{{{ints({3}, 0, 3)}, {{"dims", Shape{}}, {"keepdim", false}, {"correction", int64_t(1)}}},
                                 {{rn({3})}, {{"dims", Shape{3}}, {"keepdim", false}, {"correction", int64_t(1)}}}};
      };
      v.grad_cases = [cases] {
        std::vector<Case> c;
        for (auto& k : cases()) {
          const auto dims = k.attrs.ints("dims");
          int64_t n = 1;
          for (int64_t d : dims) n *= k.in[0].size(d);
          if (dims.empty()) n = k.in[0].numel();
          if (k.in[0].numel() <= 40 && n > 1) c.push_back(k);
        }
        return small_f64(c);
      };
      m["var"] = v;
    }
    add_arg(m, "max_dim", true, true);
    add_arg(m, "min_dim", false, true);
    add_arg(m, "argmax", true, false);
    add_arg(m, "argmin", false, false);
    for (bool log : {false, true}) {
      Spec s;
      s.cases = [] { return dim_cases([](const Shape& sh) { return rn(sh); }); };
      s.ref = [log](const std::vector<R>& in, const Attrs& a) {
        const int64_t n = in[0].shape.empty() ? 1 : in[0].shape[size_t(wrap(a.i("dim"), int64_t(in[0].shape.size())))];
        return std::vector<R>{along(in[0], a.i("dim"), n, in[0].dtype, [log](auto& l) { return softmax_line(l, log); })};
      };
      s.bad = [] { return std::vector<Case>{{{rn({2, 3})}, {{"dim", int64_t(2)}}}, {{ints({3}, 0, 2)}, {{"dim", int64_t(0)}}}}; };
      s.grad_cases = [] { return small_f64(dim_cases([](const Shape& sh) { return rn(sh); })); };
      m[log ? "log_softmax" : "softmax"] = s;
    }
    {
      Spec s;
      s.cases = [] {
        auto c = dim_cases([](const Shape& sh) { return rn(sh); });
        c.push_back({{ints({3, 4}, -5, 5, DType::i32)}, {{"dim", int64_t(1)}}});
        c.push_back({{rn({9, 45})}, {{"dim", int64_t(1)}}});  // rows in fours and one alone; vectors and a tail
        c.push_back({{rn({5, 21}).to(DType::f64)}, {{"dim", int64_t(-1)}}});
        return c;
      };
      s.ref = [](const std::vector<R>& in, const Attrs& a) {
        const int64_t n = in[0].shape.empty() ? 1 : in[0].shape[size_t(wrap(a.i("dim"), int64_t(in[0].shape.size())))];
        const DType dt = is_floating(in[0].dtype) ? in[0].dtype : DType::i64;
        return std::vector<R>{along(in[0], a.i("dim"), n, dt, [](auto& l) {
          std::vector<double> o;
          double acc = 0;
          for (double v : l) o.push_back(acc += v);
          return o;
        })};
      };
      s.bad = [] { return std::vector<Case>{{{rn({2, 3})}, {{"dim", int64_t(-3)}}}}; };
      s.grad_cases = [] { return small_f64(dim_cases([](const Shape& sh) { return rn(sh); })); };
      m["cumsum"] = s;
    }
    add_more_specs(m);
    add_attention_specs(m);
    add_backward_specs(m);
    add_sparse_specs(m);
    add_dist_specs(m);
    add_state_specs(m);
    add_fused_specs(m);
    add_kernel_specs(m);
    return m;
  }();
  return specs;
}

}  // namespace sinter::test

// Specs for the ops that write their inputs in place (add_, sub_, mul_, div_, fill_, copy_ and the
// optimizer updates), the factories (full, arange, linspace, eye, rand, randn, randint,
// rope_cos_sin), item and sum_squares, against plain loops in double. Random factories are
// checked against the Philox draws they document.
#include <cmath>

#include "op_specs.h"
#include "sinter/random.h"

namespace sinter::test {
using namespace spec;
namespace {

double round_to(DType dt, double x) {
  switch (dt) {
    case DType::f32: return double(float(x));
    case DType::bf16: return double(float(bf16(float(x))));
    case DType::f16: return double(float(f16(float(x))));
    case DType::f64: return x;
    case DType::boolean: return x != 0;
    default: return std::trunc(x);
  }
}

// x broadcast to `shape` (trailing alignment), row-major.
std::vector<double> spread_to(const R& x, const Shape& shape) {
  std::vector<double> out(size_t(shape.numel()));
  for (int64_t i = 0; i < shape.numel(); ++i) {
    const auto idx = unravel(i, shape);
    int64_t lin = 0;
    const size_t off = shape.size() - x.shape.size();
    for (size_t d = 0; d < x.shape.size(); ++d) lin = lin * x.shape[d] + (x.shape[d] == 1 ? 0 : idx[off + d]);
    out[size_t(i)] = x.v[size_t(lin)];
  }
  return out;
}

void add_inplace(std::map<std::string, Spec>& m, const std::string& name, double (*f)(double, double)) {
  Spec s;
  const bool div = name == "div_";
  s.cases = [div] {
    auto other = [div](const Shape& sh, DType dt = DType::f32) {
      return div ? (rand(sh, DType::f64) + 0.5).to(dt) : rn(sh, dt);
    };
    std::vector<Case> c{{{rn({3, 4}), other({3, 4})}, {}},
                        {{rn({2, 3, 4}), other({4})}, {}},           // broadcast into the target
                        {{rn({5}), other({5}, DType::f64)}, {}},     // cast to the target's dtype
                        {{rn({4}, DType::bf16), other({4})}, {}},
                        {{rn({0, 3}), other({3})}, {}}};
    if (!div) c.push_back({{ints({6}, -5, 5, DType::i32), ints({6}, -3, 3)}, {}});
    return c;
  };
  s.ref = [f](const std::vector<R>& in, const Attrs&) {
    R out = in[0];
    const std::vector<double> o = spread_to(in[1], in[0].shape);
    for (size_t i = 0; i < out.v.size(); ++i) out.v[i] = round_to(out.dtype, f(in[0].v[i], round_to(out.dtype, o[i])));
    return std::vector<R>{out};
  };
  s.bad = [div] {
    std::vector<Case> b{{{rn({3}), rn({2, 3})}, {}},                  // would grow the target
                        {{ints({3}, 0, 3), rn({3})}, {}},             // float result into an int tensor
                        {{bools({3}), bools({3})}, {}},
                        {{rn({3}).requires_grad_(), rn({3})}, {}}};   // a tensor that requires grad, grad mode on
    if (div) b.push_back({{ints({3}, 1, 3), ints({3}, 1, 3)}, {}});
    return b;
  };
  m[name] = s;
}

Attrs adamw_attrs(double wd) { return {{"beta1", 0.9}, {"beta2", 0.95}, {"eps", 1e-8}, {"weight_decay", wd}}; }

}  // namespace

void add_state_specs(std::map<std::string, Spec>& m) {
  add_inplace(m, "add_", [](double a, double b) { return a + b; });
  add_inplace(m, "sub_", [](double a, double b) { return a - b; });
  add_inplace(m, "mul_", [](double a, double b) { return a * b; });
  add_inplace(m, "div_", [](double a, double b) { return a / b; });

  Spec fl;
  fl.cases = [] {
    return std::vector<Case>{{{rn({3, 4})}, {{"value", 2.5}}}, {{ints({5}, 0, 9, DType::i32)}, {{"value", -3.0}}},
                             {{rn({0})}, {{"value", 1.0}}}, {{rn({4}, DType::bf16)}, {{"value", 0.1}}}};
  };
  fl.ref = [](const std::vector<R>& in, const Attrs& a) {
    R out = in[0];
    for (double& v : out.v) v = round_to(out.dtype, a.f("value"));
    return std::vector<R>{out};
  };
  fl.bad = [] { return std::vector<Case>{{{rn({3})}, {}}, {{rn({3}).requires_grad_()}, {{"value", 1.0}}}}; };
  m["fill_"] = fl;

  Spec cp;
  cp.cases = [] {
    Tensor base = rn({6});
    return std::vector<Case>{{{rn({3, 4}), rn({3, 4})}, {}}, {{rn({2, 3}), rn({3})}, {}},
                             {{ints({4}, 0, 9, DType::i32), rn({4}) * 5.0}, {}}, {{rn({5}, DType::f64), rn({5}, DType::bf16)}, {}},
                             {{base.narrow(0, 0, 4), base.narrow(0, 2, 4)}, {}}};  // overlapping views of one storage
  };
  cp.ref = [](const std::vector<R>& in, const Attrs&) {
    R out = in[0];
    const std::vector<double> src = spread_to(in[1], in[0].shape);
    for (size_t i = 0; i < out.v.size(); ++i) out.v[i] = round_to(out.dtype, src[i]);
    return std::vector<R>{out};
  };
  cp.bad = [] { return std::vector<Case>{{{rn({3}), rn({2, 3})}, {}}, {{rn({2}).requires_grad_(), rn({2})}, {}}}; };
  m["copy_"] = cp;

  // ---- positions held in a tensor ----
  auto at = [](int64_t s) { return full({}, double(s), DType::i64); };
  Spec ds;
  ds.cases = [at] {
    return std::vector<Case>{{{rn({5, 3}), at(2)}, {{"dim", int64_t(0)}, {"length", int64_t(3)}}},
                             {{rn({2, 6, 4}), at(0)}, {{"dim", int64_t(1)}, {"length", int64_t(1)}}},
                             {{rn({4, 7}), at(7)}, {{"dim", int64_t(-1)}, {"length", int64_t(0)}}}};
  };
  ds.ref = [](const std::vector<R>& in, const Attrs& a) {
    const int64_t nd = int64_t(in[0].shape.size()), dim = wrap(a.i("dim"), nd), s0 = int64_t(in[1].v[0]), n = a.i("length");
    Shape os = in[0].shape;
    os[size_t(dim)] = n;
    R out{os, std::vector<double>(size_t(os.numel())), in[0].dtype};
    for (int64_t i = 0; i < os.numel(); ++i) {
      auto idx = unravel(i, os);
      idx[size_t(dim)] += s0;
      out.v[size_t(i)] = in[0].v[size_t(ravel(idx, in[0].shape))];
    }
    return std::vector<R>{out};
  };
  ds.bad = [at] {
    return std::vector<Case>{{{rn({5, 3}), at(4)}, {{"dim", int64_t(0)}, {"length", int64_t(3)}}},   // past the end (at run time)
                             {{rn({5, 3}), at(-1)}, {{"dim", int64_t(0)}, {"length", int64_t(1)}}},
                             {{rn({5, 3}), full({1}, 0.0, DType::i64)}, {{"dim", int64_t(0)}, {"length", int64_t(1)}}},
                             {{rn({5, 3}), at(0)}, {{"dim", int64_t(0)}, {"length", int64_t(6)}}}};
  };
  m["dynamic_slice"] = ds;

  Spec su;
  su.cases = [at] {
    return std::vector<Case>{{{rn({1, 2, 8, 4}), rn({1, 2, 1, 4}), at(5)}, {{"dim", int64_t(2)}}},  // a KV cache write
                             {{rn({6, 3}), rn({2, 3}), at(0)}, {{"dim", int64_t(0)}}},
                             {{rn({6, 3}), rn({6, 3}, DType::f64), at(0)}, {{"dim", int64_t(0)}}}};
  };
  su.ref = [](const std::vector<R>& in, const Attrs& a) {
    R out = in[0];
    const int64_t nd = int64_t(in[0].shape.size()), dim = wrap(a.i("dim"), nd), s0 = int64_t(in[2].v[0]);
    for (int64_t i = 0; i < in[1].shape.numel(); ++i) {
      auto idx = unravel(i, in[1].shape);
      idx[size_t(dim)] += s0;
      out.v[size_t(ravel(idx, in[0].shape))] = round_to(out.dtype, in[1].v[size_t(i)]);
    }
    return std::vector<R>{out};
  };
  su.bad = [at] {
    return std::vector<Case>{{{rn({6, 3}), rn({2, 3}), at(5)}, {{"dim", int64_t(0)}}},  // past the end (at run time)
                             {{rn({6, 3}), rn({2, 4}), at(0)}, {{"dim", int64_t(0)}}},
                             {{rn({6, 3}), rn({2, 3}), full({}, 0.0, DType::f32)}, {{"dim", int64_t(0)}}},
                             {{rn({6, 3}).requires_grad_(), rn({2, 3}), at(0)}, {{"dim", int64_t(0)}}}};
  };
  m["slice_update_"] = su;

  // kv_append_: both caches written at start (effects: writes 0, writes 1), and a fresh end.
  Spec ka;
  ka.cases = [at] {
    return std::vector<Case>{{{rn({1, 2, 8, 4}), rn({1, 2, 8, 4}), rn({1, 2, 1, 4}), rn({1, 2, 1, 4}), at(5)}, {{"dim", int64_t(2)}}},
                             {{rn({6, 3}), rn({6, 3}), rn({2, 3}), rn({2, 3}), at(4)}, {{"dim", int64_t(0)}}}};
  };
  ka.ref = [](const std::vector<R>& in, const Attrs& a) {
    std::vector<R> out{in[0], in[1], R{{}, {in[4].v[0] + double(in[2].shape[size_t(wrap(a.i("dim"), int64_t(in[0].shape.size())))])}, DType::i64}};
    const int64_t nd = int64_t(in[0].shape.size()), dim = wrap(a.i("dim"), nd), s0 = int64_t(in[4].v[0]);
    for (size_t c = 0; c < 2; ++c)
      for (int64_t i = 0; i < in[2 + c].shape.numel(); ++i) {
        auto idx = unravel(i, in[2 + c].shape);
        idx[size_t(dim)] += s0;
        out[c].v[size_t(ravel(idx, in[c].shape))] = round_to(out[c].dtype, in[2 + c].v[size_t(i)]);
      }
    return out;
  };
  ka.bad = [at] {
    return std::vector<Case>{{{rn({6, 3}), rn({6, 3}), rn({2, 3}), rn({2, 3}), at(5)}, {{"dim", int64_t(0)}}},  // past the end
                             {{rn({6, 3}), rn({6, 3}), rn({2, 3}), rn({2, 4}), at(0)}, {{"dim", int64_t(0)}}},
                             {{rn({6, 3}), rn({6, 3}), rn({2, 3}), rn({2, 3}, DType::f64), at(0)}, {{"dim", int64_t(0)}}},
                             {{rn({6, 3}).requires_grad_(), rn({6, 3}), rn({2, 3}), rn({2, 3}), at(0)}, {{"dim", int64_t(0)}}}};
  };
  m["kv_append_"] = ka;

  // ---- factories ----
  Spec fu;
  fu.cases = [] {
    return std::vector<Case>{{{}, {{"shape", Shape{2, 3}}, {"value", 1.5}, {"dtype", DType::f32}}},
                             {{}, {{"shape", Shape{}}, {"value", -2.0}, {"dtype", DType::i64}}},
                             {{}, {{"shape", Shape{0, 4}}, {"value", 3.0}, {"dtype", DType::bf16}}},
                             {{}, {{"shape", Shape{4}}, {"value", 1.0}, {"dtype", DType::boolean}}}};
  };
  fu.ref = [](const std::vector<R>&, const Attrs& a) {
    const Shape& s = a.ints("shape");
    return std::vector<R>{R{s, std::vector<double>(size_t(s.numel()), round_to(a.dtype("dtype"), a.f("value"))), a.dtype("dtype")}};
  };
  fu.bad = [] {
    return std::vector<Case>{{{}, {{"shape", Shape{-1}}, {"value", 0.0}, {"dtype", DType::f32}}}, {{}, {{"shape", Shape{2}}}}};
  };
  m["full"] = fu;

  Spec ar;
  ar.cases = [] {
    return std::vector<Case>{{{}, {{"start", 0.0}, {"end", 5.0}, {"step", 1.0}, {"dtype", DType::i64}}},
                             {{}, {{"start", 1.0}, {"end", -2.0}, {"step", -0.5}, {"dtype", DType::f32}}},
                             {{}, {{"start", 0.1}, {"end", 1.0}, {"step", 0.3}, {"dtype", DType::f64}}},
                             {{}, {{"start", 2.0}, {"end", 2.0}, {"step", 1.0}, {"dtype", DType::f32}}}};
  };
  ar.ref = [](const std::vector<R>&, const Attrs& a) {
    const double start = a.f("start"), end = a.f("end"), step = a.f("step");
    const int64_t n = int64_t(std::ceil((end - start) / step));
    R out{{n}, {}, a.dtype("dtype")};
    for (int64_t i = 0; i < n; ++i) out.v.push_back(round_to(out.dtype, start + double(i) * step));
    return std::vector<R>{out};
  };
  ar.bad = [] {
    return std::vector<Case>{{{}, {{"start", 0.0}, {"end", 5.0}, {"step", 0.0}, {"dtype", DType::f32}}},
                             {{}, {{"start", 0.0}, {"end", 5.0}, {"step", -1.0}, {"dtype", DType::f32}}},
                             {{}, {{"start", 0.0}, {"end", INFINITY}, {"step", 1.0}, {"dtype", DType::f32}}}};
  };
  m["arange"] = ar;

  Spec ls;
  ls.cases = [] {
    return std::vector<Case>{{{}, {{"start", -1.0}, {"end", 1.0}, {"steps", int64_t(5)}, {"dtype", DType::f32}}},
                             {{}, {{"start", 0.0}, {"end", 1.0}, {"steps", int64_t(1)}, {"dtype", DType::f64}}},
                             {{}, {{"start", 0.0}, {"end", 1.0}, {"steps", int64_t(0)}, {"dtype", DType::f32}}}};
  };
  ls.ref = [](const std::vector<R>&, const Attrs& a) {
    const int64_t n = a.i("steps");
    R out{{n}, {}, a.dtype("dtype")};
    for (int64_t i = 0; i < n; ++i)
      out.v.push_back(round_to(out.dtype, n > 1 ? a.f("start") + (a.f("end") - a.f("start")) * double(i) / double(n - 1) : a.f("start")));
    return std::vector<R>{out};
  };
  ls.rtol = ls.atol = 1e-12;
  ls.bad = [] { return std::vector<Case>{{{}, {{"start", 0.0}, {"end", 1.0}, {"steps", int64_t(-1)}, {"dtype", DType::f32}}}}; };
  m["linspace"] = ls;

  Spec ey;
  ey.cases = [] {
    return std::vector<Case>{{{}, {{"n", int64_t(3)}, {"m", int64_t(3)}, {"dtype", DType::f32}}},
                             {{}, {{"n", int64_t(2)}, {"m", int64_t(4)}, {"dtype", DType::i64}}},
                             {{}, {{"n", int64_t(0)}, {"m", int64_t(0)}, {"dtype", DType::f32}}}};
  };
  ey.ref = [](const std::vector<R>&, const Attrs& a) {
    const int64_t n = a.i("n"), k = a.i("m");
    R out{{n, k}, std::vector<double>(size_t(n * k), 0.0), a.dtype("dtype")};
    for (int64_t i = 0; i < std::min(n, k); ++i) out.v[size_t(i * k + i)] = 1;
    return std::vector<R>{out};
  };
  ey.bad = [] { return std::vector<Case>{{{}, {{"n", int64_t(-2)}, {"m", int64_t(2)}, {"dtype", DType::f32}}}}; };
  m["eye"] = ey;

  // Random factories: element i comes from Philox block (counter + i / per_block), word i % per_block.
  auto random_attrs = [](Shape s, DType dt, int64_t seed, int64_t ctr) {
    return Attrs{{"shape", s}, {"dtype", dt}, {"seed", seed}, {"counter", ctr}};
  };
  auto draws = [](const Attrs& a, int64_t n, int per_block) {
    std::vector<std::vector<uint32_t>> blocks;
    for (int64_t b = 0; b * per_block < n; ++b) {
      uint32_t r[4];
      philox(uint64_t(a.i("seed")), uint64_t(a.i("counter") + b), r);
      blocks.push_back({r[0], r[1], r[2], r[3]});
    }
    return blocks;
  };
  Spec ra;
  ra.cases = [random_attrs] {
    return std::vector<Case>{{{}, random_attrs({3, 5}, DType::f32, 7, 0)}, {{}, random_attrs({6}, DType::f64, 1, 9)},
                             {{}, random_attrs({4}, DType::bf16, 3, 2)},
                             {{}, random_attrs({201}, DType::f32, 5, 4294967291)}};  // batches, a tail, a carry
  };
  ra.ref = [draws](const std::vector<R>&, const Attrs& a) {
    const Shape& s = a.ints("shape");
    R out{s, {}, a.dtype("dtype")};
    const auto b = draws(a, s.numel(), 4);
    for (int64_t i = 0; i < s.numel(); ++i) out.v.push_back(round_to(out.dtype, double(float(b[size_t(i / 4)][size_t(i % 4)] >> 8) / 16777216.0)));
    return std::vector<R>{out};
  };
  ra.bad = [random_attrs] { return std::vector<Case>{{{}, random_attrs({3}, DType::i64, 0, 0)}}; };
  m["rand"] = ra;

  Spec rd;
  rd.cases = [random_attrs] {
    return std::vector<Case>{{{}, random_attrs({3, 5}, DType::f32, 7, 0)}, {{}, random_attrs({7}, DType::f64, 2, 4)},
                             {{}, random_attrs({3, 67}, DType::f32, 6, 4294967290)}};
  };
  rd.ref = [draws](const std::vector<R>&, const Attrs& a) {
    const Shape& s = a.ints("shape");
    R out{s, {}, a.dtype("dtype")};
    const auto b = draws(a, s.numel(), 4);
    for (int64_t i = 0; i < s.numel(); ++i) {  // Box-Muller on each pair of words
      const auto& r = b[size_t(i / 4)];
      const int k = int(i % 4) / 2 * 2;
      const double u1 = (double(r[size_t(k)]) + 1.0) / 4294967296.0, u2 = double(r[size_t(k + 1)]) / 4294967296.0;
      const double rad = std::sqrt(-2.0 * std::log(u1)), th = 6.283185307179586 * u2;
      out.v.push_back(round_to(out.dtype, i % 2 == 0 ? rad * std::cos(th) : rad * std::sin(th)));
    }
    return std::vector<R>{out};
  };
  rd.bad = [random_attrs] { return std::vector<Case>{{{}, random_attrs({3}, DType::i32, 0, 0)}}; };
  m["randn"] = rd;

  Spec ri;
  ri.cases = [] {
    return std::vector<Case>{{{}, {{"low", int64_t(-3)}, {"high", int64_t(7)}, {"shape", Shape{5, 3}}, {"dtype", DType::i64},
                                   {"seed", int64_t(4)}, {"counter", int64_t(1)}}},
                             {{}, {{"low", int64_t(0)}, {"high", int64_t(2)}, {"shape", Shape{9}}, {"dtype", DType::i32},
                                   {"seed", int64_t(8)}, {"counter", int64_t(0)}}},
                             {{}, {{"low", int64_t(-9)}, {"high", int64_t(1000003)}, {"shape", Shape{75}}, {"dtype", DType::i64},
                                   {"seed", int64_t(4)}, {"counter", int64_t(4294967295)}}}};
  };
  ri.ref = [draws](const std::vector<R>&, const Attrs& a) {
    const Shape& s = a.ints("shape");
    R out{s, {}, a.dtype("dtype")};
    const auto b = draws(a, s.numel(), 2);
    for (int64_t i = 0; i < s.numel(); ++i) {
      const auto& r = b[size_t(i / 2)];
      const uint64_t x = (uint64_t(r[size_t(2 * (i % 2))]) << 32) | r[size_t(2 * (i % 2) + 1)];
      out.v.push_back(double(a.i("low") + int64_t(x % uint64_t(a.i("high") - a.i("low")))));
    }
    return std::vector<R>{out};
  };
  ri.bad = [] {
    return std::vector<Case>{{{}, {{"low", int64_t(3)}, {"high", int64_t(3)}, {"shape", Shape{2}}, {"dtype", DType::i64},
                                   {"seed", int64_t(0)}, {"counter", int64_t(0)}}}};
  };
  m["randint"] = ri;

  Spec rc;
  rc.cases = [] {
    return std::vector<Case>{{{}, {{"seq_len", int64_t(5)}, {"dim", int64_t(8)}, {"theta", 10000.0}, {"sin", false}}},
                             {{}, {{"seq_len", int64_t(7)}, {"dim", int64_t(4)}, {"theta", 500.0}, {"sin", true}}}};
  };
  rc.ref = [](const std::vector<R>&, const Attrs& a) {
    const int64_t T = a.i("seq_len"), D = a.i("dim");
    R out{{T, D / 2}, {}, DType::f32};
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < D / 2; ++i) {
        const double ang = double(t) / std::pow(a.f("theta"), 2.0 * double(i) / double(D));
        out.v.push_back(double(float(a.b("sin") ? std::sin(ang) : std::cos(ang))));
      }
    return std::vector<R>{out};
  };
  rc.bad = [] { return std::vector<Case>{{{}, {{"seq_len", int64_t(5)}, {"dim", int64_t(7)}, {"theta", 1.0}, {"sin", false}}}}; };
  m["rope_cos_sin"] = rc;

  // ---- reading data, norms ----
  Spec it;
  it.cases = [] {
    return std::vector<Case>{{{rn({1, 1})}, {}}, {{ints({}, -9, 9)}, {}}, {{rn({1}, DType::bf16)}, {}}};
  };
  it.ref = [](const std::vector<R>& in, const Attrs&) { return std::vector<R>{R{{}, in[0].v, in[0].dtype}}; };
  it.bad = [] { return std::vector<Case>{{{rn({2})}, {}}, {{rn({0})}, {}}}; };
  m["item"] = it;

  Spec td;  // to_device on the CPU: a contiguous copy (tests/cuda_test.cpp copies to and from CUDA)
  td.cases = [] {
    const Attrs cpu{{"device", Device::cpu()}};
    return std::vector<Case>{{{rn({3, 4})}, cpu}, {{rn({2, 3}, DType::bf16)}, cpu}, {{ints({5}, -9, 9)}, cpu}, {{rn({0, 2})}, cpu}};
  };
  td.ref = [](const std::vector<R>& in, const Attrs&) { return std::vector<R>{in[0]}; };
  td.bad = [] { return std::vector<Case>{{{rn({2})}, {}}}; };  // no device
  td.grad_cases = [] { return std::vector<Case>{{{rn({2, 3}, DType::f64)}, {{"device", Device::cpu()}}}}; };
  m["to_device"] = td;

  Spec ss;
  ss.cases = [] {
    return std::vector<Case>{{{rn({3, 4})}, {}}, {{rn({5}), rn({2, 2}, DType::f64), rn({3}, DType::bf16)}, {}}, {{rn({0})}, {}},
                             {{rn({70000})}, {}}};
  };
  ss.ref = [](const std::vector<R>& in, const Attrs&) {
    double s = 0;
    for (auto& r : in)
      for (double v : r.v) s += v * v;
    return std::vector<R>{R{{}, {s}, DType::f64}};
  };
  ss.rtol = 1e-12;
  ss.bad = [] { return std::vector<Case>{{{rn({3}), ints({2}, 0, 3)}, {}}}; };
  ss.grad_cases = [] { return small_f64({{{rn({3, 4}), rn({5})}, {}}}); };
  m["sum_squares"] = ss;

  // ---- optimizer updates ----
  Spec aw;
  aw.cases = [] {
    auto c = [](const Shape& s, double lr, int64_t step, double wd) {
      return Case{{rn(s), rn(s), rn(s) * 0.1, (rand(s, DType::f64) * 0.01).to(DType::f32), full({}, lr, DType::f64),
                   full({}, double(step), DType::i64)},
                  adamw_attrs(wd)};
    };
    return std::vector<Case>{c({4, 5}, 1e-3, 1, 0.1), c({7}, 3e-2, 10, 0.0), c({0}, 1e-3, 2, 0.1), c({70000}, 1e-2, 3, 0.05)};
  };
  aw.ref = [](const std::vector<R>& in, const Attrs& a) {
    R p = in[0], m1 = in[2], v = in[3];
    const double lr = in[4].v[0], step = in[5].v[0], b1 = a.f("beta1"), b2 = a.f("beta2");
    const double bc1 = 1 - std::pow(b1, step), bc2 = 1 - std::pow(b2, step);
    for (size_t i = 0; i < p.v.size(); ++i) {
      const double g = in[1].v[i];
      p.v[i] *= 1 - lr * a.f("weight_decay");
      m1.v[i] = b1 * m1.v[i] + (1 - b1) * g;
      v.v[i] = b2 * v.v[i] + (1 - b2) * g * g;
      p.v[i] -= lr / bc1 * m1.v[i] / (std::sqrt(v.v[i]) / std::sqrt(bc2) + a.f("eps"));
    }
    return std::vector<R>{p, m1, v};
  };
  aw.bad = [] {
    auto c = [](Tensor p, Tensor g, Tensor lr, Tensor step) { return Case{{p, g, rn({3}), rn({3}), lr, step}, adamw_attrs(0.1)}; };
    Tensor lr = full({}, 1e-3, DType::f64), step = full({}, 1.0, DType::i64);
    Case bad_beta = c(rn({3}), rn({3}), lr, step);
    bad_beta.attrs.set("beta1", 1.0);
    return std::vector<Case>{c(rn({3}, DType::f64), rn({3}), lr, step), c(rn({3}), rn({4}), lr, step),
                             c(rn({3}), rn({3}), full({1}, 1e-3, DType::f64), step), c(rn({3}), rn({3}), lr, full({}, 1.0, DType::f32)),
                             c(rn({3}).requires_grad_(), rn({3}), lr, step), bad_beta};
  };
  m["adamw_update"] = aw;

  Spec sg;
  sg.cases = [] {
    return std::vector<Case>{{{rn({4, 3}), rn({4, 3}), full({}, 0.1, DType::f64)}, {{"weight_decay", 0.0}}},
                             {{rn({6}), rn({6}), full({}, 0.05, DType::f64)}, {{"weight_decay", 0.01}}}};
  };
  sg.ref = [](const std::vector<R>& in, const Attrs& a) {
    R p = in[0];
    for (size_t i = 0; i < p.v.size(); ++i) p.v[i] -= in[2].v[0] * (in[1].v[i] + a.f("weight_decay") * in[0].v[i]);
    return std::vector<R>{p};
  };
  sg.bad = [] {
    return std::vector<Case>{{{rn({3}), rn({2}), full({}, 0.1, DType::f64)}, {{"weight_decay", 0.0}}},
                             {{rn({3}), rn({3}), full({}, 0.1, DType::f32)}, {{"weight_decay", 0.0}}}};
  };
  m["sgd_update"] = sg;

  Spec sm;
  sm.cases = [] {
    auto c = [](const Shape& s, bool nesterov, double wd) {
      return Case{{rn(s), rn(s), rn(s), full({}, 0.1, DType::f64)}, {{"momentum", 0.9}, {"nesterov", nesterov}, {"weight_decay", wd}}};
    };
    return std::vector<Case>{c({3, 4}, false, 0.0), c({5}, true, 0.01), c({0, 2}, false, 0.1)};
  };
  sm.ref = [](const std::vector<R>& in, const Attrs& a) {
    R p = in[0], buf = in[2];
    const double mom = a.f("momentum");
    for (size_t i = 0; i < p.v.size(); ++i) {
      const double d = in[1].v[i] + a.f("weight_decay") * in[0].v[i];
      buf.v[i] = mom * buf.v[i] + d;
      p.v[i] -= in[3].v[0] * (a.b("nesterov") ? d + mom * buf.v[i] : buf.v[i]);
    }
    return std::vector<R>{p, buf};
  };
  sm.bad = [] {
    return std::vector<Case>{{{rn({3}), rn({3}), rn({4}), full({}, 0.1, DType::f64)}, {{"momentum", 0.9}, {"nesterov", false}, {"weight_decay", 0.0}}},
                             {{rn({3}), rn({3}), rn({3}), full({}, 0.1, DType::f64)}, {{"momentum", -1.0}, {"nesterov", false}, {"weight_decay", 0.0}}}};
  };
  m["sgd_momentum_update"] = sm;
}

}  // namespace sinter::test

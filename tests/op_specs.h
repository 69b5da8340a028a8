#pragma once
// Test specifications for every op in the op table: random cases (broadcasting, non-contiguous,
// size-0 and size-1 dims), a simple reference implementation in double, cases that must be
// rejected, and which cases feed the finite-difference gradient check.
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "test_util.h"

namespace sinter::test {

// A reference value: row-major doubles plus the dtype the op must produce.
struct R {
  Shape shape;
  std::vector<double> v;
  DType dtype = DType::f64;
};
R ref_of(const Tensor& t);

struct Case {
  std::vector<Tensor> in;
  Attrs attrs;
};

struct Spec {
  std::function<std::vector<Case>()> cases;
  std::function<std::vector<R>(const std::vector<R>&, const Attrs&)> ref;
  std::function<std::vector<Case>()> bad;        // each must raise a sinter::Error naming the op
  std::function<std::vector<Case>()> grad_cases; // small f64 cases; empty for non-differentiable ops
  double rtol = 1e-5, atol = 1e-5;
};

const std::map<std::string, Spec>& op_specs();
// The op's outputs against the reference, within the spec's tolerances (or the dtype's).
::testing::AssertionResult matches(const std::vector<Tensor>& out, const std::vector<R>& ref, const Spec& spec);
std::string describe(const Case& c);  // the inputs' shapes, dtypes and layouts, and the attributes
void register_test_kernels();  // op_specs_kernels.cpp: user kernels the sweeps cover too

// Every registered op's name: what the op-table sweeps are parameterized over.
inline std::vector<std::string> op_names() {
  register_test_kernels();
  std::vector<std::string> n;
  for (const OpDef* op : all_ops()) n.push_back(op->name);
  return n;
}

// Helpers shared by the spec files.
namespace spec {
inline std::vector<int64_t> unravel(int64_t i, const Shape& s) {
  std::vector<int64_t> idx(s.size());
  for (size_t d = s.size(); d-- > 0;) { idx[d] = s[d] ? i % s[d] : 0; i = s[d] ? i / s[d] : 0; }
  return idx;
}
inline int64_t ravel(const std::vector<int64_t>& idx, const Shape& s) {
  int64_t r = 0;
  for (size_t d = 0; d < s.size(); ++d) r = r * s[d] + idx[d];
  return r;
}
// The element of r at a multi-index.
inline double at(const R& r, const std::vector<int64_t>& idx) { return r.v[size_t(ravel(idx, r.shape))]; }
inline int64_t wrap(int64_t d, int64_t n) { return d < 0 ? d + std::max<int64_t>(n, 1) : d; }
inline Tensor rn(const Shape& s, DType dt = DType::f32) { return randn(s, DType::f64).to(dt); }
inline Tensor ints(const Shape& s, int64_t lo, int64_t hi, DType dt = DType::i64) { return randint(lo, hi, s, dt); }
inline Tensor bools(const Shape& s) { return lt(rand(s), full({}, 0.5)); }
// The cases small enough for finite differences, with floating inputs in f64.
inline std::vector<Case> small_f64(const std::vector<Case>& cs, int64_t max_numel = 48) {
  std::vector<Case> out;
  for (const Case& c : cs) {
    bool ok = true;
    for (auto& t : c.in) ok = ok && t.numel() <= max_numel;
    if (!ok) continue;
    Case d = c;
    for (auto& t : d.in) if (is_floating(t.dtype())) t = t.to(DType::f64);
    out.push_back(d);
  }
  return out;
}
inline std::vector<double> softmax_line(const std::vector<double>& l, bool log) {
  double mx = -INFINITY, s = 0;
  for (double v : l) mx = std::max(mx, v);
  for (double v : l) s += std::exp(v - mx);
  std::vector<double> o;
  for (double v : l) o.push_back(log ? v - mx - std::log(s) : std::exp(v - mx) / s);
  return o;
}
}  // namespace spec

}  // namespace sinter::test

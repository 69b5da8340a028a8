#pragma once
// Test specifications for every op in the op table: random cases (broadcasting, non-contiguous,
// size-0 and size-1 dims), a simple reference implementation in double, cases that must be
// rejected, and which cases feed the finite-difference gradient check.
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

}  // namespace sinter::test

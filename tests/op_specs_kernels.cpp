// User kernels in the op-table sweeps (tests/ops_test.cpp, tests/compile_ops_test.cpp): two kernels
// registered by the test binary before the sweeps enumerate the table, each with a reference in
// double, bad inputs and (for the differentiable one) gradient cases.
#include <sinter/kernel.h>

#include "op_specs.h"

namespace sinter::test {
namespace {

using namespace spec;

std::vector<TensorMeta> same_shapes(std::span<const TensorMeta> in, const Attrs&) {
  SINTER_CHECK_SHAPE(in[0].shape == in[1].shape, "gate", in[0].shape, " and up", in[1].shape, " differ");
  return {in[0]};
}

std::vector<TensorMeta> matrix_and_scalar(std::span<const TensorMeta> in, const Attrs&) {
  SINTER_CHECK_SHAPE(in[0].shape.size() == 2 && in[1].shape.numel() == 1, "x must be a matrix and s one value, got ", in[0].shape,
                     " and ", in[1].shape);
  return {in[0]};
}

}  // namespace

void register_test_kernels() {
  static const bool done = [] {
    register_kernel_def({
        .name = "kernel_swiglu_f64",
        .source = R"(template <class Cfg> void kernel(sinter::In<double> g, sinter::In<double> u, auto& y) {
  for (int64_t i = 0; i < y.numel(); ++i) y.store(i, sinter::fn::Silu{}(g[i]) * u[i]);
})",
        .inputs = {DType::f64, DType::f64},
        .outputs = {DType::f64},
        .shape = same_shapes,
        .pointwise = {true},
        .backward = [](BackwardCtx& c) {
          const Tensor &g = c.inputs[0], &u = c.inputs[1], &dy = c.grads[0];
          return std::vector<Tensor>{c.needs_grad[0] ? silu_backward(dy * u, g) : Tensor(), c.needs_grad[1] ? dy * silu(g) : Tensor()};
        },
    });
    register_kernel_def({
        .name = "kernel_scale_",
        .source = R"(template <class Cfg> void kernel(sinter::In<double> x, sinter::In<double> s, auto& y) {
  for (int64_t i = 0; i < y.size(0); ++i)
    for (int64_t j = 0; j < y.size(1); ++j) y(i, j) = y(i, j) * s[0];
})",
        .inputs = {DType::f64, DType::f64},
        .outputs = {DType::f64},
        .shape = matrix_and_scalar,
        .effects = {Effect::writes(0)},
    });
    return true;
  }();
  (void)done;
}

void add_kernel_specs(std::map<std::string, Spec>& m) {
  register_test_kernels();
  Spec sw;
  sw.cases = [] {
    return std::vector<Case>{{{rn({3, 5}, DType::f64), rn({3, 5}, DType::f64)}, {}}, {{rn({7}, DType::f64), rn({7}, DType::f64)}, {}},
                             {{rn({0, 4}, DType::f64), rn({0, 4}, DType::f64)}, {}}};
  };
  sw.ref = [](const std::vector<R>& in, const Attrs&) {
    R out = in[0];
    for (size_t i = 0; i < out.v.size(); ++i) out.v[i] = in[0].v[i] / (1 + std::exp(-in[0].v[i])) * in[1].v[i];
    return std::vector<R>{out};
  };
  sw.bad = [] {
    return std::vector<Case>{{{rn({3, 5}), rn({3, 5})}, {}},                                   // f32, the kernel takes f64
                             {{rn({3, 5}, DType::f64), rn({3, 4}, DType::f64)}, {}}};          // shapes differ
  };
  sw.grad_cases = [] { return std::vector<Case>{{{rn({2, 3}, DType::f64), rn({2, 3}, DType::f64)}, {}}}; };
  m["kernel_swiglu_f64"] = sw;

  Spec sc;
  sc.cases = [] {
    return std::vector<Case>{{{rn({3, 4}, DType::f64), full({1}, 2.5, DType::f64)}, {}}, {{rn({1, 6}, DType::f64), full({}, -1.0, DType::f64)}, {}}};
  };
  sc.ref = [](const std::vector<R>& in, const Attrs&) {
    R out = in[0];
    for (double& v : out.v) v *= in[1].v[0];
    return std::vector<R>{out};
  };
  sc.bad = [] {
    return std::vector<Case>{{{rn({3}, DType::f64), full({1}, 2.0, DType::f64)}, {}},                        // not a matrix
                             {{rn({3, 4}, DType::f64).requires_grad_(), full({1}, 2.0, DType::f64)}, {}}};    // writes a tensor that requires grad
  };
  m["kernel_scale_"] = sc;
}

}  // namespace sinter::test

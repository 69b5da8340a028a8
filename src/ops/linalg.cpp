// matmul (NumPy semantics) and linear. CPU kernels: src/cpu/op_linalg.cpp (oneDNN GEMM).
#include "ops/linalg.h"

namespace sinter {
namespace detail {

namespace {

// Gradients of a @ b: 1-D operands are promoted to matrices, differentiated, and folded back.
std::vector<Tensor> matmul_backward(const Tensor& g, const Tensor& a, const Tensor& b, bool want_a, bool want_b) {
  Tensor a2 = a.dim() == 1 ? a.unsqueeze(0) : a, b2 = b.dim() == 1 ? b.unsqueeze(-1) : b;
  Tensor g2 = g;
  if (a.dim() == 1) g2 = g2.unsqueeze(b.dim() == 1 ? 0 : -2);
  if (b.dim() == 1) g2 = g2.unsqueeze(-1);
  return {want_a ? sum_to(matmul(g2, b2.transpose(-1, -2)), a2.shape()).reshape(a.shape()) : Tensor(),
          want_b ? sum_to(matmul(a2.transpose(-1, -2), g2), b2.shape()).reshape(b.shape()) : Tensor()};
}

// x(..., K), w(N, K)[, b(N)] (and more inputs of x's dtype): the checks linear and linear_fused
// share; the output's shape.
Shape linear_shape(const char* op, std::span<const TensorMeta> in, bool has_bias) {
  const Shape &x = in[0].shape, &w = in[1].shape;
  SINTER_CHECK_SHAPE(!x.empty() && w.size() == 2 && x.back() == w[1], "[", op, "] x", x, " does not match weight", w,
                     " (want x(..., K), w(N, K))");
  for (size_t i = 1; i < in.size(); ++i)
    SINTER_CHECK_DTYPE(in[i].dtype == in[0].dtype, "[", op, "] dtypes differ: x ", in[0].dtype, ", input ", i, " ", in[i].dtype);
  SINTER_CHECK_DTYPE(is_floating(in[0].dtype), "[", op, "] needs floating tensors, got ", in[0].dtype);
  if (has_bias) SINTER_CHECK_SHAPE(in[2].shape == Shape{w[0]}, "[", op, "] bias", in[2].shape, " does not match weight", w);
  Shape out = x;
  out.back() = w[0];
  return out;
}

}  // namespace

void register_linalg_ops() {
  OpDef mm;
  mm.name = "matmul";
  mm.num_inputs = 2;
  mm.infer = [](std::span<const TensorMeta> in, const Attrs&) {
    return std::vector<TensorMeta>{{plan_matmul(in[0], in[1]).out, in[0].dtype, in[0].device}};
  };
  mm.backward = [](BackwardCtx& c) {
    return matmul_backward(c.grads[0], c.inputs[0], c.inputs[1], c.needs_grad[0], c.needs_grad[1]);
  };
  add_op(std::move(mm));

  OpDef li;
  li.name = "linear";  // inputs: x(..., K), w(N, K)[, b(N)]
  li.num_inputs = -1;
  li.infer = [](std::span<const TensorMeta> in, const Attrs&) {
    SINTER_CHECK(in.size() == 2 || in.size() == 3, "[linear] expects x, w and optionally b, got ", in.size(), " inputs");
    return std::vector<TensorMeta>{{linear_shape("linear", in, in.size() == 3), in[0].dtype, in[0].device}};
  };
  li.backward = [](BackwardCtx& c) {
    const Tensor &x = c.inputs[0], &w = c.inputs[1], &g = c.grads[0];
    const int64_t K = w.size(1), N = w.size(0);
    std::vector<Tensor> out(c.input_meta.size());
    if (c.needs_grad[0]) out[0] = matmul(g, w);
    if (c.needs_grad[1]) out[1] = matmul(g.reshape({-1, N}).t(), x.reshape({-1, K}));
    if (out.size() == 3 && c.needs_grad[2]) out[2] = sum_to(g, {N});
    return out;
  };
  add_op(std::move(li));

  // A linear with its epilogue, made by the compiler from linear -> activation -> residual add
  // (compiler/passes.cpp): y = act(x w^T + b) + r, with the activation and the add done on the
  // GEMM's output tile (oneDNN post-ops). Inputs x, w, then b if attr "bias", r if "residual".
  // Not differentiable: compiled graphs trace their backward before fusing.
  OpDef lf;
  lf.name = "linear_fused";
  lf.num_inputs = -1;
  lf.min_inputs = 2;
  lf.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    const bool has_bias = a.b("bias"), has_res = a.b("residual");
    const std::string& act = a.str("act");
    SINTER_CHECK(in.size() == 2 + size_t(has_bias) + size_t(has_res), "[linear_fused] expects x, w", has_bias ? ", b" : "",
                 has_res ? ", residual" : "", ": ", 2 + int(has_bias) + int(has_res), " inputs, got ", in.size());
    SINTER_CHECK(fused_linear_activation(act), "[linear_fused] activation '", act,
                 "' is not one of none, relu, gelu, gelu_tanh, silu, sigmoid, tanh");
    const Shape out = linear_shape("linear_fused", in, has_bias);
    if (has_res) SINTER_CHECK_SHAPE(in.back().shape == out, "[linear_fused] residual", in.back().shape, " is not the output's shape ", out);
    return std::vector<TensorMeta>{{out, in[0].dtype, in[0].device}};
  };
  add_op(std::move(lf));

  // Three linears of one input (a decode step's q, k and v projections) as one call: inputs x,
  // w0, w1, w2, then b0, b1, b2 if attr "bias". Not differentiable (made by the compiler's passes).
  OpDef l3;
  l3.name = "linear3";
  l3.num_inputs = -1;
  l3.min_inputs = 4;
  l3.num_outputs = 3;
  l3.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    const bool has_bias = a.b("bias");
    SINTER_CHECK(in.size() == (has_bias ? 7u : 4u), "[linear3] expects x, w0, w1, w2", has_bias ? ", b0, b1, b2" : "", ": ",
                 has_bias ? 7 : 4, " inputs, got ", in.size());
    std::vector<TensorMeta> out;
    for (size_t i = 0; i < 3; ++i) {
      std::vector<TensorMeta> one{in[0], in[1 + i]};
      if (has_bias) one.push_back(in[4 + i]);
      out.push_back({linear_shape("linear3", one, has_bias), in[0].dtype, in[0].device});
    }
    return out;
  };
  add_op(std::move(l3));
}

bool fused_linear_activation(const std::string& act) {
  for (const char* a : {"none", "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh"})
    if (act == a) return true;
  return false;
}

}  // namespace detail

namespace {
thread_local DType g_autocast = DType::f32;
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  static const OpDef& op = get_op("matmul");
  if (g_autocast != DType::f32 && a.dtype() == DType::f32 && b.dtype() == DType::f32 && a.device().type == DeviceType::cuda)
    return cast(call1(op, {cast(a, g_autocast), cast(b, g_autocast)}), DType::f32);  // tensor cores (see AutocastGuard)
  return call1(op, {a, b});
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  SINTER_CHECK_SHAPE(a.dim() == 3 && b.dim() == 3 && a.size(0) == b.size(0), "[bmm] needs (B, n, k) and (B, k, m), got a",
                     a.shape(), " b", b.shape());
  return matmul(a, b);
}

AutocastGuard::AutocastGuard(DType compute) : prev_(g_autocast) {
  SINTER_CHECK_DTYPE(compute == DType::f32 || compute == DType::bf16, "[autocast] computes in f32 (off) or bf16, not ",
                     compute);
  g_autocast = compute;
}
AutocastGuard::~AutocastGuard() { g_autocast = prev_; }
DType autocast_dtype() { return g_autocast; }

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  static const OpDef& op = get_op("linear");
  if (g_autocast != DType::f32 && x.dtype() == DType::f32) {
    // The casts are ops, so gradients flow back to the f32 (master) tensors in f32.
    const DType c = g_autocast;
    Tensor y = b.defined() ? call1(op, {cast(x, c), cast(w, c), cast(b, c)}) : call1(op, {cast(x, c), cast(w, c)});
    return cast(y, DType::f32);
  }
  return b.defined() ? call1(op, {x, w, b}) : call1(op, {x, w});
}

}  // namespace sinter

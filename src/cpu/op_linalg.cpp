// CPU kernels of matmul and linear (src/ops/linalg.cpp): batched views onto oneDNN's GEMM (cpu/gemm.cpp).
#include "cpu/cpu.h"
#include "ops/linalg.h"

namespace sinter::cpu {
namespace {

using detail::raw_view;

// x viewed as (B, rows, cols) after broadcasting its batch dims to `batch`; a copy where they do
// not fold into one stride, or broadcast a batch of more than one.
Tensor as_batched(const Tensor& x, const Shape& batch, int64_t rows, int64_t cols, bool vec_is_row) {
  const detail::BatchedView v = detail::batched_view(x, batch, rows, cols, vec_is_row);
  if (v.folded.defined() && !(batch.numel() > 1 && v.folded.stride(0) == 0)) return v.folded;
  const Tensor e = contiguous_as(v.expanded, v.expanded.dtype());
  return raw_view(e, {batch.numel(), rows, cols}, {rows * cols, cols, 1}, e.offset());
}

void matmul_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
  const Tensor &a = in[0], &b = in[1];
  const detail::MatmulPlan p = detail::plan_matmul({a.shape(), a.dtype(), {}}, {b.shape(), b.dtype(), {}});
  const int64_t B = p.batch.numel();
  Tensor a3 = as_batched(a, p.batch, p.n, p.k, true);
  if (B > 1 && b.dim() <= 2 && a3.stride(0) == p.n * a3.stride(1) && a3.stride(2) == 1) {
    // Shared weights: fold the batch into the rows, one large GEMM instead of B small ones (and
    // no copy of b per batch entry).
    a3 = raw_view(a3, {1, B * p.n, p.k}, {B * p.n * p.k, a3.stride(1), 1}, a3.offset());
    const Tensor b3 = as_batched(b, {}, p.k, p.m, false);
    gemm(a3, b3, raw_view(out[0], {1, B * p.n, p.m}, {B * p.n * p.m, p.m, 1}, out[0].offset()));
    return;
  }
  gemm(a3, as_batched(b, p.batch, p.k, p.m, false), raw_view(out[0], {B, p.n, p.m}, {p.n * p.m, p.m, 1}, out[0].offset()));
}

// y = x w^T (+ bias) through the GEMM, w^T as a view; `ep` runs on the GEMM's output.
void linear_into(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, GemmEpilogue ep = {}) {
  const int64_t K = w.size(1), N = w.size(0), M = x.numel() / std::max<int64_t>(K, 1);
  Tensor x2 = contiguous_as(x, x.dtype());
  Tensor a = raw_view(x2, {1, M, K}, {M * K, K, 1}, x2.offset());
  Tensor bt = raw_view(w, {1, K, N}, {0, w.stride(1), w.stride(0)}, w.offset());
  if (ep.residual.defined()) {
    Tensor r = contiguous_as(ep.residual, x.dtype());
    ep.residual = raw_view(r, {1, M, N}, {M * N, N, 1}, r.offset());
  }
  gemm(a, bt, raw_view(y, {1, M, N}, {M * N, N, 1}, y.offset()), bias.defined() ? contiguous_as(bias, bias.dtype()) : Tensor(), ep);
}

void linear_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
  linear_into(in[0], in[1], in.size() == 3 ? in[2] : Tensor(), out[0]);
}

// y = act(x w^T + b) + r in one GEMM call: the activation and the add run on its output tiles.
void linear_fused_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& attrs) {
  GemmEpilogue ep;
  const std::string& act = attrs.str("act");
  static const std::pair<const char*, UnaryOp> acts[] = {{"relu", UnaryOp::Relu},       {"gelu", UnaryOp::Gelu},
                                                         {"gelu_tanh", UnaryOp::GeluTanh}, {"silu", UnaryOp::Silu},
                                                         {"sigmoid", UnaryOp::Sigmoid}, {"tanh", UnaryOp::Tanh}};
  for (auto& [name, op] : acts)
    if (act == name) ep.act = op;
  if (attrs.b("residual")) ep.residual = in.back();
  linear_into(in[0], in[1], attrs.b("bias") ? in[2] : Tensor(), out[0], ep);
}

// Decode-sized: one parallel region over the three weights' rows; else three GEMMs.
void linear3_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& attrs) {
  const bool bias = attrs.b("bias");
  const Tensor w[3] = {in[1], in[2], in[3]};
  const Tensor b[3] = {bias ? in[4] : Tensor(), bias ? in[5] : Tensor(), bias ? in[6] : Tensor()};
  if (few_rows_multi(in[0], w, b, out)) return;
  for (int i = 0; i < 3; ++i) linear_into(in[0], w[i], b[i], out[size_t(i)]);
}

}  // namespace

void register_linalg_kernels() {
  detail::add_kernel("linear3", DeviceType::cpu, linear3_kernel);
  detail::add_kernel("linear_fused", DeviceType::cpu, linear_fused_kernel);
  detail::add_kernel("matmul", DeviceType::cpu, matmul_kernel);
  detail::add_kernel("linear", DeviceType::cpu, linear_kernel);
}

}  // namespace sinter::cpu

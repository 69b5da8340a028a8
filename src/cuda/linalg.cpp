// CUDA kernels of matmul, linear, linear_fused and linear3 (src/ops/linalg.cpp): batched strided
// views onto cuBLASLt (gemm.cpp), as the CPU's onto oneDNN. The fused epilogues run as the
// elementwise kernels after the GEMM; f64 adds its bias the same way (cuBLASLt has no f64 bias).
#include <span>

#include "core/view.h"
#include "cuda/cuda.h"
#include "cuda/gemm.h"
#include "ops/linalg.h"
#include "sinter/op.h"
#include "sinter/ops.h"

namespace sinter::cuda {
namespace {

using detail::raw_view;

bool unit_stride(const Tensor& t) { return t.stride(2) == 1 || t.stride(1) == 1 || t.size(1) == 1 || t.size(2) == 1; }

// x viewed as (B, rows, cols) after broadcasting its batch dims to `batch` (a batch stride of 0
// is fine for cuBLASLt); a copy where they do not fold into one stride, or no inner stride is 1.
Tensor as_batched(const Tensor& x, const Shape& batch, int64_t rows, int64_t cols, bool vec_is_row) {
  const detail::BatchedView v = detail::batched_view(x, batch, rows, cols, vec_is_row);
  if (v.folded.defined() && unit_stride(v.folded)) return v.folded;
  const Tensor e = v.expanded.contiguous();
  return raw_view(e, {batch.numel(), rows, cols}, {rows * cols, cols, 1}, e.offset());
}

void matmul_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
  const Tensor &a = in[0], &b = in[1];
  const detail::MatmulPlan p = detail::plan_matmul({a.shape(), a.dtype(), {}}, {b.shape(), b.dtype(), {}});
  const int64_t B = p.batch.numel();
  gemm("matmul", as_batched(a, p.batch, p.n, p.k, true), as_batched(b, p.batch, p.k, p.m, false),
       raw_view(out[0], {B, p.n, p.m}, {p.n * p.m, p.m, 1}, out[0].offset()));
}

// y = x w^T (+ bias), w^T as a view.
void linear_into(const char* op, const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y) {
  const int64_t K = w.size(1), N = w.size(0), M = x.numel() / std::max<int64_t>(K, 1);
  const Tensor x2 = x.contiguous();
  const Tensor a = raw_view(x2, {1, M, K}, {M * K, K, 1}, x2.offset());
  Tensor wt = raw_view(w, {1, K, N}, {0, w.stride(1), w.stride(0)}, w.offset());
  if (!unit_stride(wt)) {
    const Tensor wc = w.contiguous();
    wt = raw_view(wc, {1, K, N}, {0, 1, K}, wc.offset());
  }
  const bool epilogue_bias = bias.defined() && y.dtype() != DType::f64;
  gemm(op, a, wt, raw_view(y, {1, M, N}, {M * N, N, 1}, y.offset()), epilogue_bias ? bias.contiguous() : Tensor());
  if (bias.defined() && !epilogue_bias) add_into(op, y, bias);
}

void linear_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
  linear_into("linear", in[0], in[1], in.size() == 3 ? in[2] : Tensor(), out[0]);
}

void linear_fused_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  linear_into("linear_fused", in[0], in[1], a.b("bias") ? in[2] : Tensor(), out[0]);
  const std::string& act = a.str("act");
  Tensor y = out[0];
  if (act != "none") y = call(get_op(act), {y}, {})[0];
  if (a.b("residual")) y = y + in.back();
  if (!y.same(out[0])) copy_convert("linear_fused", y, out[0]);
}

void linear3_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const bool bias = a.b("bias");
  for (size_t i = 0; i < 3; ++i) linear_into("linear3", in[0], in[1 + i], bias ? in[4 + i] : Tensor(), out[i]);
}

}  // namespace

void register_linalg_kernels() {
  constexpr DeviceType kCuda = DeviceType::cuda;
  register_kernel("matmul", kCuda, matmul_kernel);
  register_kernel("linear", kCuda, linear_kernel);
  register_kernel("linear_fused", kCuda, linear_fused_kernel);
  register_kernel("linear3", kCuda, linear3_kernel);
}

}  // namespace sinter::cuda

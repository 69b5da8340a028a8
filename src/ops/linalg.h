#pragma once
// The shape rules of matmul, shared by its definition and its kernels.
#include "ops/common.h"

namespace sinter::detail {

struct MatmulPlan {
  Shape batch;    // broadcast batch dims
  int64_t n, k, m;
  Shape out;      // final output shape
};
// NumPy semantics: 1-D operands promoted and squeezed back, batch dims broadcast.
MatmulPlan plan_matmul(const TensorMeta& a, const TensorMeta& b);
// x as a matmul operand (B, rows, cols): `expanded` has x's batch dims broadcast to `batch` (a 1-D
// x as a row or a column); `folded` is the same as one batch dim over x's strides, undefined where
// the batch dims do not fold into one stride (the kernel then copies `expanded`).
struct BatchedView {
  Tensor expanded, folded;
};
BatchedView batched_view(const Tensor& x, const Shape& batch, int64_t rows, int64_t cols, bool vec_is_row);
// Whether linear_fused takes this activation (a unary op's name, or "none").
bool fused_linear_activation(const std::string& act);

}  // namespace sinter::detail

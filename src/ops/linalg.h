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
// Whether linear_fused takes this activation (a unary op's name, or "none").
bool fused_linear_activation(const std::string& act);

}  // namespace sinter::detail

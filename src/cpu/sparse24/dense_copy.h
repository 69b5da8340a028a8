#pragma once
// Dense copies of small 2:4 weights, cached (dense_copy.cpp).
#include "sinter/dtype.h"
#include "sinter/tensor.h"

namespace sinter::sparse {

// The (N, K) dense weight in dt (f32, or bf16 where every entry is exact in bf16, else f32), cached;
// undefined when the budget is spent.
Tensor dense_copy(const Tensor& values, const Tensor& meta, const Tensor& scales, DType dt = DType::f32);
int64_t dense_copy_bytes();  // held by all copies now
// The copy a call with x of dtype `x` on values of dtype `values` multiplies: bf16 for bf16 x with
// bf16 values where oneDNN multiplies bf16 (on AMX, the tile unit), else f32 (x widened).
DType dense_copy_dtype(DType x, DType values);

}  // namespace sinter::sparse

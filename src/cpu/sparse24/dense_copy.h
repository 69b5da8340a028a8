#pragma once
// Dense copies of small 2:4 weights, cached (dense_copy.cpp).
#include "sinter/tensor.h"

namespace sinter::sparse {

// The (N, K) dense weight in f32, cached; undefined when the budget is spent.
Tensor dense_copy(const Tensor& values, const Tensor& meta, const Tensor& scales);
int64_t dense_copy_bytes();  // held by all copies now

}  // namespace sinter::sparse

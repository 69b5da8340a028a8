#pragma once
// GEMMs on CUDA through cuBLASLt (gemm.cpp): c = a b (+ bias) on batched strided views, plans
// cached by shape, layout and dtype. f32 runs without TF32; bf16 and f16 accumulate in f32.
#include "sinter/tensor.h"

namespace sinter::cuda {

// a (B, M, K), b (B, K, N), c (B, M, N) contiguous; each of a and b has a unit stride in one of its
// last two dims (a batch stride of 0 broadcasts it). bias (N) or undefined.
void gemm(const char* op, const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& bias = {});

}  // namespace sinter::cuda

#pragma once
// cuDNN's fused attention for sdpa on CUDA (cudnn_sdpa.cpp): bf16 forward and backward through
// cuDNN's graph API, cuDNN loaded at run time. Each call answers whether cuDNN ran it; where it
// did not (cuDNN absent, built without its frontend, or a call it does not take), the caller runs
// the flash kernels (flash.h) and cudnn_sdpa_why_not says why. SINTER_CUDNN_ATTENTION=0 in the
// environment turns cuDNN off (read at each call).
#include <span>
#include <string>

#include "attention/attention.h"

namespace sinter::cuda {

// o (B, Hq, Lq, Dv) and lse (B, Hq, Lq) f32 from q, k, v and an optional additive bias (q's dtype).
bool cudnn_sdpa_forward(const detail::Geometry& g, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                        const Tensor& o, const Tensor& lse);
// dq, dk, dv from the forward's o and lse (the gradient of lse taken as zero).
bool cudnn_sdpa_backward(const detail::Geometry& g, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                         const Tensor& lse, const Tensor& dout, const Tensor& bias, std::span<Tensor> grads);
// Why cuDNN would not run a call of this geometry and dtype ("" where it would, as far as metadata
// tells: the bias and the layouts are checked at the call).
std::string cudnn_sdpa_why_not(const detail::Geometry& g, DType dtype);

}  // namespace sinter::cuda

// The sdpa op's CUDA kernel: the math reference (src/attention/sdpa.cpp, in ops that run on the
// CUDA kernels), as the op chooses where no fast kernel is registered for the device; its backward
// differentiates the same reference. A FlashAttention-style kernel (and cuDNN's) come next.
#include <span>

#include "attention/attention.h"
#include "cuda/cuda.h"
#include "sinter/op.h"

namespace sinter::cuda {
namespace {

void sdpa_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  size_t at = 3;
  const Tensor mask = a.b("mask") ? in[at++] : Tensor();
  int64_t kv_len = in[1].size(2);
  if (a.b("kv_len")) {
    kv_len = in[at].to(Device::cpu()).item<int64_t>();
    SINTER_CHECK_INDEX(kv_len >= 0 && kv_len <= in[1].size(2), "[sdpa] kv_len ", kv_len, " out of range for a KV cache of ", in[1].size(2),
                       " positions");
  }
  Tensor lse;
  copy_convert("sdpa", detail::sdpa_math_reference(in[0], in[1], in[2], mask, kv_len, a, &lse), out[0]);
  copy_convert("sdpa", lse, out[1]);
}

}  // namespace

void register_attention_kernels() { register_kernel("sdpa", DeviceType::cuda, sdpa_kernel); }

}  // namespace sinter::cuda

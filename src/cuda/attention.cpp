// The sdpa op's CUDA kernel: the math reference (src/attention/sdpa.cpp, in ops that run on the
// CUDA kernels), as the op chooses where no fast kernel is registered for the device; its backward
// differentiates the same reference. A FlashAttention-style kernel (and cuDNN's) come next.
// A KV cache's length (`kv_len`, a tensor on the device) is never read by the host: the reference
// runs over the whole cache with the positions past it, and the causal rule, as a mask built on
// the device.
#include <cmath>
#include <span>

#include "attention/attention.h"
#include "cuda/cuda.h"
#include "sinter/op.h"
#include "sinter/ops.h"

namespace sinter::cuda {
namespace {

// keep[i][j] for Lq queries over L cache positions holding kv_len keys: the reference's rule with
// an offset of kv_len - Lq (causal) or kv_len (not), and a window of the last `window` keys.
Tensor cache_mask(const Tensor& kv_len, int64_t Lq, int64_t L, bool causal, int64_t window) {
  const Device dev = kv_len.device();
  const Tensor j = arange(L).reshape({1, L}).to(dev), i = arange(Lq).reshape({Lq, 1}).to(dev);
  const Tensor last = i + (causal ? kv_len - double(Lq) : kv_len);  // query i sees keys j <= last
  Tensor keep = where(lt(j, kv_len), le(j, last), lt(j, kv_len));
  if (window > 0) keep = where(keep, gt(j, last - double(window)), keep);
  return keep;
}

// A decode step's layers share one length tensor: its mask is built once (the cache holds the
// tensor, so a match by identity and version cannot be a new tensor at a freed one's address).
struct MaskCache {
  Tensor kv_len;
  uint64_t version = 0;
  int64_t Lq = 0, L = 0, window = 0;
  bool causal = false;
  Tensor keep;
};

Tensor cached_mask(const Tensor& kv_len_in, int64_t Lq, int64_t L, bool causal, int64_t window) {
  thread_local MaskCache c;
  if (c.kv_len.same(kv_len_in) && c.version == kv_len_in.version() && c.Lq == Lq && c.L == L && c.causal == causal && c.window == window)
    return c.keep;
  const Tensor kv_len = checked_indices("sdpa", kv_len_in.reshape({1}), L + 1, "kv_len").reshape({});  // 0..L
  c = MaskCache{kv_len_in, kv_len_in.version(), Lq, L, window, causal, cache_mask(kv_len, Lq, L, causal, window)};
  return c.keep;
}

void sdpa_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  size_t at = 3;
  Tensor mask = a.b("mask") ? in[at++] : Tensor();
  Tensor lse;
  if (!a.b("kv_len")) {
    copy_convert("sdpa", detail::sdpa_math_reference(in[0], in[1], in[2], mask, in[1].size(2), a, &lse), out[0]);
    copy_convert("sdpa", lse, out[1]);
    return;
  }
  const int64_t L = in[1].size(2), Lq = in[0].size(2);
  const Tensor keep = cached_mask(in[at], Lq, L, a.b("causal"), a.i_or("window", 0));
  if (!mask.defined()) mask = keep;
  else if (mask.dtype() == DType::boolean) mask = where(keep, mask, keep);
  else mask = where(keep, mask, full({}, -INFINITY, mask.dtype(), mask.device()));
  Attrs whole = a;  // the mask now says what the causal rule and the window said
  whole.set("causal", false);
  whole.set("window", int64_t(0));
  copy_convert("sdpa", detail::sdpa_math_reference(in[0], in[1], in[2], mask, L, whole, &lse), out[0]);
  copy_convert("sdpa", lse, out[1]);
}

}  // namespace

void register_attention_kernels() { register_kernel("sdpa", DeviceType::cuda, sdpa_kernel); }

}  // namespace sinter::cuda

#pragma once
// Scaled-dot-product attention: one op ("sdpa") whose kernel picks the backend per call, flash
// (FlashAttention-2 style, O(L) memory) or the math reference (scores materialised).
#include <optional>
#include <string>

#include "sinter/tensor.h"

namespace sinter {

enum class SDPABackend { automatic, flash, math };
struct SDPAChoice {
  SDPABackend backend;
  std::string reason;
};
// Which backend a call would take, and why (forcing one the inputs do not allow is an error).
SDPAChoice sdpa_choose(const Tensor& q, const Tensor& k, const Tensor& attn_mask, double dropout_p,
                       SDPABackend requested = SDPABackend::automatic);

// softmax(q k^T * scale + mask) v with PyTorch's semantics. q (B, Hq, Lq, D), k/v (B, Hkv, Lkv, D);
// attn_mask bool (true = keep) or additive, broadcastable to (B, Hq, Lq, Lkv); causal masks align
// to the bottom right when Lq != Lkv (a decode step attends to the whole cache). sliding_window > 0
// (causal only) lets each query see only its last `sliding_window` keys, itself included. kv_len
// (an i64 0-d tensor) says only the first kv_len keys exist: a KV cache of fixed size filled that
// far (the causal alignment then uses kv_len). One op ("sdpa"): its kernel picks the backend.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask = {},
                                    double dropout_p = 0.0, bool is_causal = false, std::optional<double> scale = {},
                                    bool enable_gqa = false, SDPABackend backend = SDPABackend::automatic,
                                    int64_t sliding_window = 0, const Tensor& kv_len = {});

}  // namespace sinter

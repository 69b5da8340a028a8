// scaled_dot_product_attention, math backend: the materialised reference (scores in memory).
// The flash backend replaces it for speed in a later issue.
#include <cmath>

#include "sinter/nn.h"

namespace sinter {

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask,
                                    double dropout_p, bool is_causal, std::optional<double> scale, bool enable_gqa) {
  SINTER_CHECK_SHAPE(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "[sdpa] q, k, v must be (B, H, L, D), got q", q.shape(),
                     " k", k.shape(), " v", v.shape());
  const int64_t B = q.size(0), Hq = q.size(1), Lq = q.size(2), D = q.size(3), Hkv = k.size(1), Lkv = k.size(2);
  SINTER_CHECK_SHAPE(k.size(0) == B && v.size(0) == B && k.size(3) == D && v.size(1) == Hkv && v.size(2) == Lkv,
                     "[sdpa] inconsistent shapes q", q.shape(), " k", k.shape(), " v", v.shape());
  SINTER_CHECK_SHAPE(Hkv == Hq || (enable_gqa && Hkv > 0 && Hq % Hkv == 0), "[sdpa] ", Hq, " query heads and ", Hkv,
                     " key/value heads", enable_gqa ? " (query heads must be a multiple)" : " (pass enable_gqa for GQA)");
  SINTER_CHECK(!(is_causal && attn_mask.defined()), "[sdpa] pass either is_causal or attn_mask, not both");
  Tensor kk = k, vv = v;
  if (Hkv != Hq) {  // the math backend materialises the shared heads
    const int64_t rep = Hq / Hkv;
    kk = k.unsqueeze(2).expand({B, Hkv, rep, Lkv, D}).reshape({B, Hq, Lkv, D});
    vv = v.unsqueeze(2).expand({B, Hkv, rep, Lkv, v.size(3)}).reshape({B, Hq, Lkv, v.size(3)});
  }
  const double s = scale ? *scale : 1.0 / std::sqrt(double(D));
  Tensor scores = matmul(q * s, kk.transpose(-1, -2));  // scaling q is Lq*D work, not Lq*Lkv
  if (is_causal) {
    // Bottom-right aligned: query i sees keys j <= i + (Lkv - Lq).
    Tensor mask = Tensor::empty({Lq, Lkv}, DType::boolean);
    bool* p = mask.data<bool>();
    for (int64_t i = 0; i < Lq; ++i)
      for (int64_t j = 0; j < Lkv; ++j) p[i * Lkv + j] = j > i + (Lkv - Lq);
    scores = masked_fill(scores, mask, -INFINITY);
  } else if (attn_mask.defined()) {
    scores = attn_mask.dtype() == DType::boolean ? masked_fill(scores, eq(attn_mask, zeros({}, DType::boolean)), -INFINITY)
                                                 : scores + attn_mask;
  }
  Tensor p = softmax(scores, -1);
  if (dropout_p > 0) p = dropout(p, dropout_p);
  return matmul(p, vv);
}

}  // namespace sinter

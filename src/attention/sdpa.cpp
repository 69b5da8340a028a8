// scaled_dot_product_attention: the flash backend (src/attention/flash.cpp, O(L) memory) where it
// applies, else the math backend, the materialised reference (scores in memory).
#include <cmath>

#include "sinter/autograd.h"
#include "sinter/nn.h"
#include "sinter/op.h"
#include "sinter/random.h"

namespace sinter {

namespace detail {
bool flash_fast_path(DType dtype, int64_t D, int64_t Dv);               // attention/flash.cpp
void check_attention_mask(const Shape& mask, const Shape& full, const char* op);  // attention/flash.cpp
}

SDPAChoice sdpa_choose(const Tensor& q, const Tensor& k, const Tensor& attn_mask, double dropout_p, SDPABackend requested) {
  (void)dropout_p;  // flash regenerates dropout's mask tile by tile (Philox), as the math backend draws it
  std::string why_not;
  if (attn_mask.defined() && attn_mask.requires_grad() && grad_enabled())
    why_not = "an attn_mask that requires grad (flash gives no mask gradient)";
  else if (q.dtype() != DType::f32 && q.dtype() != DType::bf16 && q.dtype() != DType::f64)
    why_not = std::string("dtype ") + dtype_name(q.dtype());
  if (requested == SDPABackend::math) return {SDPABackend::math, "math backend requested"};
  // Measured (BENCHMARKS.md): the register-blocked flash kernel is faster than math from L = 128
  // up, forward and backward; its generic path (f64, odd head dims) is a slow reference.
  if (why_not.empty() && requested == SDPABackend::automatic && !detail::flash_fast_path(q.dtype(), q.size(-1), k.size(-1)))
    return {SDPABackend::math, std::string("math: flash's fast kernel needs f32 or bf16 and head dims that are multiples of the ") +
                                   "vector width (got " + dtype_name(q.dtype()) + ", D = " + std::to_string(q.size(-1)) + ")"};
  if (why_not.empty()) return {SDPABackend::flash, std::string("flash: ") + dtype_name(q.dtype()) + ", head dims " +
                                                       std::to_string(q.size(-1)) + "/" + std::to_string(k.size(-1)) +
                                                       (requested == SDPABackend::flash ? " (requested)" : "")};
  SINTER_CHECK(requested != SDPABackend::flash, "[sdpa] the flash backend was requested but cannot run: ", why_not);
  return {SDPABackend::math, "math: " + why_not};
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask,
                                    double dropout_p, bool is_causal, std::optional<double> scale, bool enable_gqa,
                                    SDPABackend backend, int64_t sliding_window) {
  SINTER_CHECK_SHAPE(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "[sdpa] q, k, v must be (B, H, L, D), got q", q.shape(),
                     " k", k.shape(), " v", v.shape());
  const int64_t B = q.size(0), Hq = q.size(1), Lq = q.size(2), D = q.size(3), Hkv = k.size(1), Lkv = k.size(2);
  SINTER_CHECK_SHAPE(k.size(0) == B && v.size(0) == B && k.size(3) == D && v.size(1) == Hkv && v.size(2) == Lkv,
                     "[sdpa] inconsistent shapes q", q.shape(), " k", k.shape(), " v", v.shape());
  SINTER_CHECK_SHAPE(Hkv == Hq || (enable_gqa && Hkv > 0 && Hq % Hkv == 0), "[sdpa] ", Hq, " query heads and ", Hkv,
                     " key/value heads", enable_gqa ? " (query heads must be a multiple)" : " (pass enable_gqa for GQA)");
  SINTER_CHECK(!(is_causal && attn_mask.defined()), "[sdpa] pass either is_causal or attn_mask, not both");
  SINTER_CHECK(sliding_window >= 0 && (sliding_window == 0 || is_causal), "[sdpa] a sliding window (", sliding_window,
               ") needs is_causal and a positive size");
  SINTER_CHECK(dropout_p >= 0 && dropout_p < 1, "[sdpa] dropout_p must be in [0, 1), got ", dropout_p);
  if (attn_mask.defined()) detail::check_attention_mask(attn_mask.shape(), {B, Hq, Lq, Lkv}, "sdpa");
  const double s = scale ? *scale : 1.0 / std::sqrt(double(D));
  if (sdpa_choose(q, k, attn_mask, dropout_p, backend).backend == SDPABackend::flash) {
    static const OpDef& flash = get_op("sdpa_flash");  // K/V heads shared by query heads, never copied
    Attrs a{{"scale", s}, {"causal", is_causal}};
    if (sliding_window > 0) a.set("window", sliding_window);
    if (dropout_p > 0) {  // the reservation the math backend's dropout of the (B, Hq, Lq, Lkv) matrix makes
      Generator& gen = default_generator();
      const uint64_t counter = gen.reserve(uint64_t((B * Hq * Lq * Lkv + 3) / 4));
      a.set("dropout_p", dropout_p), a.set("seed", int64_t(gen.seed)), a.set("counter", int64_t(counter));
    }
    std::vector<Tensor> in{q, k, v};
    if (attn_mask.defined()) {  // additive, in the compute dtype; a boolean mask keeps where true
      const DType ct = q.dtype() == DType::f64 ? DType::f64 : DType::f32;
      in.push_back(attn_mask.dtype() == DType::boolean
                       ? masked_fill(zeros(attn_mask.shape(), ct), eq(attn_mask, zeros({}, DType::boolean)), -INFINITY)
                       : attn_mask.detach().to(ct));
    }
    return call(flash, in, a)[0];
  }
  Tensor kk = k, vv = v;
  if (Hkv != Hq) {  // the math backend materialises the shared heads
    const int64_t rep = Hq / Hkv;
    kk = k.unsqueeze(2).expand({B, Hkv, rep, Lkv, D}).reshape({B, Hq, Lkv, D});
    vv = v.unsqueeze(2).expand({B, Hkv, rep, Lkv, v.size(3)}).reshape({B, Hq, Lkv, v.size(3)});
  }
  Tensor scores = matmul(q * s, kk.transpose(-1, -2));  // scaling q is Lq*D work, not Lq*Lkv
  if (attn_mask.defined())
    scores = attn_mask.dtype() == DType::boolean ? masked_fill(scores, eq(attn_mask, zeros({}, DType::boolean)), -INFINITY)
                                                 : scores + attn_mask;
  // Causal: bottom-right aligned, query i sees keys j <= i + (Lkv - Lq); no mask tensor. Not
  // causal: every key visible. A row that sees nothing gives 0 (causal_softmax is a safe softmax).
  Tensor p = causal_softmax(scores, is_causal ? Lkv - Lq : Lkv, sliding_window);
  if (dropout_p > 0) p = dropout(p, dropout_p);
  return matmul(p, vv);
}

}  // namespace sinter

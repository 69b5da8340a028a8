// The sdpa op: softmax(q k^T scale + mask) v as one op, whose CPU kernel (cpu/attention/sdpa_cpu.cpp)
// picks flash or the math reference below (public ops, scores materialised; it also differentiates
// the calls run that way).
//   sdpa(q, k, v[, mask][, kv_len]) -> (o, lse): q (B, Hq, Lq, D), k/v (B, Hkv, Lkv, D|Dv); mask bool
//     (true = keep) or additive, broadcast to (B, Hq, Lq, Lkv); kv_len (i64 0-d): only the first
//     kv_len keys exist; lse (B, Hq, Lq). attrs scale, causal, window, gqa, backend (auto, flash,
//     math), mask, kv_len (which optional inputs are present)[, dropout_p, seed, counter].
//   sdpa_flash_backward(q, k, v, o, lse, do, dlse[, mask]) -> (dq, dk, dv)  mask additive; lse_grad false: dlse is 0
#include <cmath>

#include "attention/attention.h"
#include "ops/common.h"
#include "sinter/autograd.h"
#include "sinter/attention.h"

namespace sinter {
namespace detail {

void check_attention_mask(const Shape& m, const Shape& full, const char* op) {
  bool ok = m.size() <= 4;
  for (size_t i = 0; ok && i < m.size(); ++i) ok = m[m.size() - 1 - i] == full[3 - i] || m[m.size() - 1 - i] == 1;
  SINTER_CHECK_SHAPE(ok, "[", op, "] the mask", m, " does not broadcast to (B, Hq, Lq, Lkv) = ", full);
}

// The math backend: softmax(q k^T scale + mask) v with the scores in memory, in public ops. With
// `lse`, also the rows' log-sum-exp of the visible scores (-inf where none is visible), read off
// the softmax: at a row's largest probability p_j, lse = s_j - log p_j.
Tensor sdpa_math(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, int64_t kv_len, const Attrs& a,
                 Tensor* lse) {
  const int64_t B = q.size(0), Hq = q.size(1), Lq = q.size(2), Hkv = k.size(1);
  Tensor kk = kv_len < k.size(2) ? k.narrow(2, 0, kv_len) : k, vv = kv_len < v.size(2) ? v.narrow(2, 0, kv_len) : v;
  if (Hkv != Hq) {  // the math backend materialises the shared heads
    const int64_t rep = Hq / Hkv;
    kk = kk.unsqueeze(2).expand({B, Hkv, rep, kv_len, kk.size(3)}).reshape({B, Hq, kv_len, kk.size(3)});
    vv = vv.unsqueeze(2).expand({B, Hkv, rep, kv_len, vv.size(3)}).reshape({B, Hq, kv_len, vv.size(3)});
  }
  Tensor scores = matmul(q * a.f("scale"), kk.transpose(-1, -2));  // scaling q is Lq*D work, not Lq*Lkv
  if (mask.defined()) {
    const Tensor m = kv_len < mask.size(-1) ? mask.narrow(-1, 0, kv_len) : mask;
    scores = m.dtype() == DType::boolean ? masked_fill(scores, eq(m, zeros({}, DType::boolean)), -INFINITY) : scores + m;
  }
  // Causal: bottom-right aligned, query i sees keys j <= i + (kv_len - Lq). Not causal: every key.
  // A row that sees nothing gives 0 (causal_softmax is a safe softmax).
  Tensor p = causal_softmax(scores, a.b("causal") ? kv_len - Lq : kv_len, a.i_or("window", 0));
  if (lse) {
    const ValuesIndices top = max(p, -1, true);
    const Tensor s_at = gather(scores, -1, top.indices), seen = gt(top.values, zeros({}, p.dtype()));
    const Tensor p_top = where(seen, top.values, ones({}, p.dtype()));  // no log(0) (nor its gradient) in rows that see nothing
    *lse = where(seen, s_at - log(p_top), full({}, -INFINITY, p.dtype())).squeeze(-1).to(compute_dtype(q.dtype()));
  }
  if (a.has("dropout_p") && a.f("dropout_p") > 0) {  // the draws flash makes, element by element
    static const OpDef& dropout_op = get_op("dropout");
    p = call1(dropout_op, {p}, {{"p", a.f("dropout_p")}, {"seed", a.i("seed")}, {"counter", a.i("counter")}});
  }
  return matmul(p, vv);
}

namespace {

struct Optional {
  Tensor mask, kv_len;
};
Optional optional_inputs(std::span<const Tensor> in, const Attrs& a) {
  Optional o;
  size_t at = 3;
  if (a.b("mask")) o.mask = in[at++];
  if (a.b("kv_len")) o.kv_len = in[at++];
  return o;
}

std::vector<TensorMeta> sdpa_infer(std::span<const TensorMeta> in, const Attrs& a) {
  const size_t want = 3 + a.b("mask") + a.b("kv_len");
  SINTER_CHECK(in.size() == want, "[sdpa] takes q, k, v", a.b("mask") ? ", mask" : "", a.b("kv_len") ? ", kv_len" : "", ": ",
               want, " inputs, got ", in.size());
  const Geometry g = geometry(in, a, "sdpa");
  SINTER_CHECK_SHAPE(g.Hq == g.Hkv || a.b("gqa"), "[sdpa] ", g.Hq, " query heads and ", g.Hkv,
                     " key/value heads (pass enable_gqa for GQA)");
  size_t at = 3;
  if (a.b("mask")) {
    check_attention_mask(in[at].shape, {g.B, g.Hq, g.Lq, g.Lkv}, "sdpa");
    SINTER_CHECK_DTYPE(in[at].dtype == DType::boolean || is_floating(in[at].dtype), "[sdpa] the mask must be bool or floating, got ",
                       in[at].dtype);
    ++at;
  }
  if (a.b("kv_len"))
    SINTER_CHECK(in[at].shape.empty() && in[at].dtype == DType::i64, "[sdpa] kv_len must be an i64 0-d tensor, got ", in[at].shape,
                 " ", in[at].dtype);
  const std::string& be = a.str("backend");
  SINTER_CHECK(be == "auto" || be == "flash" || be == "math", "[sdpa] backend must be auto, flash or math, got '", be, "'");
  return {{{g.B, g.Hq, g.Lq, g.Dv}, in[0].dtype, in[0].device}, {{g.B, g.Hq, g.Lq}, compute_dtype(in[0].dtype), in[0].device}};
}

// The additive mask flash reads: bool masks become 0 / -inf in the compute dtype.
Tensor additive_mask(const Tensor& mask, DType ct) {
  if (mask.dtype() != DType::boolean) return mask.detach().to(ct);
  return masked_fill(zeros(mask.shape(), ct, mask.device()), eq(mask, zeros({}, DType::boolean)), -INFINITY);
}

std::vector<Tensor> sdpa_backward(BackwardCtx& c) {
  const Optional opt = optional_inputs(c.inputs, c.attrs);
  SINTER_CHECK_T(AutogradError, !opt.kv_len.defined(), "[sdpa] no backward through a call with kv_len (a decode step)");
  const Tensor &q = c.inputs[0], &k = c.inputs[1], &v = c.inputs[2];
  std::vector<Tensor> out(c.inputs.size());
  if (choose_sdpa(c.input_meta, c.attrs).backend == SDPABackend::flash) {
    static const OpDef& bw = get_op("sdpa_flash_backward");
    std::vector<Tensor> in{q, k, v, c.outputs[0], c.outputs[1], c.grads[0], c.grads[1]};
    if (opt.mask.defined()) in.push_back(additive_mask(opt.mask, compute_dtype(q.dtype())));
    Attrs a = c.attrs;
    a.set("lse_grad", c.flowed.size() < 2 || c.flowed[1]);  // false: dlse is zeros, which a kernel may skip reading
    auto g = call(bw, in, a);
    out[0] = g[0], out[1] = g[1], out[2] = g[2];  // no mask gradient (a mask that wants one runs math)
    return out;
  }
  // Math: differentiate the reference on detached copies of the inputs.
  EnableGradGuard on;
  std::vector<Tensor> leaves, wanted;
  for (size_t i = 0; i < 3 + size_t(opt.mask.defined()); ++i) {
    Tensor t = c.inputs[i].detach();
    if (c.needs_grad[i] && is_floating(t.dtype())) t.requires_grad_(true), wanted.push_back(t);
    leaves.push_back(t);
  }
  Tensor lse;
  const Tensor o = sdpa_math(leaves[0], leaves[1], leaves[2], opt.mask.defined() ? leaves[3] : Tensor(), k.size(2), c.attrs, &lse);
  if (wanted.empty()) return out;
  std::vector<Tensor> g = autograd::grad({o, lse}, wanted, {c.grads[0], c.grads[1]}, false, false, true);
  for (size_t i = 0, w = 0; i < leaves.size(); ++i)
    if (leaves[i].requires_grad()) out[i] = g[w++];
  return out;
}

std::vector<TensorMeta> flash_backward_infer(std::span<const TensorMeta> in, const Attrs& a) {
  SINTER_CHECK(in.size() == 7 || in.size() == 8, "[sdpa_flash_backward] takes q, k, v, o, lse, do, dlse and an optional mask, got ",
               in.size(), " inputs");
  const Geometry g = geometry(in.subspan(0, 3), a, "sdpa_flash_backward");
  const Shape o{g.B, g.Hq, g.Lq, g.Dv};
  const Shape rows{g.B, g.Hq, g.Lq};
  SINTER_CHECK_SHAPE(in[3].shape == o && in[5].shape == o && in[4].shape == rows && in[6].shape == rows, "[sdpa_flash_backward] o",
                     in[3].shape, ", lse", in[4].shape, ", do", in[5].shape, ", dlse", in[6].shape, " do not match q", in[0].shape,
                     " and v", in[2].shape);
  const DType ct = compute_dtype(in[0].dtype);
  for (size_t i = 3; i < 7; ++i) {
    const DType want = (i == 4 || i == 6) ? ct : in[0].dtype;  // lse and its gradient stay in the compute dtype
    SINTER_CHECK_DTYPE(in[i].dtype == want, "[sdpa_flash_backward] input ", i, " has dtype ", in[i].dtype, ", expected ", want);
  }
  if (in.size() == 8) {
    check_attention_mask(in[7].shape, {g.B, g.Hq, g.Lq, g.Lkv}, "sdpa_flash_backward");
    SINTER_CHECK_DTYPE(is_floating(in[7].dtype), "[sdpa_flash_backward] the mask must be additive (floating), got ", in[7].dtype);
  }
  return {in[0], in[1], in[2]};
}

}  // namespace

namespace {
// What a kernel calls when the choice is math: the reference, as ops, recording no autograd.
Tensor sdpa_math_in_kernel(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, int64_t kv_len, const Attrs& a,
                           Tensor* lse) {
  NoGradGuard no_grad;
  return sdpa_math(q, k, v, mask, kv_len, a, lse);
}
}  // namespace

void register_attention_ops() {
  register_sdpa_math(sdpa_math_in_kernel);
  add_op({.name = "sdpa", .num_inputs = -1, .min_inputs = 3, .num_outputs = 2, .infer = sdpa_infer, .backward = sdpa_backward,
          .save_outputs = 3});
  add_op({.name = "sdpa_flash_backward", .num_inputs = -1, .min_inputs = 7, .num_outputs = 3, .infer = flash_backward_infer});
}

}  // namespace detail

namespace {
// The choice a call gets; sdpa_choose also names the device's kernel (detail::flash_detail), which
// a call does not need.
SDPAChoice choose_for_call(const Tensor& q, const Tensor& k, const Tensor& attn_mask, SDPABackend requested, std::vector<TensorMeta>& meta,
                           Attrs& a) {
  std::string why_not;
  if (attn_mask.defined() && attn_mask.requires_grad() && grad_enabled())
    why_not = "an attn_mask that requires grad (flash gives no mask gradient)";
  else if (q.dtype() != DType::f32 && q.dtype() != DType::bf16 && q.dtype() != DType::f64)
    why_not = std::string("dtype ") + dtype_name(q.dtype());
  if (requested == SDPABackend::math) return {SDPABackend::math, "math backend requested"};
  if (!why_not.empty()) {
    SINTER_CHECK(requested != SDPABackend::flash, "[sdpa] the flash backend was requested but cannot run: ", why_not);
    return {SDPABackend::math, "math: " + why_not};
  }
  a = Attrs{{"backend", std::string(requested == SDPABackend::flash ? "flash" : "auto")}, {"mask", attn_mask.defined()}};
  meta = {{q.shape(), q.dtype(), q.device()}, {k.shape(), k.dtype(), k.device()}, {k.shape(), k.dtype(), k.device()}};
  if (attn_mask.defined()) meta.push_back({attn_mask.shape(), attn_mask.dtype(), attn_mask.device()});
  (void)get_op("sdpa");  // the backends register their fast paths with the op table
  return detail::choose_sdpa(meta, a);
}
}  // namespace

SDPAChoice sdpa_choose(const Tensor& q, const Tensor& k, const Tensor& attn_mask, double dropout_p, SDPABackend requested) {
  (void)dropout_p;  // flash regenerates dropout's mask tile by tile (Philox), as the math backend draws it
  std::vector<TensorMeta> meta;
  Attrs a;
  SDPAChoice c = choose_for_call(q, k, attn_mask, requested, meta, a);
  if (const std::string more = c.backend == SDPABackend::flash ? detail::flash_detail(meta, a) : ""; !more.empty()) c.reason += "; " + more;
  return c;
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask, double dropout_p,
                                    bool is_causal, std::optional<double> scale, bool enable_gqa, SDPABackend backend,
                                    int64_t sliding_window, const Tensor& kv_len) {
  static const OpDef& op = get_op("sdpa");
  if (const DType c = autocast_dtype(); c != DType::f32 && q.dtype() == DType::f32 && q.device().type == DeviceType::cuda) {
    AutocastGuard off(DType::f32);  // autocast on CUDA (ops.h): in bf16, the result back in f32
    const Tensor m = attn_mask.defined() && is_floating(attn_mask.dtype()) ? cast(attn_mask, c) : attn_mask;
    return cast(scaled_dot_product_attention(cast(q, c), cast(k, c), cast(v, c), m, dropout_p, is_causal, scale, enable_gqa, backend,
                                             sliding_window, kv_len),
                DType::f32);
  }
  SINTER_CHECK_SHAPE(q.dim() == 4, "[sdpa] q, k, v must be (B, H, L, D), got q", q.shape(), " k", k.shape(), " v", v.shape());
  SINTER_CHECK(!(is_causal && attn_mask.defined()), "[sdpa] pass either is_causal or attn_mask, not both");
  SINTER_CHECK(dropout_p >= 0 && dropout_p < 1, "[sdpa] dropout_p must be in [0, 1), got ", dropout_p);
  // The math backend asked for (or forced by a mask that wants a gradient, which flash does not
  // give) runs as the reference's own ops, with their autograd; otherwise the sdpa op's kernel
  // chooses (flash, or math where flash's fast kernel cannot run).
  std::vector<TensorMeta> meta;
  Attrs choice_attrs;
  const SDPAChoice forced = choose_for_call(q, k, attn_mask, backend, meta, choice_attrs);
  const bool as_ops = forced.backend == SDPABackend::math && (backend == SDPABackend::math || !forced.reason.starts_with("math: flash"));
  const std::string be = backend == SDPABackend::flash ? "flash" : "auto";
  Attrs a{{"scale", scale ? *scale : 1.0 / std::sqrt(double(q.size(3)))}, {"causal", is_causal}, {"gqa", enable_gqa},
          {"backend", be}, {"mask", attn_mask.defined()}, {"kv_len", kv_len.defined()}};
  if (sliding_window != 0) a.set("window", sliding_window);
  if (dropout_p > 0) {  // one reservation for the (B, Hq, Lq, Lkv) matrix, whichever backend draws it
    Generator& gen = default_generator();
    const uint64_t counter = gen.reserve(uint64_t((q.size(0) * q.size(1) * q.size(2) * k.size(2) + 3) / 4));
    a.set("dropout_p", dropout_p), a.set("seed", int64_t(gen.seed)), a.set("counter", int64_t(counter));
  }
  if (as_ops) {
    SINTER_CHECK(!kv_len.defined(), "[sdpa] kv_len runs on the sdpa op's kernels; the math backend takes k and v as they are");
    std::vector<TensorMeta> meta{{q.shape(), q.dtype(), q.device()}, {k.shape(), k.dtype(), k.device()}, {v.shape(), v.dtype(), v.device()}};
    if (attn_mask.defined()) meta.push_back({attn_mask.shape(), attn_mask.dtype(), attn_mask.device()});
    op.infer(meta, a);  // the op's checks, naming it
    return detail::sdpa_math(q, k, v, attn_mask, k.size(2), a, nullptr);
  }
  std::vector<Tensor> in{q, k, v};
  if (attn_mask.defined()) in.push_back(attn_mask);
  if (kv_len.defined()) in.push_back(kv_len);
  return call(op, in, a)[0];
}

}  // namespace sinter

// The CUDA kernels of sdpa and sdpa_flash_backward. Where detail::choose_sdpa picks flash (f32 and
// bf16, head dims up to 256): cuDNN's fused attention for the bf16 calls it takes (cudnn_sdpa.h),
// the FlashAttention-2 kernels (flash.cu; flash_tc.cu, bf16 on the tensor cores) for the rest;
// the math reference (src/attention/sdpa.cpp, in ops that run on the CUDA kernels) otherwise.
// A KV cache's length (`kv_len`, a tensor on the device) is never read by the host: flash reads it
// on the device; the reference runs over the whole cache with the positions past it, and the
// causal rule, as a mask built on the device.
#include <cmath>
#include <span>

#include "attention/attention.h"
#include "cuda/cuda.h"
#include "cuda/cudnn_sdpa.h"
#include "cuda/flash.h"
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

bool flash_fast_path(DType dtype, int64_t D, int64_t Dv) {
  return (dtype == DType::f32 || dtype == DType::bf16) && D <= kMaxHeadDim && Dv <= kMaxHeadDim;
}

// What sdpa_choose reports for a flash call on CUDA: which kernel runs it, and why.
std::string flash_detail(std::span<const TensorMeta> in, const Attrs& a) {
  const Shape &q = in[0].shape, &k = in[1].shape, &v = in[2].shape;
  detail::Geometry g{q[0], q[1], k[1], q[2], k[2], q[3], v[3], 1.0, a.b_or("causal", false), a.i_or("window", 0)};
  g.dropout = a.has("dropout_p") ? a.f("dropout_p") : 0.0;
  const bool mask = a.b_or("mask", false);
  std::string why = cudnn_sdpa_why_not(g, in[0].dtype);
  if (why.empty() && mask && (in.size() < 4 || in[3].dtype != in[0].dtype)) why = "the mask is not additive in q's dtype";
  if (why.empty() && a.b_or("kv_len", false)) why = "a KV cache's length";
  if (why.empty()) return "cuDNN's fused attention runs it (where the layouts suit cuDNN)";
  std::string out = flash_tc_takes(g, in[0].dtype) ? "Sinter's tensor-core flash kernel" : "Sinter's flash kernel";
  return out.append(" runs it (not cuDNN: ").append(why).append(")");
}

using detail::layout_of;
using detail::metas;
using detail::out_rows;

// t where it lies when its last dim is contiguous (a transposed projection, a KV cache), else a
// contiguous copy; its layout goes to `l`.
Tensor rows_of(const Tensor& t, detail::RowLayout& l) {
  const Tensor r = t.size(3) <= 1 || t.stride(3) == 1 ? t : t.contiguous();
  l = layout_of(r);
  return r;
}

// The mask as the kernels read it: additive f32 (a boolean one as 0 / -inf), its strides broadcast
// to (B, Hq, Lq, Lkv) in g.ms.
Tensor additive_f32(const Tensor& mask, detail::Geometry& g) {
  const Device dev = mask.device();
  const Tensor m = mask.dtype() == DType::boolean
                       ? where(mask, full({}, 0.0, DType::f32, dev), full({}, -INFINITY, DType::f32, dev))
                       : (mask.dtype() == DType::f32 ? mask : cast(mask, DType::f32));
  const int64_t off = 4 - m.dim();
  for (int64_t i = 0; i < 4; ++i) g.ms[i] = i < off || m.size(i - off) == 1 ? 0 : m.stride(i - off);
  g.has_mask = true;
  return m;
}

// The bias cuDNN reads for a mask: the additive mask itself, in q's dtype, 4-D, over whole
// (Lq, Lkv) matrices; undefined (no mask) or not taken (`ok` false) otherwise.
Tensor cudnn_bias(const Tensor& mask, const detail::Geometry& g, DType dtype, bool& ok) {
  ok = !mask.defined() || (mask.dim() == 4 && mask.dtype() == dtype && mask.size(2) == g.Lq && mask.size(3) == g.Lkv);
  return ok ? mask : Tensor();
}

void flash_sdpa(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a, const Tensor& mask, const Tensor& kv_len) {
  detail::Geometry g = detail::geometry(metas(in, 3), a, "sdpa");
  const Tensor q = rows_of(in[0], g.lq), k = rows_of(in[1], g.lk), v = rows_of(in[2], g.lv);
  out_rows(out[0], g.lo);
  bool bias_ok = false;
  const Tensor bias = cudnn_bias(mask, g, q.dtype(), bias_ok);
  if (bias_ok && !kv_len.defined() && cudnn_sdpa_forward(g, q, k, v, bias, out[0], out[1])) return;
  FlashExtras x;
  const Tensor m = mask.defined() ? additive_f32(mask, g) : Tensor();  // freed in stream order, after the kernel
  if (m.defined()) x.mask = static_cast<const float*>(m.data_ptr());
  const Tensor n = kv_len.defined() ? checked_indices("sdpa", kv_len.reshape({1}), g.Lkv + 1, "kv_len") : Tensor();  // 0..Lkv
  if (n.defined()) x.kv_len = static_cast<const int64_t*>(n.data_ptr());
  flash_forward(g, q.dtype(), q.data_ptr(), k.data_ptr(), v.data_ptr(), x, out[0].data_ptr(), static_cast<float*>(out[1].data_ptr()),
                q.device().index);
}

void sdpa_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  size_t at = 3;
  Tensor mask = a.b("mask") ? in[at++] : Tensor();
  const Tensor kv_len = a.b("kv_len") ? in[at] : Tensor();
  if (detail::choose_sdpa(metas(in, mask.defined() ? 4 : 3), a).backend == SDPABackend::flash)
    return flash_sdpa(in, out, a, mask, kv_len);
  Tensor lse;
  if (!kv_len.defined()) {
    copy_convert("sdpa", detail::sdpa_math_reference(in[0], in[1], in[2], mask, in[1].size(2), a, &lse), out[0]);
    copy_convert("sdpa", lse, out[1]);
    return;
  }
  const int64_t L = in[1].size(2), Lq = in[0].size(2);
  const Tensor keep = cached_mask(kv_len, Lq, L, a.b("causal"), a.i_or("window", 0));
  if (!mask.defined()) mask = keep;
  else if (mask.dtype() == DType::boolean) mask = where(keep, mask, keep);
  else mask = where(keep, mask, full({}, -INFINITY, mask.dtype(), mask.device()));
  Attrs whole = a;  // the mask now says what the causal rule and the window said
  whole.set("causal", false);
  whole.set("window", int64_t(0));
  copy_convert("sdpa", detail::sdpa_math_reference(in[0], in[1], in[2], mask, L, whole, &lse), out[0]);
  copy_convert("sdpa", lse, out[1]);
}

// sdpa_flash_backward(q, k, v, o, lse, do, dlse[, mask]) -> (dq, dk, dv): dQ summed in f32 by
// atomic adds, then rounded into dq.
void flash_backward_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  detail::Geometry g = detail::geometry(metas(in, 3), a, "sdpa_flash_backward");
  SINTER_CHECK(flash_fast_path(in[0].dtype(), g.D, g.Dv), "[sdpa_flash_backward] the CUDA flash kernels take f32 or bf16 with head dims up to ",
               kMaxHeadDim, ", got ", in[0].dtype(), " with ", g.D, "/", g.Dv);
  const Tensor q = rows_of(in[0], g.lq), k = rows_of(in[1], g.lk), v = rows_of(in[2], g.lv), o = rows_of(in[3], g.lo);
  const Tensor dout = rows_of(in[5], g.ldo), lse = in[4].contiguous(), dlse = in[6].contiguous();
  bool bias_ok = false;
  const Tensor bias = cudnn_bias(in.size() > 7 ? in[7] : Tensor(), g, q.dtype(), bias_ok);
  if (bias_ok && !a.b_or("lse_grad", true) && cudnn_sdpa_backward(g, q, k, v, o, lse, dout, bias, out)) return;
  FlashExtras x;
  const Tensor m = in.size() > 7 ? additive_f32(in[7], g) : Tensor();
  if (m.defined()) x.mask = static_cast<const float*>(m.data_ptr());
  out_rows(out[1], g.ldk), out_rows(out[2], g.ldv);
  const Device dev = q.device();
  const Tensor dq_acc = zeros({g.B, g.Hq, g.Lq, g.D}, DType::f32, dev), delta = Tensor::empty({g.B, g.Hq, g.Lq}, DType::f32, dev);
  flash_backward(g, q.dtype(), q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), static_cast<const float*>(lse.data_ptr()),
                 dout.data_ptr(), static_cast<const float*>(dlse.data_ptr()), x, static_cast<float*>(delta.data_ptr()),
                 static_cast<float*>(dq_acc.data_ptr()), out[1].data_ptr(), out[2].data_ptr(), dev.index);
  copy_convert("sdpa_flash_backward", dq_acc, out[0]);
}

}  // namespace

void register_attention_kernels() {
  register_kernel("sdpa", DeviceType::cuda, sdpa_kernel);
  register_kernel("sdpa_flash_backward", DeviceType::cuda, flash_backward_kernel);
  detail::register_flash_fast_path(DeviceType::cuda, flash_fast_path, /*fast_only=*/true);
  detail::register_flash_detail(DeviceType::cuda, flash_detail);
}

}  // namespace sinter::cuda

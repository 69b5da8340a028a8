// CPU kernels of sdpa and sdpa_flash_backward (src/attention/sdpa.cpp). The sdpa kernel is the one
// place the backend is chosen (detail::choose_sdpa, which sdpa_choose reports): flash, or the math
// reference run as ops.
#include "cpu/attention/flash.h"
#include "cpu/cpu.h"
#include "ops/common.h"
#include "sinter/autograd.h"
#include "sinter/attention.h"

namespace sinter::detail {

// Any head dims: the forward reads the tails of K's and V's rows masked, the backward runs on
// copies padded with zeros to whole blocks (zero columns add nothing to a score or a gradient).
bool flash_fast_path(DType dtype, int64_t, int64_t) { return dtype == DType::f32 || dtype == DType::bf16; }

namespace {

// The mask in the compute dtype (bool masks as 0 / -inf), broadcast to (B, Hq, Lq, Lkv); its
// strides go to g.ms.
Tensor mask_view(const Tensor& mask, DType ct, Geometry& g) {
  Tensor m = mask;
  if (m.dtype() == DType::boolean) {
    Tensor add = Tensor::empty(m.shape(), ct);
    Tensor lo = Tensor::empty({}, ct), zero = Tensor::empty({}, ct);
    cpu::fill(lo, -INFINITY), cpu::fill(zero, 0.0);
    cpu::where(m, zero, lo, add);
    m = add;
  } else if (m.dtype() != ct) {
    m = cpu::contiguous_as(m, ct);
  }
  Shape strides(4, 0);
  const int64_t off = 4 - m.dim();
  const Shape full{g.B, g.Hq, g.Lq, g.Lkv};
  for (int64_t i = 0; i < m.dim(); ++i) strides[size_t(off + i)] = m.size(i) == 1 ? 0 : m.stride(i);
  g.has_mask = true;
  for (int i = 0; i < 4; ++i) g.ms[i] = strides[size_t(i)];
  return raw_view(m, full, strides, m.offset());
}

// t where it lies when it is in dtype ct with a contiguous last dim (a transposed view of a
// (B, L, H, D) projection, the first positions of a KV cache), else a contiguous copy (bf16
// widened where ct is f32); its layout goes to `l`.
Tensor rows_of(const Tensor& t, DType ct, RowLayout& l) {
  const Tensor r = t.dtype() == ct && (t.size(3) <= 1 || t.stride(3) == 1) ? t : cpu::contiguous_as(t, ct);
  l = layout_of(r);
  return r;
}

// Runs `body` with pointers of the compute type T (f64, or f32 also for bf16 tensors, widened).
template <class F> void with_compute_type(DType dt, F&& body) {
  if (dt == DType::f64) body.template operator()<double>();
  else body.template operator()<float>();
}

int64_t read_kv_len(const Tensor& t, int64_t capacity) {
  const int64_t n = *t.data<int64_t>();
  SINTER_CHECK_INDEX(n >= 0 && n <= capacity, "[sdpa] kv_len ", n, " out of range for a KV cache of ", capacity, " positions");
  return n;
}

void flash_forward_into(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const Tensor& mask, Geometry g,
                        const Tensor& o_out, const Tensor& lse) {
  const DType ct = compute_dtype(q_in.dtype());
  Tensor m = mask.defined() ? mask_view(mask, ct, g) : Tensor();
  const bool all_bf16 = q_in.dtype() == DType::bf16 && k_in.dtype() == DType::bf16 && v_in.dtype() == DType::bf16;
  if (all_bf16 && o_out.dtype() == DType::bf16 && flash_amx_takes(g)) {  // prefill on the tile unit, K and V read where they lie
    const Tensor q = rows_of(q_in, DType::bf16, g.lq), k = rows_of(k_in, DType::bf16, g.lk), v = rows_of(v_in, DType::bf16, g.lv);
    const Tensor o = out_rows(o_out, g.lo);
    flash_forward_amx(g, q.data<bf16>(), k.data<bf16>(), v.data<bf16>(), m.defined() ? static_cast<const float*>(m.data_ptr()) : nullptr,
                      o.data<bf16>(), lse.data<float>());
    return;
  }
  // Decode (at most 4 query rows per kv head) on bf16 K and V: read in place, widened as loaded.
  const bool kv_bf16 = all_bf16 && (g.Hq / g.Hkv) * g.Lq <= 4;
  with_compute_type(q_in.dtype(), [&]<class T>() {
    Tensor q = rows_of(q_in, ct, g.lq), k = rows_of(k_in, kv_bf16 ? DType::bf16 : ct, g.lk), v = rows_of(v_in, kv_bf16 ? DType::bf16 : ct, g.lv);
    Tensor o = out_rows(o_out.dtype() == ct ? o_out : Tensor::empty(o_out.shape(), ct), g.lo);
    const T* mp = m.defined() ? static_cast<const T*>(m.data_ptr()) : nullptr;
    if constexpr (std::is_same_v<T, float>) {
      if (kv_bf16)
        flash_forward_f32(g, q.data<T>(), k.data<bf16>(), v.data<bf16>(), mp, o.data<T>(), lse.data<T>());
      else
        flash_forward_f32(g, q.data<T>(), k.data<T>(), v.data<T>(), mp, o.data<T>(), lse.data<T>());
    } else {
      flash_forward<T>(g, q.data<T>(), k.data<T>(), v.data<T>(), mp, o.data<T>(), lse.data<T>());
    }
    if (o_out.dtype() != ct) cpu::copy(o, o_out);  // bf16: rounded once, at the end
  });
}

void sdpa_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  SINTER_KERNEL_ENTRY();
  size_t at = 3;
  const Tensor mask = a.b("mask") ? in[at++] : Tensor();
  const Tensor& q = in[0];
  Tensor k = in[1], v = in[2];
  int64_t kv_len = k.size(2);
  if (a.b("kv_len")) {
    kv_len = read_kv_len(in[at], k.size(2));
    k = raw_slice(k, 2, 0, kv_len), v = raw_slice(v, 2, 0, kv_len);
  }
  const std::vector<TensorMeta> meta = metas(in, mask.defined() ? 4 : 3);  // the choice weighs the mask too
  if (choose_sdpa(meta, a).backend == SDPABackend::math) {
    Tensor lse;
    cpu::copy(sdpa_math_reference(q, in[1], in[2], mask, kv_len, a, &lse), out[0]);
    cpu::copy(lse, out[1]);
    return;
  }
  const TensorMeta kv[3] = {meta[0], {k.shape(), k.dtype(), k.device()}, {v.shape(), v.dtype(), v.device()}};
  Geometry g = geometry(kv, a, "sdpa");
  flash_forward_into(q, k, v, mask.defined() && kv_len < mask.size(-1) ? raw_slice(mask, mask.dim() - 1, 0, kv_len) : mask, g,
                     out[0], out[1]);
}

// t (B, H, L, n) as a contiguous f32 copy with its last dim zero-padded to `to`.
Tensor padded(const Tensor& t, int64_t to) {
  Tensor p = Tensor::empty({t.size(0), t.size(1), t.size(2), to}, DType::f32);
  cpu::fill(p, 0.0);
  cpu::copy(t, raw_slice(p, 3, 0, t.size(3)));
  return p;
}

// The f32 backward on head dims padded to whole blocks (kNr): q and k to Dp, v, o and dO to Dvp;
// the gradients come back narrowed into `out`.
void flash_backward_padded(Geometry g, std::span<const Tensor> in, const Tensor& mask, std::span<Tensor> out) {
  const int64_t D = g.D, Dv = g.Dv, Dp = round_up(D, kNr), Dvp = round_up(Dv, kNr);
  const int64_t widths[] = {Dp, Dp, Dvp, Dvp, 0, Dvp, 0};
  RowLayout* const layouts[] = {&g.lq, &g.lk, &g.lv, &g.lo, nullptr, &g.ldo, nullptr};
  std::vector<Tensor> c;
  for (size_t i = 0; i < 7; ++i) {
    c.push_back(widths[i] ? padded(in[i], widths[i]) : cpu::contiguous_as(in[i], DType::f32));
    if (layouts[i]) *layouts[i] = layout_of(c.back());
  }
  std::vector<Tensor> grads;
  RowLayout* const grad_layouts[] = {&g.ldq, &g.ldk, &g.ldv};
  for (size_t i = 0; i < 3; ++i) {
    grads.push_back(Tensor::empty({out[i].size(0), out[i].size(1), out[i].size(2), i == 2 ? Dvp : Dp}, DType::f32));
    *grad_layouts[i] = layout_of(grads.back());
  }
  g.D = Dp, g.Dv = Dvp;  // the scale stays the caller's
  const float* m = mask.defined() ? static_cast<const float*>(mask.data_ptr()) : nullptr;
  flash_backward_f32(g, c[0].data<float>(), c[1].data<float>(), c[2].data<float>(), c[3].data<float>(), c[4].data<float>(),
                     c[5].data<float>(), c[6].data<float>(), m, grads[0].data<float>(), grads[1].data<float>(), grads[2].data<float>());
  for (size_t i = 0; i < 3; ++i) cpu::copy(raw_slice(grads[i], 3, 0, out[i].size(3)), out[i]);
}

void flash_backward_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  SINTER_KERNEL_ENTRY();
  Geometry g = geometry(metas(in, 3), a, "sdpa_flash_backward");
  const DType ct = compute_dtype(in[0].dtype());
  Tensor mask = in.size() > 7 ? mask_view(in[7], ct, g) : Tensor();
  bool all_bf16 = true;
  for (size_t i : {0, 1, 2, 3, 5}) all_bf16 = all_bf16 && in[i].dtype() == DType::bf16;
  for (size_t i = 0; i < 3; ++i) all_bf16 = all_bf16 && out[i].dtype() == DType::bf16;
  if (all_bf16 && flash_amx_backward_takes(g)) {  // on the tile unit, every operand read where it lies
    RowLayout* const layouts[] = {&g.lq, &g.lk, &g.lv, &g.lo, nullptr, &g.ldo, nullptr};
    std::vector<Tensor> c;
    for (size_t i = 0; i < 7; ++i) c.push_back(layouts[i] ? rows_of(in[i], DType::bf16, *layouts[i]) : cpu::contiguous_as(in[i], DType::f32));
    out_rows(out[0], g.ldq), out_rows(out[1], g.ldk), out_rows(out[2], g.ldv);
    flash_backward_amx(g, c[0].data<bf16>(), c[1].data<bf16>(), c[2].data<bf16>(), c[3].data<bf16>(), c[4].data<float>(), c[5].data<bf16>(),
                       c[6].data<float>(), mask.defined() ? static_cast<const float*>(mask.data_ptr()) : nullptr, out[0].data<bf16>(),
                       out[1].data<bf16>(), out[2].data<bf16>());
    return;
  }
  if (ct == DType::f32 && (g.D % kNr != 0 || g.Dv % kNr != 0)) return flash_backward_padded(g, in, mask, out);
  with_compute_type(in[0].dtype(), [&]<class T>() {
    // q, k, v, o, dO where they lie; lse and dlse contiguous; the gradients' layouts as allocated.
    RowLayout* const layouts[] = {&g.lq, &g.lk, &g.lv, &g.lo, nullptr, &g.ldo, nullptr};
    std::vector<Tensor> c;
    for (size_t i = 0; i < 7; ++i) c.push_back(layouts[i] ? rows_of(in[i], ct, *layouts[i]) : cpu::contiguous_as(in[i], ct));
    RowLayout* const grad_layouts[] = {&g.ldq, &g.ldk, &g.ldv};
    std::vector<Tensor> grads;
    for (size_t i = 0; i < 3; ++i)
      grads.push_back(out_rows(out[i].dtype() == ct ? out[i] : Tensor::empty(out[i].shape(), ct), *grad_layouts[i]));
    const T* m = mask.defined() ? static_cast<const T*>(mask.data_ptr()) : nullptr;
    if constexpr (std::is_same_v<T, float>)
      flash_backward_f32(g, c[0].data<T>(), c[1].data<T>(), c[2].data<T>(), c[3].data<T>(), c[4].data<T>(), c[5].data<T>(),
                         c[6].data<T>(), m, grads[0].data<T>(), grads[1].data<T>(), grads[2].data<T>());
    else
      flash_backward<T>(g, c[0].data<T>(), c[1].data<T>(), c[2].data<T>(), c[3].data<T>(), c[4].data<T>(), c[5].data<T>(),
                        c[6].data<T>(), m, grads[0].data<T>(), grads[1].data<T>(), grads[2].data<T>());
    for (size_t i = 0; i < 3; ++i)
      if (out[i].dtype() != ct) cpu::copy(grads[i], out[i]);
  });
}

// What sdpa_choose adds for the CPU's flash choice: where the products run on the tile unit.
std::string cpu_flash_detail(std::span<const TensorMeta> in, const Attrs&) {
  const Shape &q = in[0].shape, &k = in[1].shape;
  const Geometry g{q[0], q[1], k[1], q[2], k[2], q[3], in[2].shape[3], 1.0, false};
  if (in[0].dtype != DType::bf16 || !flash_amx_backward_takes(g)) return "";
  return flash_amx_takes(g) ? "forward and backward on AMX tiles (without dropout)"
                            : "backward on AMX tiles (without dropout); the forward reads K and V in place";
}

}  // namespace

void register_attention_kernels() {
  add_kernel("sdpa", DeviceType::cpu, sdpa_kernel);
  add_kernel("sdpa_flash_backward", DeviceType::cpu, flash_backward_kernel);
  register_flash_fast_path(DeviceType::cpu, flash_fast_path);
  register_flash_detail(DeviceType::cpu, cpu_flash_detail);
}

}  // namespace sinter::detail

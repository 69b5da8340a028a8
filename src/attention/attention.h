#pragma once
// What every device's attention kernels share: a call's geometry (shapes, row layouts, causal and
// sliding-window key ranges, the mask's broadcast strides) and its dropout draws, so the flash
// kernels of any backend see the same call as the math reference (sdpa.cpp). Device-neutral: no
// kernel code here (the CPU's FlashAttention-2 kernels are in src/cpu/attention/).
// Dropout (attrs dropout_p, seed, counter) draws element (b, h, i, j) of the attention matrix as
// the dropout op draws element ((b Hq + h) Lq + i) Lkv + j: the math backend's mask, regenerated
// tile by tile in a flash backward.
#include <algorithm>
#include <cstdint>
#include <span>

#include "ops/scalar_fns.h"
#include "sinter/attention.h"
#include "sinter/op.h"
#include "sinter/random.h"

namespace sinter::detail {

// Throws a ShapeError naming `op` unless the mask shape broadcasts to `full` = (B, Hq, Lq, Lkv).
void check_attention_mask(const Shape& m, const Shape& full, const char* op);

// Element strides of the batch, head and row (position) dims of a (B, H, L, D) operand whose
// last dim is contiguous.
struct RowLayout {
  int64_t b = 0, h = 0, r = 0;
  template <class T> T* at(T* base, int64_t bi, int64_t hi, int64_t i) const { return base + bi * b + hi * h + i * r; }
};
inline RowLayout contiguous_rows(int64_t H, int64_t L, int64_t D) { return {H * L * D, L * D, D}; }
inline RowLayout layout_of(const Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

// An output a kernel writes in place (its layout to `l`): outputs are allocated by the op, with a
// contiguous last dim.
inline Tensor out_rows(const Tensor& t, RowLayout& l) {
  SINTER_CHECK(t.size(3) <= 1 || t.stride(3) == 1, "[sdpa] an output's last dim must be contiguous");
  l = layout_of(t);
  return t;
}

// The metadata of a kernel's first n inputs (the geometry and the choice read it).
inline std::vector<TensorMeta> metas(std::span<const Tensor> in, size_t n) {
  std::vector<TensorMeta> m;
  for (size_t i = 0; i < n; ++i) m.push_back({in[i].shape(), in[i].dtype(), in[i].device()});
  return m;
}

struct Geometry {
  int64_t B, Hq, Hkv, Lq, Lkv, D, Dv;
  double scale;
  bool causal;
  int64_t window = 0;  // sliding window (causal only): row i sees keys (i + offset - window, i + offset]
  // Where each (B, H, L, D) operand's rows lie (geometry() sets contiguous layouts): q, k, v, o
  // and, in the backward, dO, dQ, dK, dV. The kernels read and write any layout whose last dim is
  // contiguous: a transposed view of a (B, L, H, D) projection or the first Lkv positions of a KV
  // cache is used where it lies, not copied (lse and its gradient stay contiguous).
  RowLayout lq{}, lk{}, lv{}, lo{}, ldo{}, ldq{}, ldk{}, ldv{};
  bool has_mask = false;
  int64_t ms[4] = {0, 0, 0, 0};  // the mask's strides, broadcast to (B, Hq, Lq, Lkv)
  double dropout = 0;
  uint64_t seed = 0, counter = 0;
  int64_t offset() const { return Lkv - Lq; }  // bottom-right alignment: query i sees keys j <= i + offset
};

// The geometry of a call (q, k, v metadata; attrs scale, causal[, window][, dropout_p, seed, counter]).
Geometry geometry(std::span<const TensorMeta> in, const Attrs& a, const char* op);

// Row (b, h, i) of the mask, or null.
template <class T> SINTER_INLINE const T* mask_row(const Geometry& g, const T* mask, int64_t b, int64_t h, int64_t i) {
  return g.has_mask ? mask + b * g.ms[0] + h * g.ms[1] + i * g.ms[2] : nullptr;
}

// Dropout multipliers z[c] (0 or 1 / (1 - p)) for elements e0, e0 + 1, ... of the attention
// matrix: the same Philox draws, in the same order, as the dropout op on the materialised matrix.
template <class T> inline void dropout_multipliers(const Geometry& g, uint64_t e0, int64_t n, T* z) {
  const float fp = float(g.dropout);
  const T keep = T(1.0 / (1.0 - g.dropout));
  uint64_t e = e0;
  for (int64_t c = 0; c < n;) {
    uint32_t r[4];
    philox(g.seed, g.counter + e / 4, r);
    for (uint64_t k = e % 4; k < 4 && c < n; ++k, ++c, ++e)
      z[c] = float(r[k] >> 8) * (1.0f / 16777216.0f) >= fp ? keep : T(0);
  }
}
inline uint64_t element_index(const Geometry& g, int64_t b, int64_t h, int64_t i, int64_t j) {
  return uint64_t(((b * g.Hq + h) * g.Lq + i) * g.Lkv + j);
}

// Visible key range [key_first, key_limit) for query row i: causal and sliding window, or everything.
inline int64_t key_limit(const Geometry& g, int64_t i) {
  return g.causal ? std::clamp<int64_t>(i + g.offset() + 1, 0, g.Lkv) : g.Lkv;
}
inline int64_t key_first(const Geometry& g, int64_t i) {
  return g.window > 0 ? std::clamp<int64_t>(i + g.offset() + 1 - g.window, 0, g.Lkv) : 0;
}

// Whether a device's flash kernel runs a call of these dtype and head dims at its fast speed (else
// math is faster there): each backend registers its answer when it registers its kernels. A device
// whose flash kernels are the fast path alone (`fast_only`: CUDA's, no generic path as the CPU's)
// runs math for the rest even where flash is requested.
using FlashFastPath = bool (*)(DType dtype, int64_t D, int64_t Dv);
void register_flash_fast_path(DeviceType device, FlashFastPath fn, bool fast_only = false);
// Which kernel a device's flash choice runs and why (a backend with more than one registers it):
// sdpa_choose appends it to the reason it reports ("" where none is registered).
using FlashDetail = std::string (*)(std::span<const TensorMeta> in, const Attrs& a);
void register_flash_detail(DeviceType device, FlashDetail fn);
std::string flash_detail(std::span<const TensorMeta> in, const Attrs& a);

// The backend an sdpa call takes (the sdpa kernel and sdpa_choose both ask here), and the math
// reference in public ops (with `lse`, the rows' log-sum-exp too).
SDPAChoice choose_sdpa(std::span<const TensorMeta> in, const Attrs& a);
Tensor sdpa_math(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, int64_t kv_len, const Attrs& a,
                 Tensor* lse);
// The kernels' way to the math reference: registered by the op's definition (without grad
// recording), absent where the op table is (the runtime), where a call that needs it fails naming why.
using SDPAMathFn = Tensor (*)(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, int64_t kv_len,
                              const Attrs& a, Tensor* lse);
void register_sdpa_math(SDPAMathFn fn);
Tensor sdpa_math_reference(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, int64_t kv_len, const Attrs& a,
                           Tensor* lse);

}  // namespace sinter::detail

#pragma once
// FlashAttention-2 on the CPU: tiles of Q against tiles of K/V with an online softmax, fp32
// accumulation, fully masked tiles skipped; the forward saves only O and the row log-sum-exp, and
// the backward recomputes the scores tile by tile. Memory: O(tile^2) per thread, not O(L^2).
// mask: additive, broadcastable to (B, Hq, Lq, Lkv), read in the compute dtype (f32 for bf16 inputs).
// Dropout (attrs dropout_p, seed, counter) draws element (b, h, i, j) of the attention matrix as
// the dropout op draws element ((b Hq + h) Lq + i) Lkv + j: the math backend's mask, regenerated
// tile by tile in the backward. bf16 inputs compute in f32 (lse stays f32). A row that sees no
// key (or only -inf) gives 0 and lse = -inf, as PyTorch's safe softmax.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>

#include "cpu/simd/lanes.h"
#include "ops/scalar_fns.h"
#include "sinter/op.h"
#include "sinter/random.h"

namespace sinter::detail {

// Throws a ShapeError naming `op` unless the mask shape broadcasts to `full` = (B, Hq, Lq, Lkv).
void check_attention_mask(const Shape& m, const Shape& full, const char* op);

constexpr int64_t kBr = 32, kBc = 64;  // query rows x key columns per tile (generic kernels)

// Element strides of the batch, head and row (position) dims of a (B, H, L, D) operand whose
// last dim is contiguous.
struct RowLayout {
  int64_t b = 0, h = 0, r = 0;
  template <class T> T* at(T* base, int64_t bi, int64_t hi, int64_t i) const { return base + bi * b + hi * h + i * r; }
};
inline RowLayout contiguous_rows(int64_t H, int64_t L, int64_t D) { return {H * L * D, L * D, D}; }

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


// The f32 kernels' register blocking: floats per register, per block row.
constexpr int64_t kV = cpu::simd::kVectorBytes / 4, kNr = 2 * kV;

template <class T>
void flash_forward(const Geometry& g, const T* q, const T* k, const T* v, const T* mask, T* o, T* lse);
void flash_forward_f32(const Geometry& g, const float* q, const float* k, const float* v, const float* mask, float* o,
                       float* lse);
template <class T>
void flash_backward(const Geometry& g, const T* q, const T* k, const T* v, const T* o, const T* lse, const T* dout,
                    const T* dlse, const T* mask, T* dq, T* dk, T* dv);
void flash_backward_f32(const Geometry& g, const float* q, const float* k, const float* v, const float* o, const float* lse,
                        const float* dout, const float* dlse, const float* mask, float* dq, float* dk, float* dv);

}  // namespace sinter::detail

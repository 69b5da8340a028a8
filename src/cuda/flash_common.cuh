#pragma once
// What the CUDA flash kernels (flash.cu, flash_decode.cu, flash_tc.cu, flash_tc_backward.cu) share:
// the call as a kernel sees it, the visible key range of a query row, the dropout multiplier and
// mask value of an element, row addressing (each as attention/attention.h defines it for every
// backend), and the bf16 tile loads of the tensor-core kernels.
#define SINTER_HD __host__ __device__
#include "core/philox.h"
#include "cuda/flash.h"
#include "cuda/launch.cuh"
#include "ops/scalar_fns.h"

namespace sinter::cuda::flash {

using detail::Geometry;
using detail::RowLayout;

constexpr float kLog2e = 1.44269504088896341f, kLn2 = 0.693147180559945309f;

__device__ __forceinline__ int64_t clamp64(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : x > hi ? hi : x; }

// The call as the kernels see it: the geometry with the cache's length applied.
struct Call {
  Geometry g;
  FlashExtras x;
  __device__ int64_t kv_len() const { return x.kv_len ? clamp64(*x.kv_len, 0, g.Lkv) : g.Lkv; }
};

// Visible keys [first, limit) of query row i when `n` keys exist (attention.h's rule, bottom-right aligned).
__device__ __forceinline__ int64_t key_limit(const Geometry& g, int64_t n, int64_t i) {
  return g.causal ? clamp64(i + n - g.Lq + 1, 0, n) : n;
}
__device__ __forceinline__ int64_t key_first(const Geometry& g, int64_t n, int64_t i) {
  return g.window > 0 ? clamp64(i + n - g.Lq + 1 - g.window, 0, n) : 0;
}

// The dropout multiplier of element (b, h, i, j) of the attention matrix (attention.h: dropout_multipliers).
__device__ __forceinline__ float dropout_keep(const Geometry& g, int64_t b, int64_t h, int64_t i, int64_t j) {
  if (g.dropout <= 0) return 1.0f;
  const uint64_t e = uint64_t(((b * g.Hq + h) * g.Lq + i) * g.Lkv + j);
  uint32_t r[4];
  detail::philox_block(g.seed, g.counter + e / 4, r);
  return float(r[e % 4] >> 8) * (1.0f / 16777216.0f) >= float(g.dropout) ? float(1.0 / (1.0 - g.dropout)) : 0.0f;
}

__device__ __forceinline__ float mask_at(const Call& c, int64_t b, int64_t h, int64_t i, int64_t j) {
  const Geometry& g = c.g;
  return c.x.mask ? c.x.mask[b * g.ms[0] + h * g.ms[1] + i * g.ms[2] + j * g.ms[3]] : 0.0f;
}

// Opts a kernel into more than 48 KiB of dynamic shared memory (a host call before each launch that
// needs it: head dims past about 64).
template <class K> void allow_smem(K kernel, size_t bytes) {
  if (bytes > 48 * 1024) SINTER_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

// Row (b, h, i) of an operand laid out by l.
template <class S> __device__ __forceinline__ S* row(const RowLayout& l, S* base, int64_t b, int64_t h, int64_t i) {
  return base + b * l.b + h * l.h + i * l.r;
}

// Rows [r0, r0 + n) of one (b, h) matrix laid out by l, as bf16 bits in dst[n][Ld] by `Threads`
// threads (the tensor-core kernels' tiles; dst 16-byte aligned): 16 bytes a load where the row's
// address allows, else element by element; rows at or past `valid` are zeros.
template <int D, int Ld, int Threads>
__device__ void load_bf16_rows(uint16_t* dst, const BF16* base, const RowLayout& l, int64_t b, int64_t h, int64_t r0, int64_t valid,
                               int n) {
  static_assert(D % 8 == 0 && Ld % 8 == 0, "tile rows of whole 16-byte chunks");
  for (int e = int(threadIdx.x); e < n * (D / 8); e += Threads) {
    const int r = e / (D / 8), c = e % (D / 8);
    Pack<BF16> chunk{};
    if (r0 + r < valid) {
      const BF16* from = row(l, base, b, h, r0 + r) + c * 8;
      if (reinterpret_cast<uintptr_t>(from) % 16 == 0) chunk = load_pack(from);
      else
        for (int d = 0; d < 8; ++d) chunk.v[d] = from[d];
    }
    store_pack(reinterpret_cast<BF16*>(dst + r * Ld + c * 8), chunk);
  }
}

}  // namespace sinter::cuda::flash

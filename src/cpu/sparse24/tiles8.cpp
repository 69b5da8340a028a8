// 2:4 tile kernels over 8 weight rows on AVX2: x in tiles of 8 rows, each kept value's column
// picked per lane by an in-lane permute indexed by the meta nibbles; the weights packed per call
// (or read prepacked, tiles8_layout.cpp) and reused for every tile of x.
#include "cpu/sparse24/kernel_common.h"

namespace sinter::sparse {

#if defined(__AVX2__)
namespace {

// Zen 3, 2 threads, 4096 x 4096 and 4096 x 11008, f32 values: the 8-row tiles against the
// K-major kernel 1.11-1.45x at M = 9-18, even at 22, 0.91-0.93x at 24 (where K-major's 24-row
// panel has no padding). So they serve kSmallM < M < kKMajorM, K-major from there.
constexpr int64_t kKMajorM = 23;

constexpr int kTileRows = 8;                 // rows of x per register tile
constexpr int64_t kTileQFloats = 8 * kTileRows * 4;  // 8 groups of a tile of x

// 8 weight rows [n0, n0 + 8), column blocks of 32 [32 q0, 32 (q0 + nq)) -> out; rows past N and
// columns past K are zero.
template <class V>
void pack_rows8(const V* values, const uint8_t* meta, int64_t K, int64_t n0, int64_t N, int64_t q0, int64_t nq, uint8_t* out_bytes) {
  float* out = reinterpret_cast<float*>(out_bytes);
  const int64_t K2 = K / 2, K8 = K / 8;
  for (int64_t q = 0; q < nq; ++q) {
    float* o = out + q * (kBlockBytes<float> / 4);
    const int64_t c0 = (q0 + q) * 32;
    uint32_t* W = reinterpret_cast<uint32_t*>(o);
    __m256 rows[8][2];
    for (int r = 0; r < 8; ++r) {
      const int64_t n = n0 + r;
      const V* vr = values + n * K2 + c0 / 2;
      if (n < N && c0 + 32 <= K) {
        std::memcpy(&W[r], meta + n * K8 + c0 / 8, 4);
        rows[r][0] = (__m256)load_values(vr), rows[r][1] = (__m256)load_values(vr + 8);
        continue;
      }
      alignas(32) float t[16] = {};
      W[r] = 0;
      if (n < N && c0 < K) {
        const int64_t bytes = K8 - c0 / 8;  // 1..3 meta bytes left
        std::memcpy(&W[r], meta + n * K8 + c0 / 8, size_t(bytes));
        for (int64_t i = 0; i < 4 * bytes; ++i) t[i] = float(vr[i]);
      }
      rows[r][0] = _mm256_load_ps(t), rows[r][1] = _mm256_load_ps(t + 8);
    }
    // 8 x 16 transpose: kept value j of row r -> o[8 + 8 j + r] (group j / 2: V0 for even j, V1 for odd)
    for (int h = 0; h < 2; ++h) {
      const __m256 t0 = _mm256_unpacklo_ps(rows[0][h], rows[1][h]), t1 = _mm256_unpackhi_ps(rows[0][h], rows[1][h]);
      const __m256 t2 = _mm256_unpacklo_ps(rows[2][h], rows[3][h]), t3 = _mm256_unpackhi_ps(rows[2][h], rows[3][h]);
      const __m256 t4 = _mm256_unpacklo_ps(rows[4][h], rows[5][h]), t5 = _mm256_unpackhi_ps(rows[4][h], rows[5][h]);
      const __m256 t6 = _mm256_unpacklo_ps(rows[6][h], rows[7][h]), t7 = _mm256_unpackhi_ps(rows[6][h], rows[7][h]);
      const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
      const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
      const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
      const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
      float* d = o + 8 + 64 * h;
      _mm256_store_ps(d + 0, _mm256_permute2f128_ps(s0, s4, 0x20));
      _mm256_store_ps(d + 8, _mm256_permute2f128_ps(s1, s5, 0x20));
      _mm256_store_ps(d + 16, _mm256_permute2f128_ps(s2, s6, 0x20));
      _mm256_store_ps(d + 24, _mm256_permute2f128_ps(s3, s7, 0x20));
      _mm256_store_ps(d + 32, _mm256_permute2f128_ps(s0, s4, 0x31));
      _mm256_store_ps(d + 40, _mm256_permute2f128_ps(s1, s5, 0x31));
      _mm256_store_ps(d + 48, _mm256_permute2f128_ps(s2, s6, 0x31));
      _mm256_store_ps(d + 56, _mm256_permute2f128_ps(s3, s7, 0x31));
    }
  }
}

// Packing reads 8 x row_groups weight rows side by side, more streams than the hardware
// prefetcher follows, in bursts between tiles; so the next block's lines are requested while
// the first tile of this block computes (measured: the packing's loads had stalled on memory).
template <class V>
void prefetch_block(const V* values, const uint8_t* meta, int64_t K, int64_t n0, int64_t rows, int64_t c0, int64_t cols) {
  cols = std::min(cols, K - c0);
  for (int64_t r = 0; r < rows; ++r) {
    const char* v = reinterpret_cast<const char*>(values + (n0 + r) * (K / 2) + c0 / 2);
    for (int64_t off = 0; off < cols / 2 * int64_t(sizeof(V)); off += 64) _mm_prefetch(v + off, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(meta + (n0 + r) * (K / 8) + c0 / 8), _MM_HINT_T0);
  }
}

// Reading a prepacked weight, a tile requests the blocks kPrefetchBytes ahead: the weight is one
// stream per thread, which the hardware prefetcher alone left stalling on memory (Zen 3, 2 threads,
// 4096 x 11008, caches flushed, with and without alternated: int8 M = 1 1.19 / 1.00 ms with them
// against 1.34 / 1.20 without, f32 M = 4 3.09 / 3.84 against 3.55 / 4.19; compute-bound sizes
// even). Blocks packed per call are in cache already: there the requests cost 0-4%, so none.
constexpr int64_t kPrefetchBytes = 2048;
template <class W> SINTER_INLINE void prefetch_ahead(const uint8_t* block) {
  for (int64_t l = 0; l < kBlockBytes<W>; l += 64) _mm_prefetch(reinterpret_cast<const char*>(block) + kPrefetchBytes + l, _MM_HINT_T0);
}

// c (R rows x 8 weight rows, row stride ldc) (+)= the tile of x (R of its 8 rows) times 8 packed
// weight rows over nq blocks of 32 columns, each block 8 meta words then 16 x 8 kept values of
// type W (f32 when packed per call, the values' own dtype when prepacked: widened here, once per
// 8 values for the R rows of the tile).
template <int R, class W, bool Stream>
__attribute__((noinline)) void interleaved_tile(const uint8_t* wp, int64_t nq, const float* xt, float* c, int64_t ldc, bool first) {
  if constexpr (R == 1) {  // one row of x: four accumulator chains, or the FMA latency is the bound
    __m256 a[4] = {first ? _mm256_setzero_ps() : _mm256_loadu_ps(c), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t q = 0; q < nq; ++q, wp += kBlockBytes<W>, xt += kTileQFloats) {
      if constexpr (Stream) prefetch_ahead<W>(wp);
      const __m256i W8 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp));
      const W* vals = reinterpret_cast<const W*>(wp + 32);
#pragma GCC unroll 8
      for (int g = 0; g < 8; ++g) {
        const __m256i i0 = _mm256_srli_epi32(W8, 4 * g), i1 = _mm256_srli_epi32(W8, 4 * g + 2);
        const __m256 xb = _mm256_broadcast_ps(reinterpret_cast<const __m128*>(xt + g * kTileRows * 4));
        a[2 * (g & 1)] = _mm256_fmadd_ps((__m256)load_values(vals + 16 * g), _mm256_permutevar_ps(xb, i0), a[2 * (g & 1)]);
        a[2 * (g & 1) + 1] = _mm256_fmadd_ps((__m256)load_values(vals + 16 * g + 8), _mm256_permutevar_ps(xb, i1), a[2 * (g & 1) + 1]);
      }
    }
    _mm256_storeu_ps(c, _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3])));
    return;
  }
  __m256 acc[R];
  for (int m = 0; m < R; ++m) acc[m] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(c + m * ldc);
  for (int64_t q = 0; q < nq; ++q, wp += kBlockBytes<W>, xt += kTileQFloats) {
    if constexpr (Stream) prefetch_ahead<W>(wp);
    const __m256i W8 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp));
    const W* vals = reinterpret_cast<const W*>(wp + 32);
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
      const __m256i i0 = _mm256_srli_epi32(W8, 4 * g), i1 = _mm256_srli_epi32(W8, 4 * g + 2);  // vpermilps reads bits 0-1
      const __m256 v0 = (__m256)load_values(vals + 16 * g), v1 = (__m256)load_values(vals + 16 * g + 8);
#pragma GCC unroll 8
      for (int m = 0; m < R; ++m) {
        const __m256 xb = _mm256_broadcast_ps(reinterpret_cast<const __m128*>(xt + (g * kTileRows + m) * 4));
        acc[m] = _mm256_fmadd_ps(v0, _mm256_permutevar_ps(xb, i0), acc[m]);
        acc[m] = _mm256_fmadd_ps(v1, _mm256_permutevar_ps(xb, i1), acc[m]);
      }
    }
  }
  for (int m = 0; m < R; ++m) _mm256_storeu_ps(c + m * ldc, acc[m]);
}

template <class W, bool Stream>
void tile_rows(int r, const uint8_t* wp, int64_t nq, const float* xt, float* c, int64_t ldc, bool first) {
  with_1_to_8(r, [&](auto R) { interleaved_tile<R, W, Stream>(wp, nq, xt, c, ldc, first); });
}

// c (rows x cols of a group of 8 weight rows, cols <= 8) (+)= one tile over nq blocks; a partial
// group goes through a scratch tile. Stream: the blocks are a prepacked weight's (above).
template <class W, bool Stream>
void group_tile(int rows, int64_t cols, const uint8_t* wb, int64_t nq, const float* xt, float* c, int64_t ldc, bool first) {
  if (cols == 8) return tile_rows<W, Stream>(rows, wb, nq, xt, c, ldc, first);  // straight into y, accumulated across column blocks
  alignas(32) float tmp[kTileRows * 8] = {};
  for (int m = 0; m < rows; ++m)
    for (int64_t l = 0; l < cols && !first; ++l) tmp[m * 8 + l] = c[m * ldc + l];
  tile_rows<W, Stream>(rows, wb, nq, xt, tmp, 8, first);
  for (int m = 0; m < rows; ++m)
    for (int64_t l = 0; l < cols; ++l) c[m * ldc + l] = tmp[m * 8 + l];
}

// y = act(scale * (x W^T) + b) in 8-row tiles of x against groups of 8 weight rows. Weights come
// prepacked (the values' dtype, widened in the tile) or are packed per call here, as f32.
template <class V>
void interleaved(const float* x, int64_t M, int64_t K, const V* values, const uint8_t* meta, const uint8_t* prepacked,
                 const float* scales, const float* bias, Act act, float* y, int64_t N) {
  // Blocks (measured, `sinter bench sparse`): 256 columns x 8 row-groups of weights (17 KiB packed).
  constexpr int64_t qb = kTilesQb, row_groups = kTilesRowGroups;
  const int64_t tiles = (M + kTileRows - 1) / kTileRows, Q = (K + 31) / 32, G = K / 4;
  // x tile t, column block q: column-block major, so all tiles of one block are contiguous.
  auto x_at = [&](int64_t t, int64_t q) {
    const int64_t kb = q / qb, nq = std::min(qb, Q - kb * qb);
    return (kb * qb * tiles + t * nq + q % qb) * kTileQFloats;
  };
  Tensor xt_buf = Tensor::empty({tiles * Q * kTileQFloats}, DType::f32);  // caching allocator: 64-byte aligned
  float* xt = xt_buf.data<float>();
  parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t g = 0; g < Q * 8; ++g) {
        float* d = xt + x_at(t, g / 8) + (g % 8) * kTileRows * 4;
        for (int64_t m = 0; m < kTileRows; ++m) {
          const int64_t row = t * kTileRows + m;
          if (row < M && g < G) std::memcpy(d + 4 * m, x + row * K + 4 * g, 16);
          else std::memset(d + 4 * m, 0, 16);
        }
      }
  });
  const int64_t chunk = 8 * row_groups, chunks = (N + chunk - 1) / chunk, kblocks = (Q + qb - 1) / qb;
  auto epilogue = [&](int64_t n0) {
    const int64_t n1 = std::min(N, n0 + chunk);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = n0; n < n1; ++n) y[m * N + n] = activate(y[m * N + n] * scales[n] + (bias ? bias[n] : 0.0f), act);
  };
  if (prepacked) {
    // Column block kb of chunk ch, every tile of x against every group of its rows.
    auto block = [&](int64_t ch, int64_t kb) {
      const int64_t n0 = ch * chunk, groups = std::min(row_groups, (N - n0 + 7) / 8), q0 = kb * qb, nq = std::min(qb, Q - q0);
      for (int64_t t = 0; t < tiles; ++t)
        for (int64_t b = 0; b < groups; ++b) {
          const int rows = int(std::min<int64_t>(kTileRows, M - t * kTileRows));
          group_tile<V, true>(rows, std::min<int64_t>(8, N - n0 - 8 * b), prepacked + prepacked_at<V>(N, K, ch, b, q0), nq,
                        xt + x_at(t, q0), y + t * kTileRows * N + n0 + 8 * b, N, kb == 0);
        }
    };
    // Packing and computing do not overlap (nothing tried made them), so a prepacked
    // weight, read once in order, saves the whole packing pass. One stream per thread: two or four
    // chunks read side by side measured no faster at M = 1.
    parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t ch = c0; ch < c1; ++ch) {
        for (int64_t kb = 0; kb < kblocks; ++kb) block(ch, kb);
        epilogue(ch * chunk);
      }
    });
    return;
  }
  // Otherwise each group of 8 weight rows is packed over all of K up front, in long runs per row
  // that the hardware prefetcher follows (the chunk's packed rows then stay in L2/L3); measured
  // 25-45% faster at M = 16 than packing a column block of all 64 rows at a time, whose short
  // runs in 64 rows stalled on memory. Past 8 MiB per thread (K beyond ~60,000): one column block
  // at a time, the next block's lines requested while the first tile computes.
  const bool whole_k = row_groups * Q * kBlockBytes<float> <= (int64_t(8) << 20);  // <= 8 MiB per thread
  const int64_t wq = whole_k ? Q : qb;  // packed blocks of 32 columns per group of rows
  parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    Tensor wbuf = Tensor::empty({row_groups * wq * kBlockBytes<float>}, DType::u8);
    uint8_t* wp = wbuf.data<uint8_t>();
    for (int64_t ch = c0; ch < c1; ++ch) {
      const int64_t n0 = ch * chunk, groups = std::min(row_groups, (N - n0 + 7) / 8);
      if (whole_k)
        for (int64_t b = 0; b < groups; ++b) pack_rows8(values, meta, K, n0 + 8 * b, N, 0, Q, wp + b * Q * kBlockBytes<float>);
      for (int64_t kb = 0; kb < kblocks; ++kb) {
        const int64_t q0 = kb * qb, nq = std::min(qb, Q - q0);
        if (!whole_k)
          for (int64_t b = 0; b < groups; ++b) pack_rows8(values, meta, K, n0 + 8 * b, N, q0, nq, wp + b * qb * kBlockBytes<float>);
        const int64_t wo = whole_k ? q0 : 0;  // this block's offset within a group's packed rows
        for (int64_t t = 0; t < tiles; ++t) {
          const int64_t m0 = t * kTileRows;
          const int rows = int(std::min<int64_t>(kTileRows, M - m0));
          for (int64_t b = 0; b < groups; ++b) {
            const int64_t nb = n0 + 8 * b, cols = std::min<int64_t>(8, N - nb);
            if (!whole_k && t == 0 && kb + 1 < kblocks) prefetch_block(values, meta, K, nb, cols, (q0 + qb) * 32, qb * 32);
            group_tile<float, false>(rows, cols, wp + (b * wq + wo) * kBlockBytes<float>, nq, xt + x_at(t, q0), y + m0 * N + nb, N, kb == 0);
          }
        }
      }
      epilogue(n0);
    }
  });
}


void run_tiles(const Args& a) {
  if (a.M == 0 || a.N == 0) return;
  with_value_type(a.vt, "sparse24_linear", [&](auto v) {
    using V = decltype(v);
    interleaved<V>(a.x, a.M, a.K, static_cast<const V*>(a.values), a.meta, a.packed, a.scales, a.bias, a.act, a.y, a.N);
  });
}

// The 8-row tiles serve the builds whose layout is theirs (no 16-row tiles).
bool own_layout() { return pack_format().id == kPack8Rows; }

const KernelDef kTiles8[] = {
    {Kernel::prepacked8, kOrderPrepacked + 1,
     [](const Call& c) { return own_layout() && (c.packed_only || (c.prepacked && prepacked_serves(c.values, c.M))); }, run_tiles,
     false, true},
    {Kernel::tiles8, kOrderTiles, [](const Call& c) { return own_layout() && c.has_values() && c.M > kSmallM && c.M < kKMajorM; },
     run_tiles},
};

}  // namespace

std::span<const KernelDef> tiles8_kernels() { return kTiles8; }

#else
std::span<const KernelDef> tiles8_kernels() { return {}; }
#endif

}  // namespace sinter::sparse

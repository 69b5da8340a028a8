#pragma once
// What the 16-row tile kernels for AVX-512 share (tiles16.cpp: f32 x and the layout;
// tiles16_bf16.cpp: bf16 x with bf16 values on vdpbf16ps): the block layout, packing a group of
// 16 weight rows, the register tiles and the loop over tiles of x. Included only where
// SINTER_TILES16 is built.
#include "cpu/sparse24/kernels.h"
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/parallel.h"
#include "ops/scalar_fns.h"
#include "sinter/error.h"
#include "sinter/tensor.h"
#include "cpu/sparse24/kernel_common.h"  // with_value_type

// GCC 12's AVX-512 headers start some intrinsics (widenings, permutes) from an undefined vector
// and then warn that it may be used uninitialized; the instructions read no such input.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace sinter::sparse {

namespace {

// A block: 16 weight rows x 16 columns. First 16 u32 index words, row r's word holding the block
// column (0..15) of its kept value j in bits 4j..4j+3 (vpermps reads bits 0-3 of each lane, so a
// shift by 4j makes the word value j's index); then the 8 kept values of each row, of type W:
// value j of row r at 16 j + r (f32, i8), or for bf16 as the pairs vdpbf16ps takes, the two
// values of group j / 2 side by side in lane r (at 32 (j / 2) + 2 r + j % 2). A prepacked weight
// holds ceil(K / 16) blocks for each group of 16 rows, in the order the tiles read them
// (prepacked_at).
template <class W> constexpr int64_t kBytes = 64 + 128 * int64_t(sizeof(W));
template <class W> constexpr int64_t slot(int j, int r) { return std::is_same_v<W, bf16> ? 32 * (j / 2) + 2 * r + j % 2 : 16 * j + r; }

int64_t blocks_of(int64_t K) { return (K + 15) / 16; }

// The index word of a row's block from its two meta bytes (each 2-bit offset j moved to bits
// 4j..4j+1, the group's first column 4 (j / 2) above it).
SINTER_INLINE uint32_t index_word(uint32_t meta16) { return _pdep_u32(meta16, 0x33333333u) | 0xCC884400u; }

template <class V> SINTER_INLINE __m256 widen8(const V* p) {
  if constexpr (std::is_same_v<V, float>) return _mm256_loadu_ps(p);
  else if constexpr (std::is_same_v<V, bf16>)
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
  else return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
// The 8 value vectors of a block (lane r: row r's kept value j).
template <class W> SINTER_INLINE void block_values(const W* p, __m512 v[8]) {
  for (int j = 0; j < 8; j += 2) {
    if constexpr (std::is_same_v<W, float>) v[j] = _mm512_load_ps(p + 16 * j), v[j + 1] = _mm512_load_ps(p + 16 * j + 16);
    else if constexpr (std::is_same_v<W, bf16>) {  // a pair's first value is the low half: shifted up, it is the f32 of its bits
      const __m512i pairs = _mm512_load_si512(p + 16 * j);
      v[j] = _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16));
      v[j + 1] = _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32(int(0xffff0000u))));
    } else {
      v[j] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(p + 16 * j))));
      v[j + 1] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(p + 16 * j + 16))));
    }
  }
}

// 8 x 8 transpose: element j of rows[r] to out[j][r].
SINTER_INLINE void transpose8(const __m256 rows[8], float* const out[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(rows[0], rows[1]), t1 = _mm256_unpackhi_ps(rows[0], rows[1]);
  const __m256 t2 = _mm256_unpacklo_ps(rows[2], rows[3]), t3 = _mm256_unpackhi_ps(rows[2], rows[3]);
  const __m256 t4 = _mm256_unpacklo_ps(rows[4], rows[5]), t5 = _mm256_unpackhi_ps(rows[4], rows[5]);
  const __m256 t6 = _mm256_unpacklo_ps(rows[6], rows[7]), t7 = _mm256_unpackhi_ps(rows[6], rows[7]);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  _mm256_storeu_ps(out[0], _mm256_permute2f128_ps(s0, s4, 0x20));
  _mm256_storeu_ps(out[1], _mm256_permute2f128_ps(s1, s5, 0x20));
  _mm256_storeu_ps(out[2], _mm256_permute2f128_ps(s2, s6, 0x20));
  _mm256_storeu_ps(out[3], _mm256_permute2f128_ps(s3, s7, 0x20));
  _mm256_storeu_ps(out[4], _mm256_permute2f128_ps(s0, s4, 0x31));
  _mm256_storeu_ps(out[5], _mm256_permute2f128_ps(s1, s5, 0x31));
  _mm256_storeu_ps(out[6], _mm256_permute2f128_ps(s2, s6, 0x31));
  _mm256_storeu_ps(out[7], _mm256_permute2f128_ps(s3, s7, 0x31));
}

// Rows [n0, n0 + 16) of the weight as blocks [b0, b1) of type W (W = V: prepack; W = float: the
// per-call packing, values widened). Rows past N and columns past K are zero values.
template <class V, class W>
void pack_group(const V* values, const uint8_t* meta, int64_t N, int64_t K, int64_t n0, int64_t b0, int64_t b1, uint8_t* out) {
  const int64_t K2 = K / 2, K8 = K / 8;
  for (int64_t b = b0; b < b1; ++b, out += kBytes<W>) {
    uint32_t* words = reinterpret_cast<uint32_t*>(out);
    W* vals = reinterpret_cast<W*>(out + 64);
    const bool whole = 2 * b + 2 <= K8;  // both meta bytes (all 16 columns) inside K
    for (int r = 0; r < 16; ++r) {
      const int64_t n = n0 + r;
      uint32_t m16 = 0;
      if (n < N) m16 = whole ? uint32_t(meta[n * K8 + 2 * b]) | uint32_t(meta[n * K8 + 2 * b + 1]) << 8 : meta[n * K8 + 2 * b];
      words[r] = index_word(m16);
    }
    if constexpr (std::is_same_v<V, bf16> && std::is_same_v<W, bf16>) {
      // A group's two values are one u32 (a pair): two blocks at a time, each row's 8 pairs are
      // 8 u32, and two 8 x 8 transposes put pair j of row r in lane r of block b + j / 4.
      if (b + 1 < b1 && 2 * b + 4 <= K8 && n0 + 16 <= N) {
        for (int r = 0; r < 16; ++r) {  // the second block's index words
          const int64_t n = n0 + r;
          reinterpret_cast<uint32_t*>(out + kBytes<W>)[r] = index_word(uint32_t(meta[n * K8 + 2 * b + 2]) | uint32_t(meta[n * K8 + 2 * b + 3]) << 8);
        }
        for (int h = 0; h < 2; ++h) {
          __m256 rows[8];
          for (int r = 0; r < 8; ++r) rows[r] = _mm256_loadu_ps(reinterpret_cast<const float*>(values + (n0 + 8 * h + r) * K2 + 8 * b));
          float* v0 = reinterpret_cast<float*>(out + 64) + 8 * h;
          float* v1 = reinterpret_cast<float*>(out + kBytes<W> + 64) + 8 * h;
          float* const out8[8] = {v0, v0 + 16, v0 + 32, v0 + 48, v1, v1 + 16, v1 + 32, v1 + 48};
          transpose8(rows, out8);
        }
        ++b, out += kBytes<W>;
        continue;
      }
    }
    if constexpr (std::is_same_v<W, float>) {
      if (whole && n0 + 16 <= N) {  // two 8 x 8 transposes
        for (int h = 0; h < 2; ++h) {
          __m256 rows[8];
          for (int r = 0; r < 8; ++r) rows[r] = widen8(values + (n0 + 8 * h + r) * K2 + 8 * b);
          float* const out8[8] = {vals + 8 * h, vals + 8 * h + 16, vals + 8 * h + 32, vals + 8 * h + 48,
                                  vals + 8 * h + 64, vals + 8 * h + 80, vals + 8 * h + 96, vals + 8 * h + 112};
          transpose8(rows, out8);
        }
        continue;
      }
    }
    for (int j = 0; j < 8; ++j)
      for (int r = 0; r < 16; ++r) {
        const int64_t n = n0 + r, i = 8 * b + j;
        vals[slot<W>(j, r)] = n < N && i < K2 ? W(values[n * K2 + i]) : W(0.0f);
      }
  }
}
template <class V, class W>
void pack_group_as(const void* values, const uint8_t* meta, int64_t N, int64_t K, int64_t n0, int64_t b0, int64_t b1, uint8_t* out) {
  pack_group<V, W>(static_cast<const V*>(values), meta, N, K, n0, b0, b1, out);
}

constexpr int kPairTileRows = 16;   // rows of x per tile of the pairs kernel
// Chunks of kChunkGroups groups of 16 weight rows pass over spans of kSpanBlocks blocks of 16
// columns (a tile's span of x: 32 KiB of f32, in L1; a chunk's span of f32 weights: 288 KiB, in
// L2). Measured (Zen 5, prepacked, the three shapes, alternating): spans of 64 x 8
// groups, 128 x 4 and whole rows x 1 group within the spread of each other for f32 at M = 16 and
// 128; bf16 x at M = 128 13.7-14.3 ms against 15.2 for whole rows.
constexpr int64_t kSpanBlocks = 64, kChunkGroups = 8;

// Blocks [b0, b0 + kSpanBlocks) of group g in a prepacked weight: stored in the order the tiles
// read them (chunk, span, group, block), so the requests kAhead bytes ahead fetch what comes next.
template <class W> int64_t prepacked_at(int64_t G, int64_t NB, int64_t g, int64_t b0) {
  const int64_t ch = g / kChunkGroups, groups = std::min(kChunkGroups, G - ch * kChunkGroups), nb = std::min(kSpanBlocks, NB - b0);
  return (ch * kChunkGroups * NB + b0 * groups + (g - ch * kChunkGroups) * nb) * kBytes<W>;
}
constexpr int64_t kAhead = 8192;    // bytes a prepacked weight is requested ahead

// f(std::integral_constant<int, r>) for r in 1..16: a row count as a template argument.
template <class F> SINTER_INLINE void with_rows(int r, const F& f) {
  switch (r) {
#define SINTER_ROWS_CASE(n) \
  case n: return f(std::integral_constant<int, n>{});
    SINTER_ROWS_CASE(1) SINTER_ROWS_CASE(2) SINTER_ROWS_CASE(3) SINTER_ROWS_CASE(4) SINTER_ROWS_CASE(5) SINTER_ROWS_CASE(6)
    SINTER_ROWS_CASE(7) SINTER_ROWS_CASE(8) SINTER_ROWS_CASE(9) SINTER_ROWS_CASE(10) SINTER_ROWS_CASE(11) SINTER_ROWS_CASE(12)
    SINTER_ROWS_CASE(13) SINTER_ROWS_CASE(14) SINTER_ROWS_CASE(15)
#undef SINTER_ROWS_CASE
    default: return f(std::integral_constant<int, 16>{});
  }
}

// A tile's sums: R rows, A chains each, started from c (or zero) and stored back to c, its first
// `cols` columns (mask mk).
template <int R, int A> SINTER_INLINE void start_sums(__m512 (&acc)[R][A], const float* c, int64_t ldc, __mmask16 mk, bool first) {
  for (int m = 0; m < R; ++m) {
    acc[m][0] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mk, c + m * ldc);
    for (int a = 1; a < A; ++a) acc[m][a] = _mm512_setzero_ps();
  }
}
template <int R, int A> SINTER_INLINE void store_sums(const __m512 (&acc)[R][A], float* c, int64_t ldc, __mmask16 mk) {
  for (int m = 0; m < R; ++m) {
    __m512 s = acc[m][0];
    for (int a = 1; a < A; ++a) s = _mm512_add_ps(s, acc[m][a]);
    _mm512_mask_storeu_ps(c + m * ldc, mk, s);
  }
}

// Rows of x per tile: 16 where the values can be read by the FMAs from memory (f32: 16 sums and
// 8 index registers), 8 where they are widened into registers first (8 sums, 8 index and 8 value
// registers); bf16 x (the pairs tile): 16 sums, 4 index and 4 pair registers.
template <class W> constexpr int kTileRowsOf = std::is_same_v<W, float> ? 16 : 8;

// c (R rows, row stride ldc, `cols` <= 16 valid columns) = (first ? 0 : c) + a tile of x (R of
// its TR rows, xt: block-major, TR x 16 floats a block) times one group's nb blocks.
template <int R, class W, bool Stream>
__attribute__((noinline)) void tile(const uint8_t* wp, int64_t nb, const float* xt, float* c, int64_t ldc, int cols, bool first) {
  constexpr int TR = kTileRowsOf<W>;
  constexpr int A = R <= 2 ? 2 : 1;  // sums per row: one or two rows alone would wait on the FMA latency
  const __mmask16 mk = __mmask16((1u << cols) - 1);
  __m512 acc[R][A];
  start_sums(acc, c, ldc, mk, first);
  for (int64_t b = 0; b < nb; ++b, wp += kBytes<W>, xt += TR * 16) {
    if constexpr (Stream)
      for (int64_t l = 0; l < kBytes<W>; l += 64) _mm_prefetch(reinterpret_cast<const char*>(wp) + kAhead + l, _MM_HINT_T0);
    const __m512i words = _mm512_load_si512(wp);
    const W* vals = reinterpret_cast<const W*>(wp + 64);
    __m512i ix[8];
    __m512 v[8];
    if constexpr (!std::is_same_v<W, float>) block_values(vals, v);
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) ix[j] = _mm512_srli_epi32(words, 4 * j);
#pragma GCC unroll 16
    for (int m = 0; m < R; ++m) {
      const __m512 xm = _mm512_load_ps(xt + 16 * m);
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        __m512 vj;
        if constexpr (std::is_same_v<W, float>) vj = _mm512_load_ps(reinterpret_cast<const float*>(vals) + 16 * j);  // an FMA operand
        else vj = v[j];
        acc[m][j % A] = _mm512_fmadd_ps(vj, _mm512_permutexvar_ps(ix[j], xm), acc[m][j % A]);
      }
    }
  }
  store_sums(acc, c, ldc, mk);
}

template <class W, bool Stream>
void tile_rows(int rows, const uint8_t* wp, int64_t nb, const float* xt, float* c, int64_t ldc, int cols, bool first) {
  with_rows(std::min(rows, kTileRowsOf<W>), [&](auto R) { tile<R, W, Stream>(wp, nb, xt, c, ldc, cols, first); });
}

// bf16 x with bf16 values: the pairs tile (defined in tiles16_bf16.cpp, the one file that uses it).
template <bool Stream>
void pair_rows(int rows, const uint8_t* wp, int64_t nb, const uint16_t* xt, float* c, int64_t ldc, int cols, bool first);

// y = act(scale * (x W^T) + b) in tiles of 8 or 16 rows of x against groups of 16 weight rows; X is
// float (the f32 tile) or uint16_t (bf16 x: the pairs tile, values bf16).
template <class X, class V>
void linear_as(const X* x, int64_t M, int64_t K, const V* values, const uint8_t* meta, const uint8_t* prepacked,
               const float* scales, const float* bias, Act act, float* y, int64_t N) {
  constexpr bool pairs = std::is_same_v<X, uint16_t>;
  using W = std::conditional_t<pairs, bf16, float>;  // the per-call packing's value type
  const int TR = pairs ? kPairTileRows : prepacked ? kTileRowsOf<V> : kTileRowsOf<float>;
  const int64_t XB = TR * 16 * (pairs ? 2 : 1);  // x elements per tile and block
  const int64_t NB = blocks_of(K), T = (M + TR - 1) / TR, G = (N + 15) / 16;
  // x as tiles of TR rows, block-major (xt[t][b][TR][16], bf16 x each block's columns twice);
  // rows past M and columns past K zero.
  Tensor xt_buf = Tensor::empty({T * NB * XB}, pairs ? DType::bf16 : DType::f32);
  X* xt = reinterpret_cast<X*>(xt_buf.data_ptr());
  parallel_for(0, T * NB, 64, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / NB, b = i % NB, k0 = 16 * b, kc = std::min<int64_t>(16, K - k0);
      X* d = xt + i * XB;
      for (int m = 0; m < TR; ++m) {
        const int64_t row = t * TR + m, have = row < M ? kc : 0;
        for (int h = 0; h < (pairs ? 2 : 1); ++h) {
          X* o = d + (pairs ? 32 : 16) * m + 16 * h;
          if (have) std::memcpy(o, x + row * K + k0, size_t(have) * sizeof(X));
          std::memset(o + have, 0, size_t(16 - have) * sizeof(X));
        }
      }
    }
  });
  // Chunks of kChunkGroups groups, each pass over a span of kSpanBlocks blocks: a tile's span of
  // x stays in L1 while the chunk's groups pass over it, and the chunk's span of weights in L2
  // while the tiles pass over them.
  const int64_t chunks = (G + kChunkGroups - 1) / kChunkGroups, span = std::min(NB, kSpanBlocks);
  parallel_dynamic(0, chunks, [&](const auto& next) {
    Tensor w_buf;
    if (!prepacked) w_buf = Tensor::empty({kChunkGroups * span * kBytes<W>}, DType::u8);
    for (int64_t ch; (ch = next()) >= 0;) {
      const int64_t g0 = ch * kChunkGroups, g1 = std::min(G, g0 + kChunkGroups);
      for (int64_t b0 = 0; b0 < NB; b0 += span) {
        const int64_t nb = std::min(NB - b0, span);
        if (!prepacked)
          for (int64_t g = g0; g < g1; ++g) pack_group<V, W>(values, meta, N, K, 16 * g, b0, b0 + nb, w_buf.data<uint8_t>() + (g - g0) * span * kBytes<W>);
        for (int64_t t = 0; t < T; ++t) {
          const int rows = int(std::min<int64_t>(TR, M - t * TR));
          const X* xb = xt + (t * NB + b0) * XB;
          for (int64_t g = g0; g < g1; ++g) {
            const int cols = int(std::min<int64_t>(16, N - 16 * g));
            float* c = y + t * TR * N + 16 * g;
            const uint8_t* wp = prepacked ? prepacked + prepacked_at<V>(G, NB, g, b0) : w_buf.data<uint8_t>() + (g - g0) * span * kBytes<W>;
            if constexpr (pairs) {
              if (prepacked) pair_rows<true>(rows, wp, nb, xb, c, N, cols, b0 == 0);
              else pair_rows<false>(rows, wp, nb, xb, c, N, cols, b0 == 0);
            } else if (prepacked) tile_rows<V, true>(rows, wp, nb, xb, c, N, cols, b0 == 0);
            else tile_rows<float, false>(rows, wp, nb, xb, c, N, cols, b0 == 0);
          }
        }
      }
      const int64_t n0 = 16 * g0, n1 = std::min(N, 16 * g1);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = n0; n < n1; ++n) y[m * N + n] = activate(y[m * N + n] * scales[n] + (bias ? bias[n] : 0.0f), act);
    }
  });
}

}  // namespace
}  // namespace sinter::sparse

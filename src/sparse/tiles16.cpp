// The 2:4 tile kernel for AVX-512 (kernels.h, tiles16_*): vectors run over 16 weight rows, and for
// each 16 columns of a row of x one vpermps per kept value gives every lane (weight row) its kept
// column of x. Built only with AVX-512 (the AVX2 kernels in kernels.cpp serve the rest).
//
// Why this shape on Zen 5, where a zmm FMA runs at the rate of a ymm one (session 23, 2 threads,
// 4096 x 11008, prepacked, alternating in one process against the AVX2 8-row tiles): M = 16
// 3.2 against 5.3 ms, M = 32 7.2 against 10.0, M = 64 11.4 against 14.4 (the K-major kernel).
// - Selection by vpermps over the 16 columns, not vpermilps over four broadcast ones: per row of x
//   and block, one load of x and 8 permutes feed 8 FMAs, where the in-lane form needs one
//   broadcast (a load and a shuffle) per two (1.3 against 1.0 FMAs a cycle in a scratch loop).
// - x packed per tile of 8 rows, block-major: 8 rows of x read in place are 16 KiB apart for
//   K = 4096, one set of L1, and thrashed it (M = 16: 8.3 against 5.2 ms packed).
// - A prepacked weight is requested 8 KiB ahead, every line of a block: at 2 KiB the stream
//   stalled on memory (M = 8 / 16: 2.3 / 3.2 ms at 8 KiB, 3.0 / 4.2 at 2 KiB, 3.9 / 4.8 at 1 KiB).
#include "sparse/kernels.h"

#if defined(SINTER_TILES16)
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/parallel.h"
#include "ops/scalar_fns.h"
#include "sinter/error.h"
#include "sinter/tensor.h"

// GCC 12's AVX-512 headers start some intrinsics (widenings, permutes) from an undefined vector
// and then warn that it may be used uninitialized; the instructions read no such input.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace sinter::sparse {

namespace {

// A block: 16 weight rows x 16 columns. First 16 u32 index words, row r's word holding the block
// column (0..15) of its kept value j in bits 4j..4j+3 (vpermps reads bits 0-3 of each lane, so a
// shift by 4j makes the word value j's index); then the 8 kept values of each row, value j of
// row r at 16 j + r, of type W. Groups of 16 rows, each a run of ceil(K / 16) blocks.
template <class W> constexpr int64_t kBytes = 64 + 128 * int64_t(sizeof(W));

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
template <class W> SINTER_INLINE __m512 widen16(const W* p) {
  if constexpr (std::is_same_v<W, float>) return _mm512_load_ps(p);
  else if constexpr (std::is_same_v<W, bf16>)
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(p))), 16));
  else return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(p))));
}

// 8 x 8 transpose of rows[r] (8 values of row r) into out[8 j + r].
SINTER_INLINE void transpose8(const __m256 rows[8], float* out, int64_t stride) {
  const __m256 t0 = _mm256_unpacklo_ps(rows[0], rows[1]), t1 = _mm256_unpackhi_ps(rows[0], rows[1]);
  const __m256 t2 = _mm256_unpacklo_ps(rows[2], rows[3]), t3 = _mm256_unpackhi_ps(rows[2], rows[3]);
  const __m256 t4 = _mm256_unpacklo_ps(rows[4], rows[5]), t5 = _mm256_unpackhi_ps(rows[4], rows[5]);
  const __m256 t6 = _mm256_unpacklo_ps(rows[6], rows[7]), t7 = _mm256_unpackhi_ps(rows[6], rows[7]);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  _mm256_storeu_ps(out + 0 * stride, _mm256_permute2f128_ps(s0, s4, 0x20));
  _mm256_storeu_ps(out + 1 * stride, _mm256_permute2f128_ps(s1, s5, 0x20));
  _mm256_storeu_ps(out + 2 * stride, _mm256_permute2f128_ps(s2, s6, 0x20));
  _mm256_storeu_ps(out + 3 * stride, _mm256_permute2f128_ps(s3, s7, 0x20));
  _mm256_storeu_ps(out + 4 * stride, _mm256_permute2f128_ps(s0, s4, 0x31));
  _mm256_storeu_ps(out + 5 * stride, _mm256_permute2f128_ps(s1, s5, 0x31));
  _mm256_storeu_ps(out + 6 * stride, _mm256_permute2f128_ps(s2, s6, 0x31));
  _mm256_storeu_ps(out + 7 * stride, _mm256_permute2f128_ps(s3, s7, 0x31));
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
    if constexpr (std::is_same_v<W, float>) {
      if (whole && n0 + 16 <= N) {  // two 8 x 8 transposes
        for (int h = 0; h < 2; ++h) {
          __m256 rows[8];
          for (int r = 0; r < 8; ++r) rows[r] = widen8(values + (n0 + 8 * h + r) * K2 + 8 * b);
          transpose8(rows, vals + 8 * h, 16);
        }
        continue;
      }
    }
    for (int j = 0; j < 8; ++j)
      for (int r = 0; r < 16; ++r) {
        const int64_t n = n0 + r, i = 8 * b + j;
        vals[16 * j + r] = n < N && i < K2 ? W(values[n * K2 + i]) : W(0.0f);
      }
  }
}
template <class V, class W>
void pack_group_as(const void* values, const uint8_t* meta, int64_t N, int64_t K, int64_t n0, int64_t b0, int64_t b1, uint8_t* out) {
  pack_group<V, W>(static_cast<const V*>(values), meta, N, K, n0, b0, b1, out);
}

constexpr int kTileRows = 8;        // rows of x per tile
constexpr int64_t kAhead = 8192;    // bytes a prepacked weight is requested ahead

// c (R rows, row stride ldc, `cols` <= 16 valid columns) = (first ? 0 : c) + a tile of x (R of
// its 8 rows, xt: block-major, 8 x 16 floats a block) times one group's nb blocks.
template <int R, class W, bool Stream>
__attribute__((noinline)) void tile(const uint8_t* wp, int64_t nb, const float* xt, float* c, int64_t ldc, int cols, bool first) {
  constexpr int A = R <= 2 ? 2 : 1;  // sums per row: one or two rows alone would wait on the FMA latency
  const __mmask16 mk = __mmask16((1u << cols) - 1);
  __m512 acc[R][A];
  for (int m = 0; m < R; ++m) {
    acc[m][0] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mk, c + m * ldc);
    if constexpr (A == 2) acc[m][1] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < nb; ++b, wp += kBytes<W>, xt += kTileRows * 16) {
    if constexpr (Stream)
      for (int64_t l = 0; l < kBytes<W>; l += 64) _mm_prefetch(reinterpret_cast<const char*>(wp) + kAhead + l, _MM_HINT_T0);
    const __m512i words = _mm512_load_si512(wp);
    const W* vals = reinterpret_cast<const W*>(wp + 64);
    __m512i ix[8];
    __m512 v[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) ix[j] = _mm512_srli_epi32(words, 4 * j), v[j] = widen16(vals + 16 * j);
#pragma GCC unroll 8
    for (int m = 0; m < R; ++m) {
      const __m512 xm = _mm512_load_ps(xt + 16 * m);
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) acc[m][j % A] = _mm512_fmadd_ps(v[j], _mm512_permutexvar_ps(ix[j], xm), acc[m][j % A]);
    }
  }
  for (int m = 0; m < R; ++m) {
    __m512 s = acc[m][0];
    if constexpr (A == 2) s = _mm512_add_ps(s, acc[m][1]);
    _mm512_mask_storeu_ps(c + m * ldc, mk, s);
  }
}

template <class W, bool Stream>
void tile_rows(int rows, const uint8_t* wp, int64_t nb, const float* xt, float* c, int64_t ldc, int cols, bool first) {
  switch (rows) {
    case 1: return tile<1, W, Stream>(wp, nb, xt, c, ldc, cols, first);
    case 2: return tile<2, W, Stream>(wp, nb, xt, c, ldc, cols, first);
    case 3: return tile<3, W, Stream>(wp, nb, xt, c, ldc, cols, first);
    case 4: return tile<4, W, Stream>(wp, nb, xt, c, ldc, cols, first);
    case 5: return tile<5, W, Stream>(wp, nb, xt, c, ldc, cols, first);
    case 6: return tile<6, W, Stream>(wp, nb, xt, c, ldc, cols, first);
    case 7: return tile<7, W, Stream>(wp, nb, xt, c, ldc, cols, first);
    default: return tile<8, W, Stream>(wp, nb, xt, c, ldc, cols, first);
  }
}

// f(V{}) for the value dtypes (f32, bf16, i8).
template <class F> decltype(auto) with_value_type(DType vt, const F& f) {
  switch (vt) {
    case DType::f32: return f(float{});
    case DType::bf16: return f(bf16{});
    case DType::i8: return f(int8_t{});
    default: SINTER_THROW(DTypeError, "[sparse24_linear] values must be f32, bf16 or i8, got ", vt);
  }
}

// Columns past this many blocks are packed and computed a span at a time, so a group's packed
// blocks (36 KiB of f32 per 1024 columns) and the tiles' x stay in L2.
constexpr int64_t kSpanBlocks = 256;

template <class V>
void linear_as(const float* x, int64_t M, int64_t K, const V* values, const uint8_t* meta, const uint8_t* prepacked,
               const float* scales, const float* bias, Act act, float* y, int64_t N) {
  const int64_t NB = blocks_of(K), T = (M + kTileRows - 1) / kTileRows, G = (N + 15) / 16;
  // x as tiles of 8 rows, block-major (xt[t][b][8][16]); rows past M and columns past K zero.
  Tensor xt_buf = Tensor::empty({T * NB * kTileRows * 16}, DType::f32);
  float* xt = xt_buf.data<float>();
  parallel_for(0, T * NB, 64, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / NB, b = i % NB, k0 = 16 * b, kc = std::min<int64_t>(16, K - k0);
      float* d = xt + i * kTileRows * 16;
      for (int m = 0; m < kTileRows; ++m) {
        const int64_t row = t * kTileRows + m;
        if (row < M) std::memcpy(d + 16 * m, x + row * K + k0, size_t(kc) * 4);
        if (row >= M || kc < 16) std::memset(d + 16 * m + (row < M ? kc : 0), 0, size_t(16 - (row < M ? kc : 0)) * 4);
      }
    }
  });
  parallel_dynamic(0, G, [&](const auto& next) {
    Tensor w_buf;
    if (!prepacked) w_buf = Tensor::empty({std::min(NB, kSpanBlocks) * kBytes<float>}, DType::u8);
    for (int64_t g; (g = next()) >= 0;) {
      const int64_t n0 = 16 * g;
      const int cols = int(std::min<int64_t>(16, N - n0));
      for (int64_t b0 = 0; b0 < NB; b0 += prepacked ? NB : kSpanBlocks) {
        const int64_t nb = std::min(NB - b0, prepacked ? NB : kSpanBlocks);
        if (!prepacked) pack_group<V, float>(values, meta, N, K, n0, b0, b0 + nb, w_buf.data<uint8_t>());
        for (int64_t t = 0; t < T; ++t) {
          const int rows = int(std::min<int64_t>(kTileRows, M - t * kTileRows));
          const float* xb = xt + (t * NB + b0) * kTileRows * 16;
          float* c = y + t * kTileRows * N + n0;
          if (prepacked) tile_rows<V, true>(rows, prepacked + g * NB * kBytes<V>, nb, xb, c, N, cols, true);
          else tile_rows<float, false>(rows, w_buf.data<uint8_t>(), nb, xb, c, N, cols, b0 == 0);
        }
      }
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = n0; n < n0 + cols; ++n) y[m * N + n] = activate(y[m * N + n] * scales[n] + (bias ? bias[n] : 0.0f), act);
    }
  });
}

}  // namespace

int64_t tiles16_bytes(DType vt, int64_t N, int64_t K) {
  return with_value_type(vt, [&](auto v) { return (N + 15) / 16 * blocks_of(K) * kBytes<decltype(v)>; });
}

void tiles16_prepack(const void* values, DType vt, const uint8_t* meta, int64_t N, int64_t K, uint8_t* out) {
  with_value_type(vt, [&](auto v) {
    using V = decltype(v);
    const int64_t NB = blocks_of(K);
    parallel_for(0, (N + 15) / 16, 4, [&](int64_t g0, int64_t g1) {
      for (int64_t g = g0; g < g1; ++g) pack_group_as<V, V>(values, meta, N, K, 16 * g, 0, NB, out + g * NB * kBytes<V>);
    });
  });
}

void tiles16_linear(const float* x, int64_t M, int64_t K, const void* values, DType vt, const uint8_t* meta, const uint8_t* prepacked,
                    const float* scales, const float* bias, Act act, float* y, int64_t N) {
  if (M == 0 || N == 0) return;
  with_value_type(vt, [&](auto v) {
    using V = decltype(v);
    linear_as<V>(x, M, K, static_cast<const V*>(values), meta, prepacked, scales, bias, act, y, N);
  });
}

}  // namespace sinter::sparse

#endif

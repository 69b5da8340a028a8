// 2:4 sparse matmul kernels (see kernels.h). Measured against oneDNN's dense matmul by
// `sinter bench sparse` (BENCHMARKS.md).
#include "sparse/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "core/parallel.h"
#include "ops/scalar_fns.h"
#include "sinter/error.h"
#include "sinter/tensor.h"

namespace sinter::sparse {

Act parse_activation(const std::string& name, const char* op) {
  if (name == "none") return Act::none;
  if (name == "relu") return Act::relu;
  if (name == "silu") return Act::silu;
  if (name == "gelu") return Act::gelu;
  SINTER_THROW(Error, "[", op, "] unknown activation '", name, "' (none, relu, silu, gelu)");
}

namespace {

// One kept value as f32, whatever its storage.
SINTER_INLINE float value_at(const void* values, DType vt, int64_t i) {
  switch (vt) {
    case DType::f32: return static_cast<const float*>(values)[i];
    case DType::f64: return float(static_cast<const double*>(values)[i]);
    case DType::bf16: return float(static_cast<const bf16*>(values)[i]);
    default: return float(static_cast<const int8_t*>(values)[i]);
  }
}

typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef int8_t v8c __attribute__((vector_size(8)));
typedef int16_t v8s __attribute__((vector_size(16)));

SINTER_INLINE v8f load8f(const float* p) { v8f v; std::memcpy(&v, p, 32); return v; }
SINTER_INLINE void store8f(float* p, v8f v) { std::memcpy(p, &v, 32); }

// Eight kept values as f32.
template <class V> SINTER_INLINE v8f load_values(const V* p);
template <> SINTER_INLINE v8f load_values<float>(const float* p) { return load8f(p); }
template <> SINTER_INLINE v8f load_values<bf16>(const bf16* p) {
#if defined(__AVX2__)
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return (v8f)_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);  // the bf16 bits are the high half of an f32
#else
  v8s s;
  std::memcpy(&s, p, 16);
  return (v8f)(__builtin_convertvector(s, v8i) << 16);
#endif
}
template <> SINTER_INLINE v8f load_values<int8_t>(const int8_t* p) {
#if defined(__AVX2__)
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return (v8f)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
#else
  v8c c;
  std::memcpy(&c, p, 8);
  return __builtin_convertvector(__builtin_convertvector(c, v8i), v8f);
#endif
}

#if !defined(__AVX2__)
// For a meta byte: lanes 0-3 the byte's four kept columns (0..7), lanes 4-7 the same plus 8.
struct PermuteTable {
  alignas(32) int32_t idx[256][8];
  PermuteTable() {
    for (int b = 0; b < 256; ++b) {
      int off[4];
      byte_offsets(uint8_t(b), off);
      for (int t = 0; t < 4; ++t) idx[b][t] = off[t], idx[b][4 + t] = 8 + off[t];
    }
  }
};
const PermuteTable& permute_table() {
  static const PermuteTable t;
  return t;
}

// The eight kept columns of x[16c, 16c + 16) for meta bytes b0 (lanes 0-3) and b1 (lanes 4-7).
SINTER_INLINE v8f gather16(const float* x16, v8i idx) { return __builtin_shuffle(load8f(x16), load8f(x16 + 8), idx); }

#endif

SINTER_INLINE float hsum(v8f v) {
  float s = 0;
  for (int l = 0; l < 8; ++l) s += v[l];
  return s;
}

// f(std::integral_constant<int, n>) for n in 1..8 (larger n as 8): a runtime count as a template argument.
template <class F> SINTER_INLINE void with_1_to_8(int n, const F& f) {
  switch (n) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 7: return f(std::integral_constant<int, 7>{});
    default: return f(std::integral_constant<int, 8>{});
  }
}

constexpr int64_t kPf = 2048;  // prefetch distance in the values stream, bytes (1-4 KiB measured; 2 KiB best)

#if !defined(__AVX2__)
// Decode: y[m, n] for M <= 4 rows of x, weight rows [n0, n1). Each weight row is read once, in
// order, 8 kept values (16 columns) per step; rows are prefetched a few steps ahead.
template <int M, class V>
void small_m_rows(const float* x, int64_t K, const V* values, const uint8_t* meta, int64_t n0, int64_t n1, float* dots) {
  const PermuteTable& pt = permute_table();
  const int64_t chunks = K / 16, K2 = K / 2, K8 = K / 8;
  for (int64_t n = n0; n < n1; ++n) {
    const V* w = values + n * K2;
    const uint8_t* mt = meta + n * K8;
    __builtin_prefetch(mt + 4 * K8, 0, 0);  // meta: a line per row, four rows ahead
    v8f acc0[M], acc1[M];  // two chains per row of x: the FMA latency is hidden
    for (int m = 0; m < M; ++m) acc0[m] = v8f{}, acc1[m] = v8f{};
    auto idx_of = [&](int64_t c) {
      v8i i0, i1;
      std::memcpy(&i0, pt.idx[mt[2 * c]], 32);
      std::memcpy(&i1, pt.idx[mt[2 * c + 1]], 32);
      return __builtin_shuffle(i0, i1, (v8i){0, 1, 2, 3, 12, 13, 14, 15});
    };
    int64_t c = 0;
    for (; c + 2 <= chunks; c += 2) {
      __builtin_prefetch(reinterpret_cast<const char*>(w + 8 * c) + kPf, 0, 0);  // values: kPf bytes ahead
      const v8i ia = idx_of(c), ib = idx_of(c + 1);
      const v8f wa = load_values(w + 8 * c), wb = load_values(w + 8 * c + 8);
      for (int m = 0; m < M; ++m) {
        acc0[m] += wa * gather16(x + m * K + 16 * c, ia);
        acc1[m] += wb * gather16(x + m * K + 16 * c + 16, ib);
      }
    }
    float tail[M] = {};
    for (; c < chunks; ++c) {
      const v8i ia = idx_of(c);
      const v8f wa = load_values(w + 8 * c);
      for (int m = 0; m < M; ++m) acc0[m] += wa * gather16(x + m * K + 16 * c, ia);
    }
    if (K % 16) {  // one last meta byte: four kept values over 8 columns
      int off[4];
      byte_offsets(mt[K8 - 1], off);
      for (int t = 0; t < 4; ++t)
        for (int m = 0; m < M; ++m) tail[m] += float(w[K2 - 4 + t]) * x[m * K + K - 8 + off[t]];
    }
    for (int m = 0; m < M; ++m) dots[m * (n1 - n0) + (n - n0)] = hsum(acc0[m] + acc1[m]) + tail[m];
  }
}
#endif

#if defined(__AVX2__)
// The same pass with in-lane permutes (vpermilps, twice the rate of the cross-lane vpermps on
// Zen 3) and no index table: x is rearranged once per call so each 16 columns read as A = [0-3 |
// 8-11] and B = [4-7 | 12-15]; kept value j of a 16-column step sits in the lane j of group j / 2,
// so permuting A and B by the meta bits (value j's offset is bits 2j, 2j+1 of the step's two
// meta bytes, shifted into place) and blending lanes 2, 3, 6, 7 from B gives its x.
// S streams: the block's rows are split into S runs read side by side, so a core keeps more reads
// in flight than one stream gives it (a plain 2-thread read here: 19 / 28 / 38 GB/s with 1 / 2 / 4
// streams per thread; in this kernel, from cold on the three bench shapes, 2 beat 4 for f32 values).
template <int M, int S, class V>
void small_m_rows_lanes(const float* x, const float* xr, int64_t K, const V* values, const uint8_t* meta, int64_t n0, int64_t n1,
                        float* dots) {
  constexpr int U = S == 1 ? 4 : 2;  // 16-column steps per pass: S x U accumulator chains per row of x hide the FMA latency
  const int64_t chunks = K / 16, K2 = K / 2, K8 = K / 8, nb = n1 - n0, run = (nb + S - 1) / S;
  const __m256i sh_a = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14), sh_b = _mm256_setr_epi32(16, 18, 20, 22, 24, 26, 28, 30);
  auto pick = [](const float* xc, __m256i idx) {  // x of 8 kept values from 16 rearranged columns
    return _mm256_blend_ps(_mm256_permutevar_ps(_mm256_loadu_ps(xc), idx), _mm256_permutevar_ps(_mm256_loadu_ps(xc + 8), idx), 0xCC);
  };
  for (int64_t i = 0; i < run; ++i) {
    int64_t row[S];
    const V* w[S];
    const uint8_t* mt[S];
    for (int s = 0; s < S; ++s) {
      row[s] = std::min(n0 + s * run + i, n1 - 1);  // a short last run repeats its last row, unstored
      w[s] = values + row[s] * K2, mt[s] = meta + row[s] * K8;
      __builtin_prefetch(mt[s] + 4 * K8, 0, 0);
    }
    __m256 acc[S][M][U];
    for (int s = 0; s < S; ++s)
      for (int m = 0; m < M; ++m)
        for (int u = 0; u < U; ++u) acc[s][m][u] = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + U <= chunks; c += U)
      for (int s = 0; s < S; ++s) {
        const char* wb = reinterpret_cast<const char*>(w[s] + 8 * c);
        for (int64_t off = 0; off < int64_t(sizeof(V)) * 8 * U; off += 64) __builtin_prefetch(wb + kPf + off, 0, 0);
        __m256i idx[U];
        for (int u = 0; u < U; u += 2) {
          int32_t word;  // meta bytes of two 16-column steps
          std::memcpy(&word, mt[s] + 2 * (c + u), 4);
          const __m256i mw = _mm256_set1_epi32(word);
          idx[u] = _mm256_srlv_epi32(mw, sh_a), idx[u + 1] = _mm256_srlv_epi32(mw, sh_b);
        }
        __m256 wv[U];
        for (int u = 0; u < U; ++u) wv[u] = (__m256)load_values(w[s] + 8 * (c + u));
        for (int m = 0; m < M; ++m)
          for (int u = 0; u < U; ++u) acc[s][m][u] = _mm256_fmadd_ps(wv[u], pick(xr + m * K + 16 * (c + u), idx[u]), acc[s][m][u]);
      }
    for (int s = 0; s < S; ++s) {
      if (n0 + s * run + i >= n1) continue;
      for (int64_t cc = c; cc < chunks; ++cc) {  // the last few 16-column steps
        const __m256i ia = _mm256_srlv_epi32(_mm256_set1_epi32(int32_t(mt[s][2 * cc] | mt[s][2 * cc + 1] << 8)), sh_a);
        const __m256 wa = (__m256)load_values(w[s] + 8 * cc);
        for (int m = 0; m < M; ++m) acc[s][m][0] = _mm256_fmadd_ps(wa, pick(xr + m * K + 16 * cc, ia), acc[s][m][0]);
      }
      float tail[M] = {};
      if (K % 16) {  // one last meta byte: four kept values over 8 columns
        int off[4];
        byte_offsets(mt[s][K8 - 1], off);
        for (int t = 0; t < 4; ++t)
          for (int m = 0; m < M; ++m) tail[m] += float(w[s][K2 - 4 + t]) * x[m * K + K - 8 + off[t]];
      }
      for (int m = 0; m < M; ++m) {
        __m256 sum = acc[s][m][0];
        for (int u = 1; u < U; ++u) sum = _mm256_add_ps(sum, acc[s][m][u]);
        dots[m * nb + (row[s] - n0)] = hsum((v8f)sum) + tail[m];
      }
    }
  }
}
#endif

template <class V>
void small_m(const float* x, int64_t M, int64_t K, const V* values, const uint8_t* meta, const float* scales, const float* bias,
             Act act, float* y, int64_t N) {
  // Up to four rows of x per pass over a block of weight rows; with more rows the block (at most
  // ~256 KiB of values) is passed again from L2, so memory still sees each weight byte once.
  const int64_t K2 = K / 2, row_bytes = K2 * int64_t(sizeof(V)) + K / 8;
  const int64_t block = M <= 4 ? 64 : std::max<int64_t>(8, (int64_t(256) << 10) / row_bytes);
#if defined(__AVX2__)
  Tensor xr_buf = Tensor::empty({M * K}, DType::f32);  // x with each 16 columns as [0-3, 8-11, 4-7, 12-15]
  float* xr = xr_buf.data<float>();
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = 0; c + 16 <= K; c += 16)
      for (int q = 0; q < 4; ++q) std::memcpy(xr + m * K + c + 4 * q, x + m * K + c + 4 * ((q & 1) * 2 + (q >> 1)), 16);
#endif
  parallel_for(0, N, std::min<int64_t>(block, 64), [&](int64_t lo, int64_t hi) {
    std::vector<float> dots(static_cast<size_t>(4 * block));
    for (int64_t n0 = lo; n0 < hi; n0 += block) {
      const int64_t n1 = std::min(hi, n0 + block), nb = n1 - n0;
      for (int64_t m0 = 0; m0 < M; m0 += 4) {
        const float* xm = x + m0 * K;
#if defined(__AVX2__)
        const float* xrm = xr + m0 * K;
        switch (std::min<int64_t>(4, M - m0)) {
          // Streams per thread (measured in alternating runs, each after a dense GEMV so every one
          // starts cold): f32 values 2 (8-25% faster than 4 on the three bench shapes, 6 no better),
          // bf16 4 (2 even), int8 1 (bound by the widening, not by the stream).
          case 1: small_m_rows_lanes<1, sizeof(V) == 4 ? 2 : sizeof(V) == 2 ? 4 : 1>(xm, xrm, K, values, meta, n0, n1, dots.data()); break;
          case 2: small_m_rows_lanes<2, sizeof(V) == 1 ? 1 : 2>(xm, xrm, K, values, meta, n0, n1, dots.data()); break;
          case 3: small_m_rows_lanes<3, 1>(xm, xrm, K, values, meta, n0, n1, dots.data()); break;
          default: small_m_rows_lanes<4, 1>(xm, xrm, K, values, meta, n0, n1, dots.data()); break;
        }
#else
        switch (std::min<int64_t>(4, M - m0)) {
          case 1: small_m_rows<1>(xm, K, values, meta, n0, n1, dots.data()); break;
          case 2: small_m_rows<2>(xm, K, values, meta, n0, n1, dots.data()); break;
          case 3: small_m_rows<3>(xm, K, values, meta, n0, n1, dots.data()); break;
          default: small_m_rows<4>(xm, K, values, meta, n0, n1, dots.data()); break;
        }
#endif
        for (int64_t m = m0; m < std::min(M, m0 + 4); ++m)
          for (int64_t n = n0; n < n1; ++n)
            y[m * N + n] = activate(dots[size_t((m - m0) * nb + n - n0)] * scales[n] + (bias ? bias[n] : 0.0f), act);
      }
    }
  });
}
// The tile layout (kernels.h): a block of 8 weight rows x 32 columns is 8 meta words (u32, one
// per row: its 4 meta bytes), then the 16 kept values of each row interleaved (value j of row r
// at 8 j + r: V0, V1 of each of 8 groups of four columns), of type W; chunks of 64 weight rows
// (8 groups of 8), column blocks of 256 (8 blocks of 32), chunk-major, then column block, group,
// block.
template <class W> constexpr int64_t kBlockBytes = 32 + 128 * int64_t(sizeof(W));
constexpr int64_t kTilesQb = 8, kTilesRowGroups = 8;

// Byte offset of group b's block q0 (a multiple of kTilesQb) in chunk ch of a prepacked weight.
template <class V> int64_t prepacked_at(int64_t N, int64_t K, int64_t ch, int64_t b, int64_t q0) {
  const int64_t Q = (K + 31) / 32, n0 = ch * 8 * kTilesRowGroups, groups = std::min(kTilesRowGroups, (N - n0 + 7) / 8);
  const int64_t nq = std::min(kTilesQb, Q - q0);
  return (ch * kTilesRowGroups * Q + q0 * groups + b * nq) * kBlockBytes<V>;
}

// kSmallM < M < kKMajorM: vectors run over 8 weight rows. For a group of four columns each row keeps two, so
// per row of x the group's four values are broadcast into both 128-bit lanes and vpermilps picks
// each weight row's kept column (the meta nibbles are the permute indices, shifted into place):
// one in-lane shuffle and one FMA per 8 kept values. The outputs of 8 rows of x x 8 weight rows
// stay in registers over a block of columns. Weights are repacked (8-row interleave, converted
// to f32) and reused for every tile of x; x is packed once per call as tiles of 8 rows (per
// group: 8 rows x 4 values), column-block major.
// Measured on Zen 3: the shuffle port (one vpermilps per cycle, on a pipe the FMAs share) is the
// bound, about half the FMA peak on half the FLOPs; the K-major kernel below, which picks x by
// address instead, is 1.1-1.6x faster from M = 32 and loses below M = 22, where it pads x to
// 16- and 24-row panels and its packing pass weighs more (kernels.h, kKMajorM).
#if defined(__AVX2__)
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
// stream per thread, which the hardware prefetcher alone left stalling on memory. Measured (session
// 19, 2 threads, 4096 x 11008, caches flushed before each call, calls with and without alternated
// in one process, 30-40 each): medians int8 M = 1 1.34 -> 1.19 and 1.20 -> 1.00 ms, f32 M = 4
// 3.55 -> 3.09 and 4.19 -> 3.84, f32 M = 16 8.79 -> 8.37 and 9.49 -> 9.42; int8 M = 4 and 16 and
// f32 M = 32 (compute-bound) even; 1024 bytes ahead about as good, 512 less. Blocks packed per
// call are in cache already: there the requests cost 0-4% (f32 and int8 M = 16, bf16 M = 12),
// so that path makes none.
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
    // Packing and computing do not overlap (session 17: nothing tried made them), so a prepacked
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

// A meta byte's four kept columns as byte offsets into a column-major panel of x (ColBytes a column).
template <int ColBytes> struct PanelOffsets {  // 16 bits each
  uint64_t at[256];
  PanelOffsets() {
    for (int b = 0; b < 256; ++b) {
      int off[4];
      byte_offsets(uint8_t(b), off);
      at[b] = 0;
      for (int t = 0; t < 4; ++t) at[b] |= uint64_t(off[t] * ColBytes) << (16 * t);
    }
  }
};

// One register of a K-major panel's rows: 8 floats with AVX2, 16 with AVX-512. Zen 5 runs a zmm
// FMA at the rate of a ymm one, so there the 16-float kernel does twice the multiply-adds a cycle:
// measured (session 23, Zen 5, 2 threads, 4096 x 11008, alternating in one process) 1.49x the ymm
// kernel at M = 128 and 1.68x at M = 512; 128-row panels (8 registers) ran 1.05-1.08x 64-row ones
// (4 registers, two weight rows side by side). On Zen 4 (session 22) zmm and ymm were even.
#if defined(__AVX512F__)
struct KmVec {
  using T = __m512;
  static constexpr int L = 16;
  static SINTER_INLINE T load(const float* p) { return _mm512_load_ps(p); }
  static SINTER_INLINE void store(float* p, T v) { _mm512_store_ps(p, v); }
  static SINTER_INLINE T bcast(const float* p) { return _mm512_set1_ps(*p); }
  static SINTER_INLINE T fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
};
#else
struct KmVec {
  using T = __m256;
  static constexpr int L = 8;
  static SINTER_INLINE T load(const float* p) { return _mm256_load_ps(p); }
  static SINTER_INLINE void store(float* p, T v) { _mm256_store_ps(p, v); }
  static SINTER_INLINE T bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static SINTER_INLINE T fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
};
#endif
constexpr int kKmPanelVecs = 8;  // registers of rows per full panel: 64 rows (AVX2) or 128 (AVX-512)

// M >= kKMajorM: x packed as column-major panels of PV registers of rows (xp[p][k][PV L]; the
// last panel NV registers wide for the rows left), so a kept value (n, k) multiplies the NV
// registers of column k: one broadcast and NV loads feeding NV FMAs, the column found through
// PanelOffsets from the meta byte. Kept values pick x by address (the load ports) instead of by
// permute (on Zen 3 the shuffles share a pipe with the FMAs: the permute kernel above runs at half
// the FMA peak). Each thread takes a chunk of weight rows and packs one 64-column block of them at
// a time (every row's 32 values, as f32, then its 8 meta bytes) just before the panels pass over
// it, with the next block's lines requested meanwhile; a block of x (64 columns x a panel) stays
// in L1 while the chunk's rows pass over it, and the next block of x is requested ahead.
// Packing a block at a time instead of the whole chunk first (session 23, Zen 5, alternating):
// M = 128 / 512 on 4096 x 11008 22-24 / 76 ms against 25 / 80-81.
// Measured (2 threads, alternating in one process, the three bench shapes) against the permute
// kernel: M = 32-64 1.1-1.4x, M = 128 1.25-1.38x, M = 512 1.27-1.52x, M = 2048 1.26-1.61x; against
// the column-major panel kernel that served f32 at 9 <= M <= 24 (weights read in place, now gone)
// and the permute kernel for int8 and bf16 there: 0.91-1.09x, even; at M = 8 0.79-0.85x (session
// 14; in session 17 the permute kernel measured faster up to M = 21, see kKMajorM).
// A first K-major version (session 13) read each row's 64-column block in place, short runs
// across many rows that stalled on memory, and ran at 0.6-0.7x of the permute kernel: packing the
// chunk and requesting the next block of x ahead made the difference.
constexpr int64_t kKmCols = 64;                  // columns per block: 8 meta bytes
constexpr int64_t kKmRowFloats = kKmCols / 2 + 2;  // a row's block: 32 values, then 8 meta bytes (2 floats)

// R consecutive rows of a packed block (for narrow panels one row's NV accumulators alone would
// wait on the FMA latency, so R rows run side by side).
template <class Vec, int R, int NV>
SINTER_INLINE void k_major_row(const float* wr, const float* xb, float* acc_out) {
  constexpr int PW = Vec::L * NV;
  static const PanelOffsets<PW * 4> tab;
  typename Vec::T a[R][NV];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < NV; ++u) a[r][u] = Vec::load(acc_out + PW * r + Vec::L * u);
  // Every column offset of the block is looked up before the first FMA: the FMAs' loads then wait
  // on no load of meta or table (measured on Zen 5: 15-20% faster than looking each up in turn).
  uint64_t o[R][kKmCols / 8];
  for (int r = 0; r < R; ++r) {
    const uint8_t* mb = reinterpret_cast<const uint8_t*>(wr + r * kKmRowFloats + kKmCols / 2);
#pragma GCC unroll 8
    for (int i = 0; i < kKmCols / 8; ++i) o[r][i] = tab.at[mb[i]];
  }
  const char* x = reinterpret_cast<const char*>(xb);
#pragma GCC unroll 8
  for (int i = 0; i < kKmCols / 8; ++i, x += 8 * PW * 4) {
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const float* w = wr + r * kKmRowFloats;
#pragma GCC unroll 4
      for (int t = 0; t < 4; ++t) {
        const float* xr = reinterpret_cast<const float*>(x + ((o[r][i] >> (16 * t)) & 0xffff));
        const typename Vec::T v = Vec::bcast(w + 4 * i + t);
#pragma GCC unroll 8
        for (int u = 0; u < NV; ++u) a[r][u] = Vec::fma(v, Vec::load(xr + Vec::L * u), a[r][u]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < NV; ++u) Vec::store(acc_out + PW * r + Vec::L * u, a[r][u]);
}

// Rows [0, nr) of a packed chunk over one block of a panel NV registers wide; acc: nr x NV L
// floats. The next block of x (`lines` cache lines at `next`) is requested a few lines per row.
template <class Vec, int NV, int Chains>
void k_major_rows(const float* wb, int64_t nr, const float* xb, float* acc, const char* next, int64_t lines) {
  constexpr int R = NV >= Chains ? 1 : (Chains + NV - 1) / NV;
  const int64_t per_row = (lines + nr - 1) / std::max<int64_t>(nr, 1);
  int64_t r = 0;
  for (; r < nr; r += R) {
    for (int64_t l = r * per_row; next && l < std::min(lines, (r + R) * per_row); ++l) _mm_prefetch(next + 64 * l, _MM_HINT_T0);
    if (r + R > nr) break;
    k_major_row<Vec, R, NV>(wb + r * kKmRowFloats, xb, acc + r * Vec::L * NV);
  }
  for (; r < nr; ++r) k_major_row<Vec, 1, NV>(wb + r * kKmRowFloats, xb, acc + r * Vec::L * NV);
}

// y's columns [n0, n0 + nr) from a chunk's sums kept per panel of PW rows of x (panel p at acc +
// p PW NC: nr weight rows x the panel's width): act(scale * sum + bias).
template <class Width>
void panel_epilogue(const float* acc, int64_t M, int64_t PW, int64_t NC, const Width& panel_width, int64_t n0, int64_t nr,
                    const float* scales, const float* bias, Act act, float* y, int64_t N) {
  for (int64_t m = 0; m < M; ++m) {
    const int64_t p = m / PW, pw = panel_width(p);
    const float* a = acc + p * PW * NC + (m - p * PW);
    for (int64_t n = 0; n < nr; ++n) y[m * N + n0 + n] = activate(a[n * pw] * scales[n0 + n] + (bias ? bias[n0 + n] : 0.0f), act);
  }
}

template <class Vec, int PV, int Chains, class V>
void k_major(const float* x, int64_t M, int64_t K, const V* values, const uint8_t* meta, const float* scales, const float* bias,
             Act act, float* y, int64_t N) {
  constexpr int64_t L = Vec::L, PW = L * PV;  // rows of x per full panel
  const int64_t KB = (K + kKmCols - 1) / kKmCols, Kp = KB * kKmCols;  // x padded with zero columns to whole blocks
  const int64_t full = M / PW, rest = M % PW, nv_last = (rest + L - 1) / L, P = full + (rest > 0);
  auto panel_width = [&](int64_t p) { return p < full ? PW : L * nv_last; };
  Tensor xp_buf = Tensor::empty({Kp * (full * PW + L * nv_last)}, DType::f32);  // caching allocator: 64-byte aligned
  float* xp = xp_buf.data<float>();
  parallel_for(0, P, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t pw = panel_width(p), m0 = p * PW;
      float* d = xp + p * PW * Kp;
      for (int64_t k0 = 0; k0 < Kp; k0 += 8)  // 8 columns at a time: a cache line of each row of x
        for (int64_t r = 0; r < pw; ++r) {
          const float* src = m0 + r < M ? x + (m0 + r) * K : nullptr;  // rows past M are zero
          for (int64_t k = k0; k < k0 + 8; ++k) d[k * pw + r] = src && k < K ? src[k] : 0.0f;
        }
    }
  });
  // Weight rows per chunk: each chunk reads all of x once, so more rows when x is large, but at
  // least four chunks per thread. Measured (session 23, Zen 5, 4096 x 11008, alternating) with the
  // weights packed a block at a time: 32 / 64 / 128 / 256 rows at M = 128 26.0 / 22.7 / 22.5 / 22.2
  // ms, at M = 2048 366 / 335 / 318 / 308 ms. On the same machine the AVX2 build's K-major kernel
  // (whole chunks packed first and 64 rows at M = 128 before) went from 38-41 to 36-38 ms at
  // M = 128 and from 144-162 to 130-144 at M = 512 (separate processes, alternated three times).
  const int64_t want = M <= 256 ? 128 : 256;
  const int64_t NC = std::max<int64_t>(8, std::min(want, (N / (4 * num_threads()) + 7) / 8 * 8));
  const int64_t chunks = (N + NC - 1) / NC, K2 = K / 2, K8 = K / 8;
  parallel_dynamic(0, chunks, [&](const auto& next) {
    Tensor w_buf = Tensor::empty({NC * kKmRowFloats}, DType::f32);  // one block of the chunk's rows
    Tensor acc_buf = Tensor::empty({(full * PW + L * nv_last) * NC}, DType::f32);  // per panel p: NC rows x its width
    float* wp = w_buf.data<float>();
    float* acc = acc_buf.data<float>();
    for (int64_t c; (c = next()) >= 0;) {
      const int64_t n0 = c * NC, nr = std::min(NC, N - n0);
      // Block kb of the chunk's rows as f32 (32 values, then 8 meta bytes a row), packed just
      // before the panels pass over it, so it stays in L1; its lines were requested while the
      // previous block computed (request), so the packing does not wait on memory.
      const auto pack = [&](int64_t kb) {
        const int64_t k0 = kb * kKmCols, kc = std::min<int64_t>(kKmCols, K - k0);
        for (int64_t r = 0; r < nr; ++r) {
          const V* vs = values + (n0 + r) * K2 + k0 / 2;
          const uint8_t* ms = meta + (n0 + r) * K8 + k0 / 8;
          float* d = wp + r * kKmRowFloats;
          if (kc == kKmCols) {
            for (int64_t i = 0; i < kKmCols / 2; i += 8) _mm256_storeu_ps(d + i, (__m256)load_values(vs + i));
            std::memcpy(d + kKmCols / 2, ms, size_t(kKmCols / 8));
          } else {  // the last, partial block: zero values and meta past K (they pick padded zero columns)
            std::memset(d, 0, kKmRowFloats * sizeof(float));
            for (int64_t i = 0; i < kc / 2; ++i) d[i] = float(vs[i]);
            std::memcpy(d + kKmCols / 2, ms, size_t(kc / 8));
          }
        }
      };
      const auto request = [&](int64_t kb) {
        const int64_t k0 = kb * kKmCols;
        for (int64_t r = 0; r < nr; ++r) {
          const char* vs = reinterpret_cast<const char*>(values + (n0 + r) * K2 + k0 / 2);
          for (int64_t o = 0; o < int64_t(kKmCols / 2 * sizeof(V)); o += 64) _mm_prefetch(vs + o, _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(meta + (n0 + r) * K8 + k0 / 8), _MM_HINT_T0);
        }
      };
      std::memset(acc, 0, size_t(acc_buf.numel()) * sizeof(float));
      for (int64_t kb = 0; kb < KB; ++kb) {
        pack(kb);
        if (kb + 1 < KB) request(kb + 1);
        for (int64_t p = 0; p < P; ++p) {
          const int64_t pw = panel_width(p);
          const int64_t np = p + 1 < P ? p + 1 : 0, nkb = p + 1 < P ? kb : kb + 1;  // the block after this one
          const float* next = nkb < KB ? xp + np * PW * Kp + nkb * kKmCols * panel_width(np) : nullptr;
          with_1_to_8(int(pw / L), [&](auto NV) {
            k_major_rows<Vec, NV, Chains>(wp, nr, xp + p * PW * Kp + kb * kKmCols * pw, acc + p * PW * NC,
                                                   reinterpret_cast<const char*>(next), kKmCols * panel_width(np) * 4 / 64);
          });
        }
      }
      panel_epilogue(acc, M, PW, NC, panel_width, n0, nr, scales, bias, act, y, N);
    }
  });
}

#endif

#if defined(__AVX512BF16__)
// bf16 x and bf16 values, M >= kPairsM: vdpbf16ps multiplies 16 pairs of bf16 into 16 f32 sums,
// and a 2:4 group's two kept values are such a pair. K-major as above, with 16 rows of x a
// vector: for each group of four columns and each pair of its columns (6), x is laid out as 16
// lanes (x[m, a], x[m, b]); a weight row's group broadcasts its two kept values (stored side by
// side) and picks its pair's vector by address, so one vdpbf16ps does 32 kept multiply-adds (the
// f32 kernel's FMA does 8 or 16).
// Blocks of 64 columns over panels of 32 rows (alternating runs, 2 threads, 4096 x 11008, against
// 32 columns over 64 rows: M = 32 1.03-1.10x against 0.92-0.96x oneDNN's bf16 matmul, M = 512
// 1.08-1.09x against 1.05-1.06x, M = 128 0.99-1.10x against 1.03-1.05x): half the loads and
// stores of the sums per multiply-add, and the block of pairs stays at 12 KiB.
constexpr int64_t kPrCols = 64;                          // columns per block: 16 groups, 8 meta bytes
constexpr int64_t kPrPanel = 32;                         // rows of x per full panel: 2 vectors of 16
constexpr int64_t kPrSlot = kPrPanel / 16 * 64;          // bytes of one pair of one group for a full panel
constexpr int64_t kPrBlock = kPrCols / 4 * 6 * kPrSlot;  // one block of pairs: 16 groups x 6 pairs (12 KiB)
constexpr int64_t kPrRowBytes = kPrCols + kPrCols / 8;   // a packed row's block: 32 bf16 values, then 8 meta bytes

// For a meta byte (two groups): the byte offsets of their pairs within a block of pairs, group 0
// in bits 0-15 and group 1 in bits 16-31, when both groups keep two distinct columns in
// increasing order (as to_sparse_semi_structured writes them); 0xffffffff when not (the packing
// puts such groups in order first).
struct PairOffsets {
  uint32_t at[256];
  PairOffsets() {
    static const int slot[4][4] = {{-1, 0, 1, 2}, {-1, -1, 3, 4}, {-1, -1, -1, 5}, {-1, -1, -1, -1}};
    for (int b = 0; b < 256; ++b) {
      uint32_t o = 0;
      for (int h = 0; h < 2 && o != 0xffffffffu; ++h) {
        const int lo = (b >> (4 * h)) & 3, hi = (b >> (4 * h + 2)) & 3;
        o = slot[lo][hi] < 0 ? 0xffffffffu : o | uint32_t((h * 6 + slot[lo][hi]) * kPrSlot) << (16 * h);
      }
      at[b] = o;
    }
  }
};
const PairOffsets& pair_offsets() {
  static const PairOffsets t;
  return t;
}

// A group whose meta is not two distinct columns in order: the same product with them in order.
// Swapped columns swap the two values; a column kept twice (meta a reader may hand us; our
// writer never makes it) keeps its first value at a free column's place with the second zeroed,
// and the second is returned as a correction (its column, value) to add after the block.
struct Correction {
  int64_t row, col;
  float value;
};
void order_group(uint16_t* vals, uint8_t* meta_byte, int h, int64_t row, int64_t col0, std::vector<Correction>& fix) {
  int lo = (*meta_byte >> (4 * h)) & 3, hi = (*meta_byte >> (4 * h + 2)) & 3;
  if (lo > hi) std::swap(lo, hi), std::swap(vals[0], vals[1]);
  if (lo == hi) {
    const uint16_t second = vals[1];
    uint32_t bits = uint32_t(second) << 16;
    float v;
    std::memcpy(&v, &bits, 4);
    if (v != 0.0f) fix.push_back({row, col0 + lo, v});
    if (lo == 3) lo = 2, vals[1] = vals[0], vals[0] = 0;  // (3, 3) -> (2, 3) with 0 at column 2
    else hi = lo + 1, vals[1] = 0;                        // (a, a) -> (a, a + 1) with 0 at a + 1
  }
  *meta_byte = uint8_t((*meta_byte & ~(15 << (4 * h))) | (lo | hi << 2) << (4 * h));
}

// Whether every group of a row's meta keeps two distinct columns in increasing order (64 bytes a step).
bool pairs_in_order(const uint8_t* meta, int64_t bytes) {
  const __m512i three = _mm512_set1_epi8(3);
  int64_t i = 0;
  for (; i + 64 <= bytes; i += 64) {
    const __m512i b = _mm512_loadu_si512(meta + i);
    const __m512i lo0 = _mm512_and_si512(b, three), hi0 = _mm512_and_si512(_mm512_srli_epi16(b, 2), three);
    const __m512i lo1 = _mm512_and_si512(_mm512_srli_epi16(b, 4), three), hi1 = _mm512_and_si512(_mm512_srli_epi16(b, 6), three);
    if (_mm512_cmpge_epu8_mask(lo0, hi0) | _mm512_cmpge_epu8_mask(lo1, hi1)) return false;
  }
  for (; i < bytes; ++i)
    if (pair_offsets().at[meta[i]] == 0xffffffffu) return false;
  return true;
}

// The pairs of one block of columns for a panel of nv vectors: xt is the panel transposed
// (column k at xt + k pw, pw = 16 nv), columns past K already zero.
void build_pairs(const uint16_t* xt, int64_t pw, int nv, uint8_t* out) {
  static const int pa[6] = {0, 0, 0, 1, 1, 2}, pb[6] = {1, 2, 3, 2, 3, 3};
  for (int g = 0; g < kPrCols / 4; ++g)
    for (int u = 0; u < nv; ++u) {
      __m512i lo[4], hi[4];
      for (int j = 0; j < 4; ++j) {
        lo[j] = _mm512_maskz_cvtepu16_epi32(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xt + (4 * g + j) * pw + 16 * u)));
        hi[j] = _mm512_maskz_slli_epi32(0xffff, lo[j], 16);  // maskz: GCC 12 warns on the plain forms' undefined source
      }
      for (int s = 0; s < 6; ++s)
        _mm512_store_si512(out + (g * 6 + s) * kPrSlot + 64 * u, _mm512_or_si512(lo[pa[s]], hi[pb[s]]));
    }
}

// R rows of a packed chunk over one block of pairs, NV vectors of 16 rows of x; acc: R x 16 NV.
template <int R, int NV> SINTER_INLINE void pairs_rows(const uint8_t* wr, const uint8_t* pb, float* acc) {
  const PairOffsets& tab = pair_offsets();
  __m512 a[R][NV];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < NV; ++u) a[r][u] = _mm512_load_ps(acc + 16 * (NV * r + u));
  uint32_t os[R][kPrCols / 8];  // every pair offset of the block looked up first, as in k_major_row
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int h = 0; h < kPrCols / 8; ++h) os[r][h] = tab.at[wr[r * kPrRowBytes + kPrCols + h]];
#pragma GCC unroll 4
  for (int h = 0; h < kPrCols / 8; ++h) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const uint8_t* w = wr + r * kPrRowBytes;
      const uint32_t o = os[r][h];
#pragma GCC unroll 2
      for (int gg = 0; gg < 2; ++gg) {
        const int g = 2 * h + gg;
        uint32_t pair;
        std::memcpy(&pair, w + 4 * g, 4);
        const __m512bh wv = (__m512bh)_mm512_set1_epi32(int(pair));
        const uint8_t* xg = pb + h * 2 * 6 * kPrSlot + ((o >> (16 * gg)) & 0xffff);
#pragma GCC unroll 4
        for (int u = 0; u < NV; ++u) a[r][u] = _mm512_dpbf16_ps(a[r][u], (__m512bh)_mm512_load_si512(xg + 64 * u), wv);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < NV; ++u) _mm512_store_ps(acc + 16 * (NV * r + u), a[r][u]);
}

// The next block of pairs (kPrBlock bytes at next) is requested a few lines per R rows: its
// loads go by the meta, in no order a hardware prefetcher follows.
template <int NV> void pairs_block(const uint8_t* wb, int64_t nr, const uint8_t* pb, float* acc, const uint8_t* next) {
  constexpr int R = NV == 1 ? 8 : 4;  // 8 chains of sums either way
  constexpr int64_t lines = kPrBlock / 64;
  const int64_t per = (lines + (nr + R - 1) / R - 1) / std::max<int64_t>((nr + R - 1) / R, 1);  // lines per R rows
  int64_t r = 0, l = 0;
  for (; r + R <= nr; r += R) {
    for (int64_t e = std::min(lines, l + per); next && l < e; ++l) _mm_prefetch(reinterpret_cast<const char*>(next) + 64 * l, _MM_HINT_T0);
    pairs_rows<R, NV>(wb + r * kPrRowBytes, pb, acc + r * 16 * NV);
  }
  for (; r < nr; ++r) pairs_rows<1, NV>(wb + r * kPrRowBytes, pb, acc + r * 16 * NV);
}

void pairs_panel(int nv, const uint8_t* wb, int64_t nr, const uint8_t* pb, float* acc, const uint8_t* next) {
  static_assert(kPrPanel == 32, "panels of one or two vectors");
  if (nv == 1) return pairs_block<1>(wb, nr, pb, acc, next);
  pairs_block<2>(wb, nr, pb, acc, next);
}

// M <= 16 (one vector of x): each block of weights would be used once, so the rows are read in
// place, four at a time (two chains of sums each) over a span of kStreamBlocks blocks of columns
// whose pairs (192 KiB used) stay in L2, and the next four rows are requested ahead: a row of a
// 4096-wide bf16 weight is one page, and the hardware prefetcher does not cross pages. Measured
// at M = 16 (alternating runs, 2 threads, 4096 x 4096 and 4096 x 11008): 1.33-1.45x the packed
// path; spans of 4 / 8 / 16 / 32 / 64 blocks ran 0.9-1.0 / 1.0-1.3 / 1.15-1.3 / 1.25-1.33 /
// 1.25-1.27x the prepacked tiles (one noisy outlier left out).
constexpr int64_t kStreamBlocks = 32;
template <int R>
void pairs_stream_rows(const uint8_t* w, int64_t ws, const uint8_t* m, int64_t ms, int64_t nkb, const uint8_t* pb, float* acc,
                       const uint8_t* next_w, const uint8_t* next_m, int next_rows) {
  const PairOffsets& tab = pair_offsets();
  __m512 a[R][2];
  for (int r = 0; r < R; ++r) a[r][0] = _mm512_load_ps(acc + 16 * r), a[r][1] = _mm512_setzero_ps();
  for (int64_t kb = 0; kb < nkb; ++kb, w += kPrCols, m += kPrCols / 8, pb += kPrBlock) {
    for (int r = 0; r < next_rows; ++r) _mm_prefetch(reinterpret_cast<const char*>(next_w + r * ws + kb * kPrCols), _MM_HINT_T0);
    if (kb % 8 == 0)
      for (int r = 0; r < next_rows; ++r) _mm_prefetch(reinterpret_cast<const char*>(next_m + r * ms + kb * kPrCols / 8), _MM_HINT_T0);
#pragma GCC unroll 8
    for (int h = 0; h < kPrCols / 8; ++h)
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const uint32_t o = tab.at[m[r * ms + h]];
#pragma GCC unroll 2
        for (int gg = 0; gg < 2; ++gg) {
          uint32_t pair;
          std::memcpy(&pair, w + r * ws + 4 * (2 * h + gg), 4);
          const uint8_t* xg = pb + h * 2 * 6 * kPrSlot + ((o >> (16 * gg)) & 0xffff);
          a[r][gg] = _mm512_dpbf16_ps(a[r][gg], (__m512bh)_mm512_load_si512(xg), (__m512bh)_mm512_set1_epi32(int(pair)));
        }
      }
  }
  for (int r = 0; r < R; ++r) _mm512_store_ps(acc + 16 * r, _mm512_add_ps(a[r][0], a[r][1]));
}

void k_major_pairs(const uint16_t* x, int64_t M, int64_t K, const uint16_t* values, const uint8_t* meta, const float* scales,
                   const float* bias, Act act, float* y, int64_t N) {
  constexpr int64_t PW = kPrPanel;
  const int64_t KB = (K + kPrCols - 1) / kPrCols, Kp = KB * kPrCols;  // x padded with zero columns to whole blocks
  const int64_t full = M / PW, rest = M % PW, nv_last = (rest + 15) / 16, P = full + (rest > 0);
  auto panel_width = [&](int64_t p) { return p < full ? PW : 16 * nv_last; };
  // x's pairs, block-major per panel (pairs[p][kb]), each panel built from its transpose (column k
  // at d + k pw) in a scratch buffer of the thread's.
  Tensor pairs_buf = Tensor::empty({P * KB * kPrBlock}, DType::u8);
  uint8_t* pairs = pairs_buf.data<uint8_t>();
  parallel_for(0, P, 1, [&](int64_t p0, int64_t p1) {
    Tensor xt_buf = Tensor::empty({Kp * PW}, DType::bf16);
    uint16_t* d = reinterpret_cast<uint16_t*>(xt_buf.data_ptr());
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t pw = panel_width(p), m0 = p * PW;
      for (int64_t k0 = 0; k0 < Kp; k0 += 32)
        for (int64_t r = 0; r < pw; ++r) {
          const uint16_t* src = m0 + r < M ? x + (m0 + r) * K : nullptr;  // rows past M are zero
          for (int64_t k = k0; k < k0 + 32; ++k) d[k * pw + r] = src && k < K ? src[k] : 0;
        }
      for (int64_t kb = 0; kb < KB; ++kb) build_pairs(d + kb * kPrCols * pw, pw, int(pw / 16), pairs + (p * KB + kb) * kPrBlock);
    }
  });
  // 64 weight rows per chunk: a panel's sums (64 x 32 floats, 8 KiB), its block of pairs (12 KiB)
  // and the rows' block of weights stay in L1 (measured at one thread with 64-row panels, 4096 x
  // 4096, M = 128 and 512: 32, 64 and 128 rows 0.85-0.87x, 1.01-1.03x and 0.88-0.89x oneDNN's
  // bf16 matmul).
  const int64_t NC = std::max<int64_t>(8, std::min<int64_t>(64, (N / (4 * num_threads()) + 7) / 8 * 8));
  const int64_t chunks = (N + NC - 1) / NC, K2 = K / 2, K8 = K / 8;
  parallel_dynamic(0, chunks, [&](const auto& next) {
    Tensor w_buf = Tensor::empty({KB * NC * kPrRowBytes}, DType::u8);
    Tensor acc_buf = Tensor::empty({P * PW * NC}, DType::f32);  // per panel p: NC rows x its width
    uint8_t* wp = w_buf.data<uint8_t>();
    float* acc = acc_buf.data<float>();
    std::vector<Correction> fix;
    const PairOffsets& tab = pair_offsets();
    for (int64_t c; (c = next()) >= 0;) {
      const int64_t n0 = c * NC, nr = std::min(NC, N - n0);
      fix.clear();
      if (P == 1 && nv_last == 1 && K % kPrCols == 0) {  // M <= 16: the rows in place, unless their meta needs ordering
        bool ordered = true;
        for (int64_t r = 0; r < nr && ordered; ++r) ordered = pairs_in_order(meta + (n0 + r) * K8, K8);
        if (ordered) {
          const uint8_t* w0 = reinterpret_cast<const uint8_t*>(values + n0 * K2);
          const uint8_t* m0 = meta + n0 * K8;
          std::memset(acc, 0, size_t(nr) * 16 * sizeof(float));
          for (int64_t ks = 0; ks < KB; ks += kStreamBlocks) {
            const int64_t nkb = std::min(kStreamBlocks, KB - ks);
            for (int64_t r = 0; r < nr; r += 4) {
              const int rows = int(std::min<int64_t>(4, nr - r)), ahead = int(std::clamp<int64_t>(nr - r - 4, 0, 4));
              const uint8_t* w = w0 + r * K + ks * kPrCols;
              const uint8_t* m = m0 + r * K8 + ks * kPrCols / 8;
              const uint8_t* pb = pairs + ks * kPrBlock;
              if (rows == 4) pairs_stream_rows<4>(w, K, m, K8, nkb, pb, acc + r * 16, w + 4 * K, m + 4 * K8, ahead);
              else
                for (int i = 0; i < rows; ++i) pairs_stream_rows<1>(w + i * K, K, m + i * K8, K8, nkb, pb, acc + (r + i) * 16, w, m, 0);
            }
          }
          panel_epilogue(acc, M, PW, NC, panel_width, n0, nr, scales, bias, act, y, N);  // one panel, 16 wide
          continue;
        }
      }
      // Block-major: per block of columns, every row's values then meta. Rows are read S side by
      // side, as in k_major: one row at a time left the packing waiting on memory at M = 16.
      constexpr int64_t S = 4;
      for (int64_t r0 = 0; r0 < nr; r0 += S) {
        const int64_t rs = std::min(S, nr - r0);
        bool ordered[S];
        for (int64_t i = 0; i < rs; ++i) ordered[i] = pairs_in_order(meta + (n0 + r0 + i) * K8, K8);
        for (int64_t kb = 0; kb < KB; ++kb)
          for (int64_t i = 0; i < rs; ++i) {
            const int64_t r = r0 + i;
            uint8_t* d = wp + (kb * NC + r) * kPrRowBytes;
            const int64_t k0 = kb * kPrCols, kc = std::min(kPrCols, K - k0);
            if (kc == kPrCols) {
              std::memcpy(d, values + (n0 + r) * K2 + k0 / 2, kPrCols);
              std::memcpy(d + kPrCols, meta + (n0 + r) * K8 + k0 / 8, kPrCols / 8);
            } else {  // the last, partial block: zero values past K, each group's meta (0, 1)
              std::memset(d, 0, kPrRowBytes);
              std::memset(d + kPrCols, 0x44, kPrCols / 8);
              std::memcpy(d, values + (n0 + r) * K2 + k0 / 2, size_t(kc));
              std::memcpy(d + kPrCols, meta + (n0 + r) * K8 + k0 / 8, size_t(kc / 8));
            }
            for (int h = 0; h < kPrCols / 8 && !ordered[i]; ++h)
              if (tab.at[d[kPrCols + h]] == 0xffffffffu)
                for (int gg = 0; gg < 2; ++gg)
                  order_group(reinterpret_cast<uint16_t*>(d) + 2 * (2 * h + gg), d + kPrCols + h, gg, r, k0 + 4 * (2 * h + gg), fix);
          }
      }
      std::memset(acc, 0, size_t(acc_buf.numel()) * sizeof(float));
      for (int64_t kb = 0; kb < KB; ++kb)
        for (int64_t p = 0; p < P; ++p) {
          const int64_t np = p + 1 < P ? p + 1 : 0, nkb = p + 1 < P ? kb : kb + 1;  // the block after this one
          pairs_panel(int(panel_width(p) / 16), wp + kb * NC * kPrRowBytes, nr, pairs + (p * KB + kb) * kPrBlock, acc + p * PW * NC,
                      nkb < KB ? pairs + (np * KB + nkb) * kPrBlock : nullptr);
        }
      for (const Correction& f : fix)  // columns a weight row's meta named twice
        for (int64_t m = 0; m < M; ++m) {
          const int64_t p = m / PW, pw = panel_width(p);
          uint32_t bits = uint32_t(x[m * K + f.col]) << 16;
          float xv;
          std::memcpy(&xv, &bits, 4);
          acc[p * PW * NC + f.row * pw + (m - p * PW)] += f.value * xv;
        }
      panel_epilogue(acc, M, PW, NC, panel_width, n0, nr, scales, bias, act, y, N);
    }
  });
}
#endif

// Row by row, plainly, accumulating in T: the f64 reference the gradient checks differentiate, and
// f64 values met in the f32 entry point. value(i) is kept value i.
template <class T, class Value>
void plain_rows(const T* x, int64_t M, int64_t K, const Value& value, const uint8_t* meta, const float* scales, const T* bias, Act act,
                T* y, int64_t N) {
  const int64_t K2 = K / 2, K8 = K / 8;
  parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t m = 0; m < M; ++m) {
        T s = 0;
        for (int64_t b = 0; b < K8; ++b) {
          int off[4];
          byte_offsets(meta[n * K8 + b], off);
          for (int t = 0; t < 4; ++t) s += T(value(n * K2 + 4 * b + t)) * x[m * K + 8 * b + off[t]];
        }
        y[m * N + n] = activate(s * T(scales[n]) + (bias ? bias[n] : T(0)), act);
      }
  });
}

// The portable reading of a prepacked weight: row by row, plainly (the tile kernel needs AVX2).
template <class V>
void prepacked_rows(const float* x, int64_t M, int64_t K, const uint8_t* packed, const float* scales, const float* bias, Act act,
                    float* y, int64_t N) {
  const int64_t Q = (K + 31) / 32;
  parallel_for(0, N, 8, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t m = 0; m < M; ++m) {
        float s = 0;
        const int64_t ch = n / (8 * kTilesRowGroups), b = n % (8 * kTilesRowGroups) / 8, r = n % 8;
        for (int64_t q = 0; q < Q; ++q) {
          const int64_t q0 = q / kTilesQb * kTilesQb;
          const uint8_t* blk = packed + prepacked_at<V>(N, K, ch, b, q0) + (q - q0) * kBlockBytes<V>;
          uint32_t word;
          std::memcpy(&word, blk + 4 * r, 4);
          const V* vals = reinterpret_cast<const V*>(blk + 32);
          for (int64_t g = 0; g < 8 && 32 * q + 4 * g < K; ++g) {
            const float* xg = x + m * K + 32 * q + 4 * g;
            const uint32_t nib = (word >> (4 * g)) & 15;
            s += float(vals[8 * (2 * g) + r]) * xg[nib & 3] + float(vals[8 * (2 * g + 1) + r]) * xg[nib >> 2];
          }
        }
        y[m * N + n] = activate(s * scales[n] + (bias ? bias[n] : 0.0f), act);
      }
  });
}

template <class V> void prepack_as(const V* values, const uint8_t* meta, int64_t N, int64_t K, uint8_t* out) {
  const int64_t Q = (K + 31) / 32, K2 = K / 2, K8 = K / 8, chunk = 8 * kTilesRowGroups;
  parallel_for(0, (N + chunk - 1) / chunk, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t ch = c0; ch < c1; ++ch) {
      const int64_t groups = std::min(kTilesRowGroups, (N - ch * chunk + 7) / 8);
      for (int64_t b = 0; b < groups; ++b)
        for (int64_t q = 0; q < Q; ++q) {
          const int64_t q0 = q / kTilesQb * kTilesQb;
          uint8_t* blk = out + prepacked_at<V>(N, K, ch, b, q0) + (q - q0) * kBlockBytes<V>;
          std::memset(blk, 0, size_t(kBlockBytes<V>));  // rows past N, columns past K: zero values, meta 0
          V* vals = reinterpret_cast<V*>(blk + 32);
          for (int64_t r = 0; r < 8; ++r) {
            const int64_t n = ch * chunk + 8 * b + r;
            if (n >= N) break;
            std::memcpy(blk + 4 * r, meta + n * K8 + 4 * q, size_t(std::min<int64_t>(4, K8 - 4 * q)));
            for (int64_t j = 0; j < 16 && 16 * q + j < K2; ++j) vals[8 * j + r] = values[n * K2 + 16 * q + j];
          }
        }
    }
  });
}

}  // namespace

bool prepacked_serves(DType vt, int64_t M) {
#if defined(__AVX2__)
  return M <= kPrepackedMaxM && (M >= 2 || (M == 1 && vt == DType::i8));
#else
  (void)vt, (void)M;
  return false;
#endif
}

// f(V{}) for the value dtypes the prepacked layout holds (f32, bf16, i8); others are an error naming op.
template <class F> static decltype(auto) with_packed_type(DType vt, const char* op, const F& f) {
  switch (vt) {
    case DType::f32: return f(float{});
    case DType::bf16: return f(bf16{});
    case DType::i8: return f(int8_t{});
    default: SINTER_THROW(DTypeError, "[", op, "] values must be f32, bf16 or i8, got ", vt);
  }
}

int64_t prepacked_bytes(DType vt, int64_t N, int64_t K) {
#if defined(SINTER_TILES16)
  return tiles16_bytes(vt, N, K);
#else
  return with_packed_type(vt, "prepack", [&](auto v) { return (N + 7) / 8 * ((K + 31) / 32) * kBlockBytes<decltype(v)>; });
#endif
}

void prepack(const void* values, DType vt, const uint8_t* meta, int64_t N, int64_t K, uint8_t* out) {
#if defined(SINTER_TILES16)
  tiles16_prepack(values, vt, meta, N, K, out);
#else
  with_packed_type(vt, "prepack", [&](auto v) { prepack_as(static_cast<const decltype(v)*>(values), meta, N, K, out); });
#endif
}

void linear_prepacked_f32(const float* x, int64_t M, int64_t K, const uint8_t* packed, DType vt, const float* scales,
                          const float* bias, Act act, float* y, int64_t N) {
  if (M == 0 || N == 0) return;
#if defined(SINTER_TILES16)
  tiles16_linear(x, M, K, nullptr, vt, nullptr, packed, scales, bias, act, y, N);
#else
  with_packed_type(vt, "sparse24_linear_prepacked", [&](auto v) {
    using V = decltype(v);
#if defined(__AVX2__)
    interleaved<V>(x, M, K, nullptr, nullptr, packed, scales, bias, act, y, N);
#else
    prepacked_rows<V>(x, M, K, packed, scales, bias, act, y, N);
#endif
  });
#endif
}

void linear_f32(const float* x, int64_t M, int64_t K, const void* values, DType vt, const uint8_t* meta, const float* scales,
                const float* bias, Act act, float* y, int64_t N) {
  if (M == 0 || N == 0) return;
  // One choice of kernel by M for every value dtype (the values are widened as the kernel reads them).
  const auto run = [&](const auto* v) {
#if defined(__AVX2__)
    if (M >= kKMajorM) return k_major<KmVec, kKmPanelVecs, 8>(x, M, K, v, meta, scales, bias, act, y, N);
#if defined(SINTER_TILES16)
    if (M > kSmallM) return tiles16_linear(x, M, K, v, vt, meta, nullptr, scales, bias, act, y, N);
#else
    if (M > kSmallM) return interleaved(x, M, K, v, meta, nullptr, scales, bias, act, y, N);
#endif
#endif
    small_m(x, M, K, v, meta, scales, bias, act, y, N);
  };
  switch (vt) {
    case DType::f32: return run(static_cast<const float*>(values));
    case DType::bf16: return run(static_cast<const bf16*>(values));
    case DType::i8: return run(static_cast<const int8_t*>(values));
    default: return plain_rows(x, M, K, [&](int64_t i) { return value_at(values, vt, i); }, meta, scales, bias, act, y, N);
  }
}

bool pairs_beat_prepacked(int64_t M) {
#if defined(SINTER_TILES16)
  (void)M;
  return false;  // the prepacked tiles read bf16 x with vdpbf16ps too (tiles16_linear_bf16)
#else
  return M <= kPairsM || M >= kPairsPrepackedM;
#endif
}

bool pairs_serve(DType x, DType vt, int64_t M) {
#if defined(__AVX512BF16__)
#if defined(SINTER_TILES16)
  return x == DType::bf16 && vt == DType::bf16 && M > kSmallM;
#else
  return x == DType::bf16 && vt == DType::bf16 && M >= kPairsM;
#endif
#else
  (void)x, (void)vt, (void)M;
  return false;
#endif
}

void linear_bf16_pairs(const uint16_t* x, int64_t M, int64_t K, const uint16_t* values, const uint8_t* meta, const float* scales,
                       const float* bias, Act act, float* y, int64_t N) {
#if defined(__AVX512BF16__)
#if defined(SINTER_TILES16)
  if (M > kPairsM) return tiles16_linear_bf16(x, M, K, values, meta, nullptr, scales, bias, act, y, N);
#endif
  if (M > 0 && N > 0) k_major_pairs(x, M, K, values, meta, scales, bias, act, y, N);
#else
  (void)x, (void)M, (void)K, (void)values, (void)meta, (void)scales, (void)bias, (void)act, (void)y, (void)N;
  SINTER_THROW(Error, "[sparse24_linear] the bf16 pairs kernel needs AVX512-BF16");
#endif
}

void linear_f64(const double* x, int64_t M, int64_t K, const double* values, const uint8_t* meta, const float* scales,
                const double* bias, Act act, double* y, int64_t N) {
  plain_rows(x, M, K, [&](int64_t i) { return values[i]; }, meta, scales, bias, act, y, N);
}

template <class T> void to_dense(const void* values, DType vt, const uint8_t* meta, const float* scales, int64_t N, int64_t K, T* out) {
  const int64_t K2 = K / 2, K8 = K / 8;
  parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      T* row = out + n * K;
      std::fill(row, row + K, T(0));
      for (int64_t b = 0; b < K8; ++b) {
        int off[4];
        byte_offsets(meta[n * K8 + b], off);
        for (int t = 0; t < 4; ++t) {
          const int64_t i = n * K2 + 4 * b + t;
          const T v = vt == DType::f64 ? T(static_cast<const double*>(values)[i]) : T(value_at(values, vt, i));
          row[8 * b + off[t]] += v * T(scales[n]);  // a column named twice (meta a reader may hand us) adds up, as in every product
        }
      }
    }
  });
}

template <class T> void gather_kept(const T* dense, const uint8_t* meta, int64_t N, int64_t K, T* kept) {
  const int64_t K2 = K / 2, K8 = K / 8;
  parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t b = 0; b < K8; ++b) {
        int off[4];
        byte_offsets(meta[n * K8 + b], off);
        for (int t = 0; t < 4; ++t) kept[n * K2 + 4 * b + t] = dense[n * K + 8 * b + off[t]];
      }
  });
}

template void to_dense<float>(const void*, DType, const uint8_t*, const float*, int64_t, int64_t, float*);
template void to_dense<double>(const void*, DType, const uint8_t*, const float*, int64_t, int64_t, double*);
template void gather_kept<float>(const float*, const uint8_t*, int64_t, int64_t, float*);
template void gather_kept<double>(const double*, const uint8_t*, int64_t, int64_t, double*);

}  // namespace sinter::sparse

#pragma once
// Helpers the 2:4 kernel families share (streaming, tiles8, k_major, pairs, choose.cpp): kept
// values as f32, 8-float vectors, the 8-row tile layout, and the plain row-by-row product. Every
// name here is internal to src/cpu/sparse24/.
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
#include "cpu/sparse24/kernels.h"

namespace sinter::sparse {
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
#if defined(__AVX2__)
template <> SINTER_INLINE v8f load_values<bf16>(const bf16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return (v8f)_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);  // the bf16 bits are the high half of an f32
}
template <> SINTER_INLINE v8f load_values<int8_t>(const int8_t* p) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return (v8f)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
}
#else
template <> SINTER_INLINE v8f load_values<bf16>(const bf16* p) {
  v8s s;
  std::memcpy(&s, p, 16);
  return (v8f)(__builtin_convertvector(s, v8i) << 16);
}
template <> SINTER_INLINE v8f load_values<int8_t>(const int8_t* p) {
  v8c c;
  std::memcpy(&c, p, 8);
  return __builtin_convertvector(__builtin_convertvector(c, v8i), v8f);
}
#endif

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
inline const PermuteTable& permute_table() {
  static const PermuteTable t;
  return t;
}

// The eight kept columns of x[16c, 16c + 16) for meta bytes b0 (lanes 0-3) and b1 (lanes 4-7).
#if defined(__clang__)  // clang's shufflevector takes constant indices only
SINTER_INLINE v8f gather16(const float* x16, v8i idx) {
  v8f r;
  for (int l = 0; l < 8; ++l) r[l] = x16[idx[l]];
  return r;
}
#else
SINTER_INLINE v8f gather16(const float* x16, v8i idx) { return __builtin_shuffle(load8f(x16), load8f(x16 + 8), idx); }
#endif

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
// How the streaming kernel requests what it reads next: non-temporal on AMD Zen, where kPf was
// tuned that way; into every cache level elsewhere. On an Intel Xeon, a 4096 x 11008 f32 weight at
// M = 1 takes 7.8 ms with non-temporal requests (0.64x dense) and 1.7 ms with T0.
#if defined(__znver1__) || defined(__znver2__) || defined(__znver3__) || defined(__znver4__) || defined(__znver5__)
constexpr int kPfLocality = 0;
#else
constexpr int kPfLocality = 3;
#endif


// The 8-row tile layout (kernels.h): a block of 8 weight rows x 32 columns is 8 meta words (u32,
// one per row: its 4 meta bytes), then the 16 kept values of each row interleaved (value j of row r
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

// f(n0, q, at) for every block of an 8-row prepacked weight (its first row n0, column block q, byte
// offset at), chunks split over the threads: the one walk packing and unpacking share.
template <class V, class F> void each_block8(int64_t N, int64_t K, const F& f) {
  const int64_t Q = (K + 31) / 32, chunk = 8 * kTilesRowGroups;
  parallel_for(0, (N + chunk - 1) / chunk, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t ch = c0; ch < c1; ++ch) {
      const int64_t groups = std::min(kTilesRowGroups, (N - ch * chunk + 7) / 8);
      for (int64_t b = 0; b < groups; ++b)
        for (int64_t q = 0; q < Q; ++q) {
          const int64_t q0 = q / kTilesQb * kTilesQb;
          f(ch * chunk + 8 * b, q, prepacked_at<V>(N, K, ch, b, q0) + (q - q0) * kBlockBytes<V>);
        }
    }
  });
}

// f(V{}) for the value dtypes the kernels and the prepacked layout hold (f32, bf16, i8); others are
// an error naming op.
template <class F> decltype(auto) with_value_type(DType vt, const char* op, const F& f) {
  switch (vt) {
    case DType::f32: return f(float{});
    case DType::bf16: return f(bf16{});
    case DType::i8: return f(int8_t{});
    default: SINTER_THROW(DTypeError, "[", op, "] values must be f32, bf16 or i8, got ", vt);
  }
}


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

}  // namespace
}  // namespace sinter::sparse

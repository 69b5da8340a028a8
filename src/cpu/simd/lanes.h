#pragma once
// Row reductions with independent partial sums ("lanes"): the compiler vectorizes them without
// -ffast-math, because no addition is reordered within a lane. 16 lanes = two AVX2 or one AVX-512
// register of floats. Also: one register of floats widened from bf16.
#include <cstdint>
#include <cstring>
#if defined(__AVX__)
#include <immintrin.h>
#endif
#include <limits>
#include <type_traits>
#include <utility>

#include "ops/scalar_fns.h"
#include "sinter/dtype.h"

namespace sinter::cpu::simd {

constexpr int kLanes = 16;
#ifdef __AVX512F__
constexpr int kVectorBytes = 64;
#else
constexpr int kVectorBytes = 32;
#endif

// sum over i in [0, n) of f(i)
template <class C, class F> SINTER_INLINE C lane_sum(int64_t n, F&& f) {
  C acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += f(i + l);
  for (int l = 0; i < n; ++i, ++l) acc[l] += f(i);
  C s = 0;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

// max over i in [0, n) of f(i) (-inf for n = 0; NaNs are skipped here and surface in what follows).
template <class C, class F> SINTER_INLINE C lane_max(int64_t n, F&& f) {
  C m = -std::numeric_limits<C>::infinity();
  for (int64_t i = 0; i < n; ++i) {
    const C v = f(i);
    m = v > m ? v : m;
  }
  return m;
}

// The same over a contiguous array, vectorized: a lane-wise `v > acc ? v : acc` on scalars is not
// turned into vmaxps without -ffinite-math-only; on GCC vector types it is.
// The vector is one machine register wide: wider ones are split through the stack by GCC.
template <class C> SINTER_INLINE C max_of(const C* p, int64_t n) {
  constexpr int lanes = kVectorBytes / int(sizeof(C));
  typedef C vec __attribute__((vector_size(kVectorBytes)));
  vec acc;
  for (int l = 0; l < lanes; ++l) acc[l] = -std::numeric_limits<C>::infinity();
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    vec v;
    std::memcpy(&v, p + i, sizeof v);
    acc = v > acc ? v : acc;
  }
  C m = lane_max<C>(n - i, [&](int64_t j) { return p[i + j]; });
  for (int l = 0; l < lanes; ++l) m = acc[l] > m ? acc[l] : m;
  return m;
}

// The first max (Max) or min of p[0, n < 2^31) and its index, NaNs skipped ({-inf or inf, 0} where
// all are), and whether one was NaN. Each lane keeps its extreme and where it first saw it, in two
// sets of registers (even and odd vectors: each compare-and-blend chain waits on itself, so one set
// ran at its latency); the lanes' extremes then meet, the smallest index among equals winning.
template <bool Max, class C> SINTER_INLINE std::pair<C, int64_t> arg_extreme(const C* p, int64_t n, bool& nan) {
  constexpr int lanes = kVectorBytes / int(sizeof(C));
  constexpr C none = Max ? -std::numeric_limits<C>::infinity() : std::numeric_limits<C>::infinity();
  using I = std::conditional_t<sizeof(C) == 4, int32_t, int64_t>;
  typedef C vec __attribute__((vector_size(kVectorBytes)));
  typedef I ivec __attribute__((vector_size(kVectorBytes)));
  vec acc[2];
  ivec at[2] = {}, cur, bad = {};
  for (int l = 0; l < lanes; ++l) acc[0][l] = acc[1][l] = none, cur[l] = I(l);
  int64_t i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes, cur += I(2 * lanes)) {
    for (int k = 0; k < 2; ++k) {
      vec v;
      std::memcpy(&v, p + i + k * lanes, sizeof v);
      bad |= v != v;  // all ones in a lane that saw a NaN
      const auto better = Max ? v > acc[k] : v < acc[k];
      acc[k] = better ? v : acc[k];
      at[k] = better ? cur + I(k * lanes) : at[k];
    }
  }
  C m = none;
  int64_t mi = 0;
  nan = false;
  auto take = [&](C v, int64_t j) {
    if ((Max ? v > m : v < m) || (v == m && j < mi)) m = v, mi = j;
  };
  for (int l = 0; l < lanes; ++l) nan = nan || bad[l] != 0, take(acc[0][l], at[0][l]), take(acc[1][l], at[1][l]);
  for (; i < n; ++i) nan = nan || p[i] != p[i], take(p[i], i);
  return {m, mi};
}

// sum of a contiguous array in register-wide vectors (two accumulators for the add latency)
template <class C> SINTER_INLINE C sum_of(const C* p, int64_t n) {
  constexpr int lanes = kVectorBytes / int(sizeof(C));
  typedef C vec __attribute__((vector_size(kVectorBytes)));
  vec a0 = {}, a1 = {};
  int64_t i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    vec v0, v1;
    std::memcpy(&v0, p + i, sizeof v0);
    std::memcpy(&v1, p + i + lanes, sizeof v1);
    a0 += v0, a1 += v1;
  }
  a0 += a1;
  C s = 0;
  for (int l = 0; l < lanes; ++l) s += a0[l];
  for (; i < n; ++i) s += p[i];
  return s;
}

// max of a row of T seen as C: vectorized when no conversion is needed.
template <class C, class T> SINTER_INLINE C row_max(const T* p, int64_t n) {
  if constexpr (std::is_same_v<T, C>) return max_of(p, n);
  else return lane_max<C>(n, [&](int64_t i) { return C(p[i]); });
}

// out[i] = b[i] * s with non-temporal stores where the CPU has them (out 32-byte aligned, n a
// multiple of 8); call stream_fence() before another thread reads out.
SINTER_INLINE void scale_stream(const float* b, float s, float* out, int64_t n) {
#if defined(__AVX__)
  const __m256 sv = _mm256_set1_ps(s);
  for (int64_t i = 0; i < n; i += 8) _mm256_stream_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(b + i), sv));
#else
  for (int64_t i = 0; i < n; ++i) out[i] = b[i] * s;
#endif
}
SINTER_INLINE void stream_fence() {
#if defined(__AVX__)
  _mm_sfence();
#endif
}

// One register of f32 (kVectorBytes / 4 lanes) from as many bf16 at p: bf16 is the high half of
// an f32, so a shift widens it exactly (the few-row GEMM's bf16 weights, flash decode's K and V).
typedef float f32reg __attribute__((vector_size(kVectorBytes)));
// Where built, a zero-extend and a shift in intrinsics: GCC's generic vector conversion compiles to a
// longer sequence (flash decode 20% slower with it, Intel Xeon).
SINTER_INLINE f32reg widen_bf16(const bf16* p) {
#if defined(__AVX512F__)
  return (f32reg)_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16);
#elif defined(__AVX2__)
  return (f32reg)_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16);
#else
  constexpr int lanes = kVectorBytes / 4;
  typedef uint16_t hvec __attribute__((vector_size(lanes * 2)));
  typedef uint32_t uvec __attribute__((vector_size(lanes * 4)));
  hvec h;
  std::memcpy(&h, p, sizeof h);
  return (f32reg)(__builtin_convertvector(h, uvec) << 16);
#endif
}

// One register of doubles from as many floats, doubles or bf16 at p.
template <class TV, class DV, class T> SINTER_INLINE DV widen_f64(const T* p) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) return (DV)_mm512_cvtps_pd(_mm256_loadu_ps(p));
#endif
  if constexpr (std::is_same_v<T, bf16>) {  // the high half of an f32: a shift widens it exactly (sum_f64 without AVX-512)
    static_assert(sizeof(DV) == kVectorBytes, "one register of doubles");
    typedef uint16_t hv __attribute__((vector_size(kVectorBytes / 4)));
    typedef uint32_t uv __attribute__((vector_size(kVectorBytes / 2)));
    typedef float fv __attribute__((vector_size(kVectorBytes / 2)));
    hv h;
    std::memcpy(&h, p, sizeof h);
    return __builtin_convertvector((fv)(__builtin_convertvector(h, uv) << 16), DV);
  } else {
    TV v;
    std::memcpy(&v, p, sizeof v);
    return __builtin_convertvector(v, DV);
  }
}

// One register of f32 from as many floats or bf16 at p.
template <class T> SINTER_INLINE f32reg load_f32(const T* p) {
  if constexpr (std::is_same_v<T, bf16>) {
    return widen_bf16(p);
  } else {
    f32reg v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
}

// sum of p[0, n) of floats or bf16 in blocks of 16 registers: each lane adds its 16 values in f32
// (four chains of four adds; within 2^-20 of their magnitude), and the block's sum goes on in
// double. Converting every value to double bound the loop on the conversions (half of PyTorch's
// float sum on a Zen 3). Returns the double sum of the whole blocks; *done = the values they cover.
template <class T> SINTER_INLINE double sum_f32_blocks(const T* p, int64_t n, int64_t* done) {
  constexpr int lanes = kVectorBytes / 4;
  typedef double dvec __attribute__((vector_size(kVectorBytes)));
  typedef float fhalf __attribute__((vector_size(kVectorBytes / 2)));
  dvec a0 = {}, a1 = {};
  int64_t i = 0;
  for (; i + 16 * lanes <= n; i += 16 * lanes) {
    f32reg s0 = load_f32(p + i), s1 = load_f32(p + i + lanes), s2 = load_f32(p + i + 2 * lanes), s3 = load_f32(p + i + 3 * lanes);
    for (int k = 4; k < 16; k += 4) {
      s0 += load_f32(p + i + k * lanes), s1 += load_f32(p + i + (k + 1) * lanes);
      s2 += load_f32(p + i + (k + 2) * lanes), s3 += load_f32(p + i + (k + 3) * lanes);
    }
    s0 = (s0 + s1) + (s2 + s3);
    fhalf lo, hi;
    std::memcpy(&lo, &s0, sizeof lo);
    std::memcpy(&hi, reinterpret_cast<const char*>(&s0) + sizeof lo, sizeof hi);
    a0 += __builtin_convertvector(lo, dvec), a1 += __builtin_convertvector(hi, dvec);
  }
  a0 += a1;
  double s = 0;
  for (int l = 0; l < kVectorBytes / 8; ++l) s += a0[l];
  *done = i;
  return s;
}

// The sum (or product) of p[0, n) of floats, doubles or bf16 in double, in four registers of
// doubles (vector types keep them in registers; an array of them lives on the stack at -O2).
template <bool Prod, class T> SINTER_INLINE double fold_f64(const T* p, int64_t n) {
  constexpr int lanes = kVectorBytes / 8;
  typedef double dvec __attribute__((vector_size(kVectorBytes)));
  typedef std::conditional_t<std::is_same_v<T, bf16>, uint16_t, T> E;  // a vector of structs is no vector
  typedef E tvec __attribute__((vector_size(lanes * sizeof(T))));
  constexpr double init = Prod ? 1.0 : 0.0;
  dvec a0 = dvec{} + init, a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 4 * lanes <= n; i += 4 * lanes) {
    const dvec v0 = widen_f64<tvec, dvec>(p + i), v1 = widen_f64<tvec, dvec>(p + i + lanes);
    const dvec v2 = widen_f64<tvec, dvec>(p + i + 2 * lanes), v3 = widen_f64<tvec, dvec>(p + i + 3 * lanes);
    if constexpr (Prod) a0 *= v0, a1 *= v1, a2 *= v2, a3 *= v3;
    else a0 += v0, a1 += v1, a2 += v2, a3 += v3;
  }
  if constexpr (Prod) a0 *= a1, a2 *= a3, a0 *= a2;
  else a0 += a1, a2 += a3, a0 += a2;
  double s = init;
  for (int l = 0; l < lanes; ++l) s = Prod ? s * a0[l] : s + a0[l];
  for (; i < n; ++i) s = Prod ? s * double(p[i]) : s + double(p[i]);
  return s;
}

// sum of p[0, n) of floats, doubles or bf16, in double: floats and bf16 first in sum_f32_blocks.
template <class T> SINTER_INLINE double sum_f64(const T* p, int64_t n) {
  if constexpr (std::is_same_v<T, double>) {
    return fold_f64<false>(p, n);
  } else {
    int64_t done = 0;
    const double s = sum_f32_blocks(p, n, &done);
    return s + fold_f64<false>(p + done, n - done);
  }
}

// lane_sum of K (1 or 4) rows of floats at once, each row's sum in lane_sum's order (the same
// bits): the rows' adds are independent chains, where one row alone waits out the add latency every
// kLanes elements. vec(k, i): row k's terms i .. i + W - 1 as one f32reg (W = kVectorBytes / 4 lanes,
// i a multiple of W); one(k, i): term i alone (the last n % 16). A row's 16 lanes are one register
// (AVX-512) or two, each a named variable: an array of them is kept on the stack at -O2.
template <int K, class V, class O> SINTER_INLINE void lane_sums(int64_t n, V&& vec, O&& one, float (&s)[K]) {
  static_assert(kLanes == 16 && (K == 1 || K == 4), "16 lanes, one or four rows");
  constexpr int W = kVectorBytes / 4;
  f32reg a0 = {}, b0 = {}, a1 = {}, b1 = {}, a2 = {}, b2 = {}, a3 = {}, b3 = {};  // row k: lanes [0, W), [W, 16)
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    a0 += vec(0, i);
    if constexpr (W < 16) b0 += vec(0, i + W);
    if constexpr (K == 4) {
      a1 += vec(1, i), a2 += vec(2, i), a3 += vec(3, i);
      if constexpr (W < 16) b1 += vec(1, i + W), b2 += vec(2, i + W), b3 += vec(3, i + W);
    }
  }
  float acc[K][kLanes];
  const auto put = [](float* lanes, f32reg lo, f32reg hi) {
    std::memcpy(lanes, &lo, sizeof lo);
    if constexpr (W < 16) std::memcpy(lanes + W, &hi, sizeof hi);
  };
  put(acc[0], a0, b0);
  if constexpr (K == 4) put(acc[1], a1, b1), put(acc[2], a2, b2), put(acc[3], a3, b3);
  for (int l = 0; i < n; ++i, ++l)
    for (int k = 0; k < K; ++k) acc[k][l] += one(k, i);
  for (int k = 0; k < K; ++k) {
    float t = 0;
    for (int l = 0; l < kLanes; ++l) t += acc[k][l];
    s[k] = t;
  }
}
typedef float f32x16 __attribute__((vector_size(64)));
SINTER_INLINE f32x16 load16(const float* p) { f32x16 v; std::memcpy(&v, p, sizeof v); return v; }
SINTER_INLINE f32x16 load16(const bf16* p) {
  f32x16 v;
#if defined(__AVX512F__)
  v = widen_bf16(p);
#else  // two registers of eight
  const f32reg lo = widen_bf16(p), hi = widen_bf16(p + 8);
  std::memcpy(&v, &lo, sizeof lo), std::memcpy(reinterpret_cast<char*>(&v) + sizeof lo, &hi, sizeof hi);
#endif
  return v;
}

}  // namespace sinter::cpu::simd

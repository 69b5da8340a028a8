#pragma once
// Sixteen bf16 to and from two AVX2 registers of floats. Widening is exact (bf16 is an f32's high
// half); narrowing rounds as bf16(float) does (to nearest even, a NaN stays a quiet NaN with its sign
// and high payload), so these give the bits the scalar conversion gives.
// unpack16 / pack16 keep AVX2's in-lane order (`lo` holds elements 0-3 and 8-11, `hi` 4-7 and
// 12-15): no lane-crossing shuffle either way, for elementwise work where the order does not matter.
#if defined(__AVX2__)
#include <immintrin.h>

#include "ops/scalar_fns.h"
#include "sinter/dtype.h"

namespace sinter::cpu::simd {

// bf16(f).bits in each 32-bit lane
SINTER_INLINE __m256i bf16_bits(__m256 f) {
  const __m256i u = _mm256_castps_si256(f), hi = _mm256_srli_epi32(u, 16);
  const __m256i bias = _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(hi, _mm256_set1_epi32(1)));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
  const __m256i quiet = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(rounded, quiet, _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q)));
}

SINTER_INLINE void unpack16(const bf16* p, __m256& lo, __m256& hi) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), zero = _mm256_setzero_si256();
  lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, h));
  hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, h));
}
SINTER_INLINE void pack16(bf16* p, __m256 lo, __m256 hi) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_packus_epi32(bf16_bits(lo), bf16_bits(hi)));
}
// elements 0-7 in a, 8-15 in b
SINTER_INLINE void narrow16(bf16* p, __m256 a, __m256 b) {
  const __m256i packed = _mm256_packus_epi32(bf16_bits(a), bf16_bits(b));  // a0-3 b0-3 a4-7 b4-7
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_permute4x64_epi64(packed, 0xd8));
}

}  // namespace sinter::cpu::simd
#endif

#pragma once
// The flash kernels' register type (GCC vector types, one register wide) and their softmax
// exponential 2^t for t <= 0, shared by the f32 kernels (flash_tiles.h) and the AMX forward.
#include <cstring>

#include "cpu/simd/lanes.h"

namespace sinter::detail {
namespace {

typedef float fvec __attribute__((vector_size(cpu::simd::kVectorBytes)));
typedef int32_t ivec __attribute__((vector_size(cpu::simd::kVectorBytes)));

SINTER_INLINE fvec vmax(fvec a, fvec b) { return a > b ? a : b; }

// The f32 kernels keep scores in log2 units (q scaled by scale * log2(e) as it is laid out), so
// the softmax's exponentials are 2^t: n = round(t), f = t - n in [-1/2, 1/2], 2^f = 1 + f q(f)
// with q of degree 5 (fitted to 2^f's relative error: 2e-9, plus f32 rounding: ~1.5 ulp), and
// 2^n put in the exponent. That is 3 ops of range reduction where e^x takes 4 (n ln2 in two
// parts) and 6 of polynomial where e^r takes 8: the exponentials are a third of the forward's
// work. t < -126 (and -inf) gives 0.
constexpr float kLog2e = 1.44269504088896341f, kLn2 = 0.693147180559945309f;
SINTER_INLINE fvec exp2_reduced(fvec f) {
  fvec q = f * 1.5353724302e-4f + 1.3398868032e-3f;
  q = q * f + 9.6184359863e-3f;
  q = q * f + 5.5503323674e-2f;
  q = q * f + 2.4022647738e-1f;
  q = q * f + 6.9314718246e-1f;
  return q * f + 1.0f;
}
#if defined(__AVX512F__)
SINTER_INLINE fvec vexp2_nonpos(fvec t) {
  const __mmask16 keep = _mm512_cmp_ps_mask((__m512)t, _mm512_set1_ps(-126.0f), _CMP_NLT_UQ);  // NaN stays NaN
  const fvec n = (t + 12582912.0f) - 12582912.0f;  // round to nearest (|t| < 2^22)
  return (fvec)_mm512_maskz_scalef_ps(keep, (__m512)exp2_reduced(t - n), (__m512)n);
}
#else
SINTER_INLINE fvec vexp2_nonpos(fvec t) {
  const ivec underflow = t < -126.0f;
  t = underflow ? fvec{} - 126.0f : t;  // (t * 0 would be NaN at -inf)
  const fvec shifted = t + 12582912.0f, n = shifted - 12582912.0f;
  const ivec pb = (ivec)exp2_reduced(t - n) + (((ivec)shifted - 0x4B400000) << 23);  // p 2^n, n in [-126, 0]
  return underflow ? fvec{} : (fvec)pb;
}
#endif

}  // namespace
}  // namespace sinter::detail

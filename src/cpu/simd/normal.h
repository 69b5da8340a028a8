#pragma once
// Random draws a register at a time: Philox4x32-10 over a batch of consecutive blocks (the same
// numbers as core/philox.h's philox_block), and Box-Muller's log, sin and cos in double on GCC
// vector types with fdlibm's polynomials (FreeBSD msun's e_log.c here; k_sin.c and k_cos.c as
// ops/scalar_fns.h has them; < 1 ulp), kept to the arguments the draws produce: log over
// [2^-32, 1], sin and cos over [0, 2π).
#include <bit>
#include <cstdint>
#include <cstring>

#include "cpu/simd/lanes.h"
#include "ops/scalar_fns.h"

namespace sinter::cpu::simd {

typedef double vdouble __attribute__((vector_size(kVectorBytes)));
typedef int64_t vint64 __attribute__((vector_size(kVectorBytes)));
constexpr int kDoubles = kVectorBytes / 8;

typedef uint64_t vuint64 __attribute__((vector_size(kVectorBytes)));
typedef uint32_t vuint32 __attribute__((vector_size(kVectorBytes / 2)));

// (a mod 2^32) * m in each 64-bit lane: one vpmuludq.
SINTER_INLINE vuint64 mul_low32(vuint64 a, uint32_t m) {
#if defined(__AVX512F__)
  return std::bit_cast<vuint64>(_mm512_mul_epu32(std::bit_cast<__m512i>(a), _mm512_set1_epi64(m)));
#elif defined(__AVX2__)
  return std::bit_cast<vuint64>(_mm256_mul_epu32(std::bit_cast<__m256i>(a), _mm256_set1_epi64x(m)));
#else
  return (a & 0xffffffffu) * uint64_t(m);
#endif
}

// Philox's state for a register of blocks, a word to a 64-bit lane.
struct PhiloxLanes {
  vuint64 c0, c1, c2, c3;
  SINTER_INLINE void round(uint64_t k0, uint64_t k1) {
    const vuint64 p0 = mul_low32(c0, 0xD2511F53u), p1 = mul_low32(c2, 0xCD9E8D57u);
    c0 = (p1 >> 32) ^ c1 ^ k0;
    c1 = p1 & 0xffffffffu;
    c2 = (p0 >> 32) ^ c3 ^ k1;
    c3 = p0 & 0xffffffffu;
  }
};

// out[j][b] = output j of Philox block (seed, counter + b), b < B: the registers of blocks go
// through each round together (one alone would wait on its multiply's latency).
template <int B> SINTER_INLINE void philox_lanes(uint64_t seed, uint64_t counter, uint32_t (&out)[4][B]) {
  constexpr int L = kVectorBytes / 8, G = B / L;
  static_assert(B % L == 0);
  PhiloxLanes s[G] = {};
  for (int g = 0; g < G; ++g) {
    for (int l = 0; l < L; ++l) {
      const uint64_t c = counter + uint64_t(g * L + l);
      s[g].c0[l] = c & 0xffffffffu, s[g].c1[l] = c >> 32;
    }
  }
  uint64_t k0 = uint32_t(seed), k1 = seed >> 32;
  for (int r = 0; r < 10; ++r) {
    for (int g = 0; g < G; ++g) s[g].round(k0, k1);
    k0 = uint32_t(k0 + 0x9E3779B9u), k1 = uint32_t(k1 + 0xBB67AE85u);
  }
  for (int g = 0; g < G; ++g) {
    const vuint32 w0 = __builtin_convertvector(s[g].c0, vuint32), w1 = __builtin_convertvector(s[g].c1, vuint32);
    const vuint32 w2 = __builtin_convertvector(s[g].c2, vuint32), w3 = __builtin_convertvector(s[g].c3, vuint32);
    std::memcpy(&out[0][g * L], &w0, sizeof w0), std::memcpy(&out[1][g * L], &w1, sizeof w1);
    std::memcpy(&out[2][g * L], &w2, sizeof w2), std::memcpy(&out[3][g * L], &w3, sizeof w3);
  }
}

// double(p[l]) for kDoubles words at p (zero-extended into 2^52's mantissa: no per-lane conversion).
SINTER_INLINE vdouble words_to_double(const uint32_t* p) {
  vuint32 w;
  std::memcpy(&w, p, sizeof w);
  const vuint64 wide = __builtin_convertvector(w, vuint64);
  return std::bit_cast<vdouble>(wide | 0x4330000000000000ULL) - 4503599627370496.0;
}

// An integer-valued double vector from integers |k| < 2^51 (by the 1.5 * 2^52 bias; AVX2 has no
// int64 -> double conversion).
SINTER_INLINE vdouble to_double(vint64 k) {
  constexpr double bias = 6755399441055744.0;
  return std::bit_cast<vdouble>(k + std::bit_cast<int64_t>(bias)) - bias;
}

// log(x) for x in [2^-32, 1] (normal, positive, finite: fdlibm's special cases cannot arise).
SINTER_INLINE vdouble log_unit(vdouble x) {
  const vint64 bits = std::bit_cast<vint64>(x);
  vint64 k = (bits >> 52) - 1023;
  vdouble m = std::bit_cast<vdouble>((bits & 0x000fffffffffffffLL) | 0x3ff0000000000000LL);  // [1, 2)
  const vint64 high = m > 1.4142135623730951;  // -1 where true: reduce to [√2/2, √2)
  m = high ? m * 0.5 : m;
  k -= high;
  const vdouble f = m - 1.0, hfsq = 0.5 * f * f, s = f / (2.0 + f), z = s * s, w = z * z, dk = to_double(k);
  const vdouble t1 = w * (3.999999999940941908e-01 + w * (2.222219843214978396e-01 + w * 1.531383769920937332e-01));
  const vdouble t2 = z * (6.666666666666735130e-01 +
                          w * (2.857142874366239149e-01 + w * (1.818357216161805012e-01 + w * 1.479819860511658591e-01)));
  const vdouble R = t2 + t1;
  return dk * 6.93147180369123816490e-01 - ((hfsq - (s * (hfsq + R) + dk * 1.90821492927058770002e-10)) - f);
}

SINTER_INLINE vdouble sqrt(vdouble x) {
#if defined(__AVX512F__)
  return std::bit_cast<vdouble>(_mm512_sqrt_pd(std::bit_cast<__m512d>(x)));
#elif defined(__AVX__)
  return std::bit_cast<vdouble>(_mm256_sqrt_pd(std::bit_cast<__m256d>(x)));
#else
  for (int l = 0; l < kDoubles; ++l) x[l] = __builtin_sqrt(x[l]);
  return x;
#endif
}

// sin(t) and cos(t) for t in [0, 2π]: t - k π/2 (k <= 4) as a head and a tail, then fdlibm's
// kernels with the tail (ops/scalar_fns.h, whose f32 functors use them without).
SINTER_INLINE void sincos_turn(vdouble t, vdouble& sin_out, vdouble& cos_out) {
  const vdouble biased = t * fn::kTwoOverPi + fn::kRoundBias, k = biased - fn::kRoundBias;
  const vint64 n = std::bit_cast<vint64>(biased) & 3;
  const vdouble t1 = t - k * fn::kHalfPi1, p2 = k * fn::kHalfPi2;
  const vdouble hi = t1 - p2, lo = ((t1 - hi) - p2) - k * fn::kHalfPi3;
  const vdouble s = fn::sin_kernel<true>(hi, lo), c = fn::cos_kernel<true>(hi, lo);
  const vint64 odd = (n & 1) != 0, neg_sin = (n & 2) != 0, neg_cos = ((n + 1) & 2) != 0;
  const vdouble sv = odd ? c : s, cv = odd ? s : c;
  sin_out = neg_sin ? -sv : sv;
  cos_out = neg_cos ? -cv : cv;
}

}  // namespace sinter::cpu::simd

#pragma once
// Scalar functors for elementwise ops, included by the CPU kernels (and later by CUDA kernels and
// generated code), so every path computes the same thing. Float versions are branch-free
// polynomials that the compiler vectorizes; double versions call libm (they serve gradchecks).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#ifndef SINTER_HD
#define SINTER_HD
#endif
// Forced inlining: a call left in a kernel loop keeps it from being vectorized.
#define SINTER_INLINE SINTER_HD inline __attribute__((always_inline))

// Whether the float functors use fused multiply-adds (one rounding per a * b + c, half the
// instructions of a polynomial): where the build has FMA instructions. Generated code is told the
// library's choice (src/compiler/jit.cpp), so both compute the same bits.
#ifndef SINTER_FUNCTORS_FMA
#if defined(__FMA__) || defined(__CUDA_ARCH__)
#define SINTER_FUNCTORS_FMA 1
#else
#define SINTER_FUNCTORS_FMA 0
#endif
#endif

namespace sinter::fn {

SINTER_INLINE float bits_to_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// a * b + c for floats and doubles: fused where SINTER_FUNCTORS_FMA (the same result in every
// kernel that uses it).
template <class T> SINTER_INLINE T madd(T a, T b, T c) {
#if SINTER_FUNCTORS_FMA
  if constexpr (std::is_same_v<T, float>) return __builtin_fmaf(a, b, c);
  else return __builtin_fma(a, b, c);
#else
  return a * b + c;
#endif
}

// e^r for |r| <= ln2 / 2: degree-6 polynomial (Cephes), ~1 ulp (Horner steps fused where the
// build has FMA).
SINTER_INLINE float exp_reduced(float r) {
  float p = madd(r, 1.9875691500e-4f, 1.3981999507e-3f);
  p = madd(p, r, 8.3334519073e-3f);
  p = madd(p, r, 4.1665795894e-2f);
  p = madd(p, r, 1.6666665459e-1f);
  p = madd(p, r, 5.0000001201e-1f);
  return madd(p * r, r, r) + 1.0f;
}

// expf: n = round(x / ln2) by the 1.5 * 2^23 trick (the integer lands in the mantissa bits),
// r = x - n ln2 in two parts, degree-6 polynomial, scale by 2^n built from bits. ~1 ulp.
SINTER_INLINE float exp_f32(float x) {
  const bool underflow = x < -87.3f;  // also -inf: exactly 0, as expf
  x = underflow ? -87.3f : (x > 88.8f ? 88.8f : x);  // past ln(FLT_MAX) the product overflows to inf
  const float shifted = madd(x, 1.44269504088896341f, 12582912.0f);
  const float n = shifted - 12582912.0f;
  uint32_t sb;
  std::memcpy(&sb, &shifted, 4);
  const int32_t ni = int32_t(sb - 0x4B400000u);
  const float p = exp_reduced(madd(n, 2.12194440e-4f, madd(n, -0.693359375f, x)));
  const int32_t k = ni > 0 ? 1 : 0;  // 2^n as 2^(n-k) 2^k: n = 128 stays finite
  const float r2 = p * bits_to_float(uint32_t(ni - k + 127) << 23) * bits_to_float(uint32_t(k + 127) << 23);
  return underflow ? 0.0f : r2;
}

// expf for x <= 0 (softmax-style arguments x - max, and the exp(-|u|) of sigmoids): no overflow to
// guard, so 2^n goes straight into the exponent bits. -inf and x < -87.3 give exactly 0.
SINTER_INLINE float exp_nonpos_f32(float x) {
  const bool underflow = x < -87.3f;
  x = underflow ? -87.3f : x;
  const float shifted = madd(x, 1.44269504088896341f, 12582912.0f);
  const float n = shifted - 12582912.0f;
  uint32_t sb;
  std::memcpy(&sb, &shifted, 4);
  float p = exp_reduced(madd(n, 2.12194440e-4f, madd(n, -0.693359375f, x)));
  uint32_t pb;
  std::memcpy(&pb, &p, 4);
  pb += (sb - 0x4B400000u) << 23;  // p * 2^n, n in [-126, 0]
  std::memcpy(&p, &pb, 4);
  return underflow ? 0.0f : p;
}

// tanhf: odd polynomial near zero (no cancellation), 1 - 2/(e^2|x| + 1) elsewhere.
SINTER_INLINE float tanh_f32(float x) {
  const float ax = std::fabs(x), z = x * x;
  const float small = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z +
                        1.33314422036e-1f) * z - 3.33332819422e-1f) * z * x + x;
  const float big = 1.0f - 2.0f / (exp_f32(2.0f * ax) + 1.0f);
  return ax < 0.625f ? small : std::copysign(big, x);
}

// erff: Taylor series near zero (no cancellation); elsewhere Abramowitz & Stegun 7.1.28,
// 1 - (1 + a1 x + ... + a6 x^6)^-16 (|error| < 3e-7): no exp, so it vectorizes cheaply.
SINTER_INLINE float erf_f32(float x) {
  const float ax = std::fabs(x), z = x * x;
  const float small = 1.1283791671f * x *
      madd(z, madd(z, madd(z, madd(z, madd(z, -1.0f / 1320, 1.0f / 216), -1.0f / 42), 1.0f / 10), -1.0f / 3), 1.0f);
  float q = madd(ax, madd(ax, madd(ax, madd(ax, madd(ax, madd(ax, 0.0000430638f, 0.0002765672f), 0.0001520143f), 0.0092705272f),
                                    0.0422820123f), 0.0705230784f), 1.0f);
  q = q * q;
  q = q * q;
  q = q * q;
  q = q * q;  // q^16 (overflows to inf for huge |x|: erf = 1)
  const float big = 1.0f - 1.0f / q;
  return ax < 0.5f ? small : std::copysign(big, x);
}

// logf: x = m 2^e with m in [√2/2, √2) from the bits (subnormals scaled by 2^23 first), log m by
// Cephes' degree-9 polynomial in m - 1 and e ln2 in two parts; ~1 ulp. Branch-free, so it
// vectorizes: 0 gives -inf, x < 0 and NaN NaN, inf inf.
SINTER_INLINE float log_f32(float x) {
  const bool sub = x < 1.17549435e-38f;
  const float y = sub ? x * 8388608.0f : x;
  uint32_t b;
  std::memcpy(&b, &y, 4);
  const float m = bits_to_float((b & 0x007fffffu) | 0x3f000000u);  // [0.5, 1)
  const bool low = m < 0.707106781f;
  const float f = low ? m + m - 1.0f : m - 1.0f;  // exact either way
  const float e = float(int32_t(b >> 23) - (low ? 127 : 126)) - (sub ? 23.0f : 0.0f);
  float p = madd(f, 7.0376836292e-2f, -1.1514610310e-1f);
  p = madd(p, f, 1.1676998740e-1f);
  p = madd(p, f, -1.2420140846e-1f);
  p = madd(p, f, 1.4249322787e-1f);
  p = madd(p, f, -1.6668057665e-1f);
  p = madd(p, f, 2.0000714765e-1f);
  p = madd(p, f, -2.4999993993e-1f);
  p = madd(p, f, 3.3333331174e-1f);
  const float z = f * f;
  float r = madd(e, -2.12194440e-4f, p * f * z);
  r = madd(z, -0.5f, r);
  const float res = madd(e, 0.693359375f, f + r);
  const float special = x == 0.0f ? -INFINITY : (x == INFINITY ? x : NAN);
  return x > 0.0f && x < INFINITY ? res : special;
}

// fdlibm's sin and cos kernels (FreeBSD msun's k_sin.c, k_cos.c) of x + y, x in [-π/4, π/4] and y
// its tail (|y| < ulp(x); Tail false: y = 0, fdlibm's iy = 0 form), over V: double, or a vector of
// doubles (the CPU's random draws, cpu/simd/normal.h). Each < 1 ulp.
template <bool Tail, class V> SINTER_INLINE V sin_kernel(V x, V y) {
  const V z = x * x, w = z * z, v = z * x;
  const V r = 8.33333333332248946124e-03 + z * (-1.98412698298579493134e-04 + z * 2.75573137070700676789e-06) +
              z * w * (-2.50507602534068634195e-08 + z * 1.58969099521155010221e-10);
  if constexpr (Tail) return x - ((z * (0.5 * y - v * r) - y) - v * -1.66666666666666324348e-01);
  else return x + v * (-1.66666666666666324348e-01 + z * r);
}
template <bool Tail, class V> SINTER_INLINE V cos_kernel(V x, V y) {
  const V z = x * x, w = z * z;
  const V r = z * (4.16666666666666019037e-02 + z * (-1.38888888888741095749e-03 + z * 2.48015872894767294178e-05)) +
              w * w * (-2.75573143513906633035e-07 + z * (2.08757232129817482790e-09 + z * -1.13596475577881948265e-11));
  const V hz = 0.5 * z, u = 1.0 - hz;
  if constexpr (Tail) return u + (((1.0 - u) - hz) + (z * r - x * y));
  else return u + (((1.0 - u) - hz) + z * r);
}
// Reduction by π/2: k = round(x * 2/π) by the 1.5 * 2^52 bias (its low bits are k mod 4), and π/2
// in three parts, the first two of 33 bits, so k times each is exact for |k| < 2^20, as is x minus
// k times the first.
inline constexpr double kTwoOverPi = 6.36619772367581382433e-01, kRoundBias = 6755399441055744.0;
inline constexpr double kHalfPi1 = 1.57079632673412561417e+00, kHalfPi2 = 6.07710050630396597660e-11,
                        kHalfPi3 = 2.02226624879595063154e-21;

// sin and cos of x in [-π/4, π/4] for a float result, in double: FreeBSD msun's float kernels
// (k_sinf.c: within 2^-37.5 relative; k_cosf.c: within 2^-34.1), far inside a float's half ulp
// (2^-24), in half the operations of the double kernels above.
SINTER_INLINE double sin_kernel_f32(double x) {
  const double z = x * x, w = z * z, s = z * x;
  const double r = madd(z, 0x16cd878c3b46a7.0p-71, -0x1a00f9e2cae774.0p-65);  // S4 = 2.718e-6, S3 = -1.984e-4
  return madd(s * w, r, madd(s, madd(z, 0x111110896efbb2.0p-59, -0x15555554cbac77.0p-55), x));  // S2, S1
}
SINTER_INLINE double cos_kernel_f32(double x) {
  const double z = x * x, w = z * z;
  const double r = madd(z, 0x199342e0ee5069.0p-68, -0x16c087e80f1e27.0p-62);  // C3 = 2.439e-5, C2 = -1.389e-3
  return madd(w * z, r, madd(w, 0x155553e1053a42.0p-57, madd(z, -0x1ffffffd0c5e81.0p-54, 1.0)));  // C1, C0
}

// sinf and cosf through double for |x| <= 2^19 (kTrigFast): r = x - k π/2 (fused where the build
// fuses), the float kernels, one rounding to float. Branch-free; the functors take libm past 2^19.
inline constexpr float kTrigFast = 524288.0f;
template <bool Cos> SINTER_INLINE float trig_fast_f32(float xf) {
  const double x = xf, biased = madd(x, kTwoOverPi, kRoundBias), k = biased - kRoundBias;
  uint64_t nb;
  std::memcpy(&nb, &biased, 8);
  const double r = madd(k, -kHalfPi3, madd(k, -kHalfPi2, madd(k, -kHalfPi1, x)));
  const double sn = sin_kernel_f32(r), cs = cos_kernel_f32(r);
  const uint64_t n = nb + (Cos ? 1 : 0);  // cos x = sin(x + π/2)
  const double v = (n & 1) ? cs : sn;
  uint64_t bits;  // the sign flipped in quadrants 2 and 3 by an xor (a select of -v, v vectorized worse)
  std::memcpy(&bits, &v, 8);
  bits ^= (n & 2) << 62;
  double signed_v;
  std::memcpy(&signed_v, &bits, 8);
  return float(signed_v);
}

template <class T> SINTER_INLINE T exp_(T x) { if constexpr (std::is_same_v<T, float>) return exp_f32(x); else return std::exp(x); }
template <class T> SINTER_INLINE T exp_nonpos_(T x) { if constexpr (std::is_same_v<T, float>) return exp_nonpos_f32(x); else return std::exp(x); }
template <class T> SINTER_INLINE T tanh_(T x) { if constexpr (std::is_same_v<T, float>) return tanh_f32(x); else return std::tanh(x); }
template <class T> SINTER_INLINE T erf_(T x) { if constexpr (std::is_same_v<T, float>) return erf_f32(x); else return std::erf(x); }

// Unary
struct Neg { template <class T> SINTER_INLINE T operator()(T x) const { return -x; } };
struct Abs { template <class T> SINTER_INLINE T operator()(T x) const { return x < T(0) ? T(-x) : x; } };
struct Exp { template <class T> SINTER_INLINE T operator()(T x) const { return exp_(x); } };
struct Log {
  template <class T> SINTER_INLINE T operator()(T x) const {
    if constexpr (std::is_same_v<T, float>) return log_f32(x);
    else return std::log(x);
  }
};
struct Sqrt { template <class T> SINTER_INLINE T operator()(T x) const { return std::sqrt(x); } };
struct Rsqrt { template <class T> SINTER_INLINE T operator()(T x) const { return T(1) / std::sqrt(x); } };
// sin and cos of floats: `fast` where `fast_ok` (the CPU's loops vectorize it, then redo the rest).
template <bool IsCos> struct Trig {
  static SINTER_INLINE bool fast_ok(float x) { return std::fabs(x) <= kTrigFast; }
  static SINTER_INLINE float fast(float x) { return trig_fast_f32<IsCos>(x); }
  template <class T> SINTER_INLINE T operator()(T x) const {
    if constexpr (std::is_same_v<T, float>) return fast_ok(x) ? fast(x) : float(IsCos ? std::cos(double(x)) : std::sin(double(x)));
    else return IsCos ? std::cos(x) : std::sin(x);
  }
};
struct Sin : Trig<false> {};
struct Cos : Trig<true> {};
struct Tanh { template <class T> SINTER_INLINE T operator()(T x) const { return tanh_(x); } };
// sigmoid(x) from e = exp(-|x|) <= 1 (the cheaper exp, no overflow): 1 / (1 + e) for x >= 0, e / (1 + e) below.
template <class T> SINTER_INLINE T sigmoid_(T x) {
  const T e = exp_nonpos_(-std::fabs(x));
  return (x >= T(0) ? T(1) : e) / (T(1) + e);
}
struct Sigmoid { template <class T> SINTER_INLINE T operator()(T x) const { return sigmoid_(x); } };
struct Relu { template <class T> SINTER_INLINE T operator()(T x) const { return x > T(0) ? x : T(0); } };
struct Gelu {  // exact: x Φ(x)
  template <class T> SINTER_INLINE T operator()(T x) const { return T(0.5) * x * (T(1) + erf_(x * T(0.70710678118654752))); }
};
struct GeluTanh {  // 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = √(2/π)(x + 0.044715 x³): one exp
  template <class T> SINTER_INLINE T operator()(T x) const {
    // sigmoid(z) from e = exp(-|z|) <= 1: 1 / (1 + e) for z >= 0, e / (1 + e) below.
    const T z = T(1.5957691216057308) * (x + T(0.044715) * x * x * x);
    const T e = exp_nonpos_(-std::fabs(z));
    return x * (z >= T(0) ? T(1) : e) / (T(1) + e);
  }
};
struct Silu { template <class T> SINTER_INLINE T operator()(T x) const { return x * sigmoid_(x); } };
struct Erf { template <class T> SINTER_INLINE T operator()(T x) const { return erf_(x); } };

// Binary
struct Add { template <class T> SINTER_INLINE T operator()(T a, T b) const { return a + b; } };
struct Sub { template <class T> SINTER_INLINE T operator()(T a, T b) const { return a - b; } };
struct Mul { template <class T> SINTER_INLINE T operator()(T a, T b) const { return a * b; } };
struct Div { template <class T> SINTER_INLINE T operator()(T a, T b) const { return a / b; } };
struct Pow {
  template <class T> SINTER_INLINE T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      if (b < 0) return a == 1 ? 1 : (a == -1 ? (b % 2 ? -1 : 1) : 0);
      T r = 1;
      for (T e = b, base = a; e > 0; e >>= 1, base = T(base * base)) if (e & 1) r = T(r * base);
      return r;
    } else {
      if (b == T(2)) return a * a;  // x.pow(2), the common case: exact, and no call to the library
      return std::pow(a, b);
    }
  }
};
struct Maximum { template <class T> SINTER_INLINE T operator()(T a, T b) const { return (a != a || a > b) ? a : b; } };
struct Minimum { template <class T> SINTER_INLINE T operator()(T a, T b) const { return (a != a || a < b) ? a : b; } };
struct GeluBackward {  // g (Φ(x) + x φ(x))
  template <class T> SINTER_INLINE T operator()(T g, T x) const {
    return g * (T(0.5) * (T(1) + erf_(x * T(0.70710678118654752))) + x * T(0.3989422804014327) * exp_nonpos_(T(-0.5) * x * x));
  }
};
struct GeluTanhBackward {  // g (s + x s'), s = sigmoid(2u), s' = 2u' s (1 - s)
  template <class T> SINTER_INLINE T operator()(T g, T x) const {
    // s and 1 - s from e = exp(-|2u|), each without cancellation.
    const T z = T(1.5957691216057308) * (x + T(0.044715) * x * x * x);
    const T e = exp_nonpos_(-std::fabs(z)), r = T(1) / (T(1) + e);
    const T s = z >= T(0) ? r : e * r, s1 = z >= T(0) ? e * r : r;
    return g * (s + x * T(1.5957691216057308) * (T(1) + T(0.134145) * x * x) * s * s1);
  }
};
struct SiluBackward {  // g s (1 + x (1 - s)), s = sigmoid(x)
  template <class T> SINTER_INLINE T operator()(T g, T x) const {
    const T e = exp_nonpos_(-std::fabs(x)), r = T(1) / (T(1) + e);
    const T s = x >= T(0) ? r : e * r, s1 = x >= T(0) ? e * r : r;
    return g * s * (T(1) + x * s1);
  }
};
struct Eq { template <class T> SINTER_INLINE bool operator()(T a, T b) const { return a == b; } };
struct Ne { template <class T> SINTER_INLINE bool operator()(T a, T b) const { return a != b; } };
struct Lt { template <class T> SINTER_INLINE bool operator()(T a, T b) const { return a < b; } };
struct Le { template <class T> SINTER_INLINE bool operator()(T a, T b) const { return a <= b; } };
struct Gt { template <class T> SINTER_INLINE bool operator()(T a, T b) const { return a > b; } };
struct Ge { template <class T> SINTER_INLINE bool operator()(T a, T b) const { return a >= b; } };

}  // namespace sinter::fn

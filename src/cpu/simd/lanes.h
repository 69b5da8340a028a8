#pragma once
// Row reductions with independent partial sums ("lanes"): the compiler vectorizes them without
// -ffast-math, because no addition is reordered within a lane. 16 lanes = two AVX2 or one AVX-512
// register of floats.
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "ops/scalar_fns.h"

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

// max of a row of T seen as C: vectorized when no conversion is needed.
template <class C, class T> SINTER_INLINE C row_max(const T* p, int64_t n) {
  if constexpr (std::is_same_v<T, C>) return max_of(p, n);
  else return lane_max<C>(n, [&](int64_t i) { return C(p[i]); });
}

}  // namespace sinter::cpu::simd

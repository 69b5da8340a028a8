#pragma once
// Row reductions with independent partial sums ("lanes"): the compiler vectorizes them without
// -ffast-math, because no addition is reordered within a lane. 16 lanes = two AVX2 or one AVX-512
// register of floats.
#include <cstdint>
#include <limits>

#include "ops/scalar_fns.h"

namespace sinter::cpu::simd {

constexpr int kLanes = 16;

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

// max over i in [0, n) of f(i) (-inf for n = 0; NaNs are skipped here and surface in what follows)
template <class C, class F> SINTER_INLINE C lane_max(int64_t n, F&& f) {
  C acc[kLanes];
  for (int l = 0; l < kLanes; ++l) acc[l] = -std::numeric_limits<C>::infinity();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const C v = f(i + l);
      acc[l] = v > acc[l] ? v : acc[l];
    }
  for (int l = 0; i < n; ++i, ++l) {
    const C v = f(i);
    acc[l] = v > acc[l] ? v : acc[l];
  }
  C m = acc[0];
  for (int l = 1; l < kLanes; ++l) m = acc[l] > m ? acc[l] : m;
  return m;
}

}  // namespace sinter::cpu::simd

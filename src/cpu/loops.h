#pragma once
// The strided N-operand loop every elementwise kernel runs on: broadcast strides, merge dims that
// are contiguous across all operands, thread the outer dims, hand the innermost run to `inner`.
#include <algorithm>
#include <array>
#include <cstdlib>
#include <type_traits>
#include <vector>

#include "core/parallel.h"
#include "core/small_vector.h"
#include "cpu/simd/bf16.h"
#include "ops/scalar_fns.h"
#include "sinter/tensor.h"

namespace sinter::cpu {

// Strides in bytes of `t` broadcast to `shape` (0 along broadcast dims).
using Dims = SmallVector<int64_t, 8>;

inline Dims broadcast_strides_bytes(const Tensor& t, const Shape& shape) {
  Dims s(shape.size(), 0);
  const int64_t off = int64_t(shape.size()) - t.dim();
  for (int64_t i = 0; i < t.dim(); ++i)
    if (t.size(i) != 1) s[size_t(off + i)] = t.stride(i) * t.element_size();
  return s;
}

// Storage types whose elementwise ops compute in floating point.
template <class T> constexpr bool is_half_v = std::is_same_v<T, f16> || std::is_same_v<T, bf16>;
template <class T> constexpr bool is_float_v = std::is_floating_point_v<T> || is_half_v<T>;

inline constexpr int64_t kElementwiseGrain = 32768;

// For half-precision storage (bf16, f16): runs of n elements through float blocks of kHalfBlock,
// widened, computed by `block(float* const* in, float* out, m)` and narrowed in three loops that each
// vectorize; one loop converting inside the functor does not (bf16 SiLU that way: 0.1x PyTorch).
inline constexpr int64_t kHalfBlock = 256;
template <class T, size_t N, class Block>
SINTER_INLINE void through_float_blocks(T* out, std::array<const T*, N> in, int64_t n, Block&& block) {
  float buf[N + 1][kHalfBlock];
  float* ins[N];
  for (size_t k = 0; k < N; ++k) ins[k] = buf[k];
  for (int64_t i0 = 0; i0 < n; i0 += kHalfBlock) {
    const int64_t m = std::min(kHalfBlock, n - i0);
    for (size_t k = 0; k < N; ++k)
      for (int64_t j = 0; j < m; ++j) buf[k][j] = float(in[k][i0 + j]);
    block(ins, buf[N], m);
    int64_t j = 0;
#if defined(__AVX2__)
    if constexpr (std::is_same_v<T, bf16>)  // GCC's vectorized T(float) took a third more instructions
      for (; j + 16 <= m; j += 16) simd::narrow16(out + i0 + j, _mm256_loadu_ps(buf[N] + j), _mm256_loadu_ps(buf[N] + j + 8));
#endif
    for (; j < m; ++j) out[i0 + j] = T(buf[N][j]);
  }
}

// inner(std::array<char*, N> ptrs, std::array<int64_t, N> byte_strides, int64_t n)
template <size_t N, class Inner>
void for_each_strided(const Shape& shape, std::array<char*, N> base, const std::array<Dims, N>& strides,
                      const Inner& inner) {
  const int64_t numel = shape.numel();
  if (numel == 0) return;
  // Visit dims in the order of operand 0's (the output's) strides, largest outermost, so a
  // transposed output is written in memory order; then drop size-1 dims and merge neighbours that
  // are contiguous for every operand.
  Dims order;
  for (size_t d = 0; d < shape.size(); ++d) order.push_back(int64_t(d));
  std::stable_sort(order.data(), order.data() + order.size(),
                   [&](int64_t x, int64_t y) { return std::abs(strides[0][size_t(x)]) > std::abs(strides[0][size_t(y)]); });
  Dims dims;
  std::array<Dims, N> st;
  for (size_t od = 0; od < shape.size(); ++od) {
    const size_t d = size_t(order[od]);
    if (shape[d] == 1) continue;
    bool merge = !dims.empty();
    for (size_t k = 0; k < N && merge; ++k) merge = st[k].back() == strides[k][d] * shape[d];
    if (merge) {
      dims.back() *= shape[d];
      for (size_t k = 0; k < N; ++k) st[k].back() = strides[k][d];
    } else {
      dims.push_back(shape[d]);
      for (size_t k = 0; k < N; ++k) st[k].push_back(strides[k][d]);
    }
  }
  if (dims.empty()) {
    std::array<int64_t, N> zero{};
    inner(base, zero, 1);
    return;
  }
  const size_t nd = dims.size();
  const int64_t n_inner = dims[nd - 1];
  std::array<int64_t, N> inner_stride;
  for (size_t k = 0; k < N; ++k) inner_stride[k] = st[k][nd - 1];
  const int64_t outer = numel / n_inner;
  if (outer == 1) {  // one run: split it across threads
    parallel_for(0, n_inner, kElementwiseGrain, [&](int64_t lo, int64_t hi) {
      std::array<char*, N> p;
      for (size_t k = 0; k < N; ++k) p[k] = base[k] + lo * inner_stride[k];
      inner(p, inner_stride, hi - lo);
    });
    return;
  }
  const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / n_inner);
  parallel_for(0, outer, grain, [&](int64_t lo, int64_t hi) {
    Dims idx(nd - 1, 0);
    int64_t r = lo;
    for (size_t d = nd - 1; d-- > 0;) { idx[d] = r % dims[d]; r /= dims[d]; }
    std::array<char*, N> p;
    for (size_t k = 0; k < N; ++k) {
      p[k] = base[k];
      for (size_t d = 0; d + 1 < nd; ++d) p[k] += idx[d] * st[k][d];
    }
    for (int64_t o = lo; o < hi; ++o) {
      inner(p, inner_stride, n_inner);
      for (size_t d = nd - 1; d-- > 0;) {  // odometer increment of the outer index
        for (size_t k = 0; k < N; ++k) p[k] += st[k][d];
        if (++idx[d] < dims[d]) break;
        for (size_t k = 0; k < N; ++k) p[k] -= st[k][d] * dims[d];
        idx[d] = 0;
      }
    }
  });
}

}  // namespace sinter::cpu

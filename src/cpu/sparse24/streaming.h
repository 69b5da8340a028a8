#pragma once
// The 2:4 decode kernel's pass (M <= kSmallM rows of x; every M without AVX2): one streaming pass
// over the weights in blocks of rows, up to four rows of x at a time. Rows is the ISA's inner
// kernel (streaming_avx2.cpp, streaming_portable.cpp): Rows::rearranged says whether it reads x
// with each 16 columns rearranged, Rows::run<V>(rows, x, xr, K, values, meta, n0, n1, dots).
#include "cpu/sparse24/kernel_common.h"

namespace sinter::sparse {
namespace {

template <class Rows, class V>
void small_m(const float* x, int64_t M, int64_t K, const V* values, const uint8_t* meta, const float* scales, const float* bias,
             Act act, float* y, int64_t N) {
  // Up to four rows of x per pass over a block of weight rows; with more rows the block (at most
  // ~256 KiB of values) is passed again from L2, so memory still sees each weight byte once.
  const int64_t K2 = K / 2, row_bytes = K2 * int64_t(sizeof(V)) + K / 8;
  const int64_t block = M <= 4 ? 64 : std::max<int64_t>(8, (int64_t(256) << 10) / row_bytes);
  Tensor xr_buf;  // x with each 16 columns as [0-3, 8-11, 4-7, 12-15]
  const float* xr = nullptr;
  if constexpr (Rows::rearranged) {
    xr_buf = Tensor::empty({M * K}, DType::f32);
    float* r = xr_buf.data<float>();
    for (int64_t m = 0; m < M; ++m)
      for (int64_t c = 0; c + 16 <= K; c += 16)
        for (int q = 0; q < 4; ++q) std::memcpy(r + m * K + c + 4 * q, x + m * K + c + 4 * ((q & 1) * 2 + (q >> 1)), 16);
    xr = r;
  }
  parallel_for(0, N, std::min<int64_t>(block, 64), [&](int64_t lo, int64_t hi) {
    std::vector<float> dots(static_cast<size_t>(4 * block));
    for (int64_t n0 = lo; n0 < hi; n0 += block) {
      const int64_t n1 = std::min(hi, n0 + block), nb = n1 - n0;
      for (int64_t m0 = 0; m0 < M; m0 += 4) {
        Rows::template run<V>(int(std::min<int64_t>(4, M - m0)), x + m0 * K, xr ? xr + m0 * K : nullptr, K, values, meta, n0, n1,
                              dots.data());
        for (int64_t m = m0; m < std::min(M, m0 + 4); ++m)
          for (int64_t n = n0; n < n1; ++n)
            y[m * N + n] = activate(dots[size_t((m - m0) * nb + n - n0)] * scales[n] + (bias ? bias[n] : 0.0f), act);
      }
    }
  });
}

// The streaming kernel's entry for this ISA's Rows, and its record: decode sizes, or every M
// where no other family of the build serves.
template <class Rows> void run(const Args& a) {
  if (a.M == 0 || a.N == 0) return;
  switch (a.vt) {
    case DType::f32: return small_m<Rows>(a.x, a.M, a.K, static_cast<const float*>(a.values), a.meta, a.scales, a.bias, a.act, a.y, a.N);
    case DType::bf16: return small_m<Rows>(a.x, a.M, a.K, static_cast<const bf16*>(a.values), a.meta, a.scales, a.bias, a.act, a.y, a.N);
    case DType::i8: return small_m<Rows>(a.x, a.M, a.K, static_cast<const int8_t*>(a.values), a.meta, a.scales, a.bias, a.act, a.y, a.N);
    default:
      return plain_rows(a.x, a.M, a.K, [&](int64_t i) { return value_at(a.values, a.vt, i); }, a.meta, a.scales, a.bias, a.act, a.y, a.N);
  }
}

}  // namespace
}  // namespace sinter::sparse

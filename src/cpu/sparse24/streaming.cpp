// 2:4 decode kernel (M <= kSmallM rows of x, and every M without AVX2): one streaming pass over
// the weights, kept columns of x gathered in registers (kernels.h).
#include "cpu/sparse24/kernel_common.h"

namespace sinter::sparse {
namespace {

#if !defined(__AVX2__)
// Decode: y[m, n] for M <= 4 rows of x, weight rows [n0, n1). Each weight row is read once, in
// order, 8 kept values (16 columns) per step; rows are prefetched a few steps ahead.
template <int M, class V>
void small_m_rows(const float* x, int64_t K, const V* values, const uint8_t* meta, int64_t n0, int64_t n1, float* dots) {
  const PermuteTable& pt = permute_table();
  const int64_t chunks = K / 16, K2 = K / 2, K8 = K / 8;
  for (int64_t n = n0; n < n1; ++n) {
    const V* w = values + n * K2;
    const uint8_t* mt = meta + n * K8;
    __builtin_prefetch(mt + 4 * K8, 0, kPfLocality);  // meta: a line per row, four rows ahead
    v8f acc0[M], acc1[M];  // two chains per row of x: the FMA latency is hidden
    for (int m = 0; m < M; ++m) acc0[m] = v8f{}, acc1[m] = v8f{};
    auto idx_of = [&](int64_t c) {
      v8i i0, i1;
      std::memcpy(&i0, pt.idx[mt[2 * c]], 32);
      std::memcpy(&i1, pt.idx[mt[2 * c + 1]], 32);
      return __builtin_shufflevector(i0, i1, 0, 1, 2, 3, 12, 13, 14, 15);
    };
    int64_t c = 0;
    for (; c + 2 <= chunks; c += 2) {
      __builtin_prefetch(reinterpret_cast<const char*>(w + 8 * c) + kPf, 0, kPfLocality);  // values: kPf bytes ahead
      const v8i ia = idx_of(c), ib = idx_of(c + 1);
      const v8f wa = load_values(w + 8 * c), wb = load_values(w + 8 * c + 8);
      for (int m = 0; m < M; ++m) {
        acc0[m] += wa * gather16(x + m * K + 16 * c, ia);
        acc1[m] += wb * gather16(x + m * K + 16 * c + 16, ib);
      }
    }
    float tail[M] = {};
    for (; c < chunks; ++c) {
      const v8i ia = idx_of(c);
      const v8f wa = load_values(w + 8 * c);
      for (int m = 0; m < M; ++m) acc0[m] += wa * gather16(x + m * K + 16 * c, ia);
    }
    if (K % 16) {  // one last meta byte: four kept values over 8 columns
      int off[4];
      byte_offsets(mt[K8 - 1], off);
      for (int t = 0; t < 4; ++t)
        for (int m = 0; m < M; ++m) tail[m] += float(w[K2 - 4 + t]) * x[m * K + K - 8 + off[t]];
    }
    for (int m = 0; m < M; ++m) dots[m * (n1 - n0) + (n - n0)] = hsum(acc0[m] + acc1[m]) + tail[m];
  }
}
#endif

#if defined(__AVX2__)
// The same pass with in-lane permutes (vpermilps, twice the rate of the cross-lane vpermps on
// Zen 3) and no index table: x is rearranged once per call so each 16 columns read as A = [0-3 |
// 8-11] and B = [4-7 | 12-15]; kept value j of a 16-column step sits in the lane j of group j / 2,
// so permuting A and B by the meta bits (value j's offset is bits 2j, 2j+1 of the step's two
// meta bytes, shifted into place) and blending lanes 2, 3, 6, 7 from B gives its x.
// S streams: the block's rows are split into S runs read side by side, so a core keeps more reads
// in flight than one stream gives it (a plain 2-thread read here: 19 / 28 / 38 GB/s with 1 / 2 / 4
// streams per thread; in this kernel, from cold on the three bench shapes, 2 beat 4 for f32 values).
template <int M, int S, class V>
void small_m_rows_lanes(const float* x, const float* xr, int64_t K, const V* values, const uint8_t* meta, int64_t n0, int64_t n1,
                        float* dots) {
  constexpr int U = S == 1 ? 4 : 2;  // 16-column steps per pass: S x U accumulator chains per row of x hide the FMA latency
  const int64_t chunks = K / 16, K2 = K / 2, K8 = K / 8, nb = n1 - n0, run = (nb + S - 1) / S;
  const __m256i sh_a = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14), sh_b = _mm256_setr_epi32(16, 18, 20, 22, 24, 26, 28, 30);
  auto pick = [](const float* xc, __m256i idx) {  // x of 8 kept values from 16 rearranged columns
    return _mm256_blend_ps(_mm256_permutevar_ps(_mm256_loadu_ps(xc), idx), _mm256_permutevar_ps(_mm256_loadu_ps(xc + 8), idx), 0xCC);
  };
  for (int64_t i = 0; i < run; ++i) {
    int64_t row[S];
    const V* w[S];
    const uint8_t* mt[S];
    for (int s = 0; s < S; ++s) {
      row[s] = std::min(n0 + s * run + i, n1 - 1);  // a short last run repeats its last row, unstored
      w[s] = values + row[s] * K2, mt[s] = meta + row[s] * K8;
      __builtin_prefetch(mt[s] + 4 * K8, 0, kPfLocality);
    }
    __m256 acc[S][M][U];
    for (int s = 0; s < S; ++s)
      for (int m = 0; m < M; ++m)
        for (int u = 0; u < U; ++u) acc[s][m][u] = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + U <= chunks; c += U)
      for (int s = 0; s < S; ++s) {
        const char* wb = reinterpret_cast<const char*>(w[s] + 8 * c);
        for (int64_t off = 0; off < int64_t(sizeof(V)) * 8 * U; off += 64) __builtin_prefetch(wb + kPf + off, 0, kPfLocality);
        __m256i idx[U];
        for (int u = 0; u < U; u += 2) {
          int32_t word;  // meta bytes of two 16-column steps
          std::memcpy(&word, mt[s] + 2 * (c + u), 4);
          const __m256i mw = _mm256_set1_epi32(word);
          idx[u] = _mm256_srlv_epi32(mw, sh_a), idx[u + 1] = _mm256_srlv_epi32(mw, sh_b);
        }
        __m256 wv[U];
        for (int u = 0; u < U; ++u) wv[u] = (__m256)load_values(w[s] + 8 * (c + u));
        for (int m = 0; m < M; ++m)
          for (int u = 0; u < U; ++u) acc[s][m][u] = _mm256_fmadd_ps(wv[u], pick(xr + m * K + 16 * (c + u), idx[u]), acc[s][m][u]);
      }
    for (int s = 0; s < S; ++s) {
      if (n0 + s * run + i >= n1) continue;
      for (int64_t cc = c; cc < chunks; ++cc) {  // the last few 16-column steps
        const __m256i ia = _mm256_srlv_epi32(_mm256_set1_epi32(int32_t(mt[s][2 * cc] | mt[s][2 * cc + 1] << 8)), sh_a);
        const __m256 wa = (__m256)load_values(w[s] + 8 * cc);
        for (int m = 0; m < M; ++m) acc[s][m][0] = _mm256_fmadd_ps(wa, pick(xr + m * K + 16 * cc, ia), acc[s][m][0]);
      }
      float tail[M] = {};
      if (K % 16) {  // one last meta byte: four kept values over 8 columns
        int off[4];
        byte_offsets(mt[s][K8 - 1], off);
        for (int t = 0; t < 4; ++t)
          for (int m = 0; m < M; ++m) tail[m] += float(w[s][K2 - 4 + t]) * x[m * K + K - 8 + off[t]];
      }
      for (int m = 0; m < M; ++m) {
        __m256 sum = acc[s][m][0];
        for (int u = 1; u < U; ++u) sum = _mm256_add_ps(sum, acc[s][m][u]);
        dots[m * nb + (row[s] - n0)] = hsum((v8f)sum) + tail[m];
      }
    }
  }
}
#endif

template <class V>
void small_m(const float* x, int64_t M, int64_t K, const V* values, const uint8_t* meta, const float* scales, const float* bias,
             Act act, float* y, int64_t N) {
  // Up to four rows of x per pass over a block of weight rows; with more rows the block (at most
  // ~256 KiB of values) is passed again from L2, so memory still sees each weight byte once.
  const int64_t K2 = K / 2, row_bytes = K2 * int64_t(sizeof(V)) + K / 8;
  const int64_t block = M <= 4 ? 64 : std::max<int64_t>(8, (int64_t(256) << 10) / row_bytes);
#if defined(__AVX2__)
  Tensor xr_buf = Tensor::empty({M * K}, DType::f32);  // x with each 16 columns as [0-3, 8-11, 4-7, 12-15]
  float* xr = xr_buf.data<float>();
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = 0; c + 16 <= K; c += 16)
      for (int q = 0; q < 4; ++q) std::memcpy(xr + m * K + c + 4 * q, x + m * K + c + 4 * ((q & 1) * 2 + (q >> 1)), 16);
#endif
  parallel_for(0, N, std::min<int64_t>(block, 64), [&](int64_t lo, int64_t hi) {
    std::vector<float> dots(static_cast<size_t>(4 * block));
    for (int64_t n0 = lo; n0 < hi; n0 += block) {
      const int64_t n1 = std::min(hi, n0 + block), nb = n1 - n0;
      for (int64_t m0 = 0; m0 < M; m0 += 4) {
        const float* xm = x + m0 * K;
#if defined(__AVX2__)
        const float* xrm = xr + m0 * K;
        switch (std::min<int64_t>(4, M - m0)) {
          // Streams per thread (measured in alternating runs, each after a dense GEMV so every one
          // starts cold): f32 values 2 (8-25% faster than 4 on the three bench shapes, 6 no better),
          // bf16 4 (2 even), int8 1 (bound by the widening, not by the stream).
          case 1: small_m_rows_lanes<1, sizeof(V) == 4 ? 2 : sizeof(V) == 2 ? 4 : 1>(xm, xrm, K, values, meta, n0, n1, dots.data()); break;
          case 2: small_m_rows_lanes<2, sizeof(V) == 1 ? 1 : 2>(xm, xrm, K, values, meta, n0, n1, dots.data()); break;
          case 3: small_m_rows_lanes<3, 1>(xm, xrm, K, values, meta, n0, n1, dots.data()); break;
          default: small_m_rows_lanes<4, 1>(xm, xrm, K, values, meta, n0, n1, dots.data()); break;
        }
#else
        switch (std::min<int64_t>(4, M - m0)) {
          case 1: small_m_rows<1>(xm, K, values, meta, n0, n1, dots.data()); break;
          case 2: small_m_rows<2>(xm, K, values, meta, n0, n1, dots.data()); break;
          case 3: small_m_rows<3>(xm, K, values, meta, n0, n1, dots.data()); break;
          default: small_m_rows<4>(xm, K, values, meta, n0, n1, dots.data()); break;
        }
#endif
        for (int64_t m = m0; m < std::min(M, m0 + 4); ++m)
          for (int64_t n = n0; n < n1; ++n)
            y[m * N + n] = activate(dots[size_t((m - m0) * nb + n - n0)] * scales[n] + (bias ? bias[n] : 0.0f), act);
      }
    }
  });
}

}  // namespace

void run_streaming(const float* x, int64_t M, int64_t K, const void* values, DType vt, const uint8_t* meta, const float* scales,
                   const float* bias, Act act, float* y, int64_t N) {
  if (M == 0 || N == 0) return;
  switch (vt) {
    case DType::f32: return small_m(x, M, K, static_cast<const float*>(values), meta, scales, bias, act, y, N);
    case DType::bf16: return small_m(x, M, K, static_cast<const bf16*>(values), meta, scales, bias, act, y, N);
    case DType::i8: return small_m(x, M, K, static_cast<const int8_t*>(values), meta, scales, bias, act, y, N);
    default: return plain_rows(x, M, K, [&](int64_t i) { return value_at(values, vt, i); }, meta, scales, bias, act, y, N);
  }
}

}  // namespace sinter::sparse

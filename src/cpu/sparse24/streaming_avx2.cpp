// The streaming 2:4 kernel's inner pass on AVX2 (streaming.h): in-lane permutes pick x's kept
// columns, S weight rows read side by side.
#include "cpu/sparse24/streaming.h"

namespace sinter::sparse {

#if defined(__AVX2__)
namespace {

// The same pass with in-lane permutes (vpermilps, twice the rate of the cross-lane vpermps on
// Zen 3) and no index table: x is rearranged once per call so each 16 columns read as A = [0-3 |
// 8-11] and B = [4-7 | 12-15]; kept value j of a 16-column step sits in the lane j of group j / 2,
// so permuting A and B by the meta bits (value j's offset is bits 2j, 2j+1 of the step's two
// meta bytes, shifted into place) and blending lanes 2, 3, 6, 7 from B gives its x.
// S streams: the block's rows are split into S runs read side by side, so a core keeps more reads
// in flight than one stream gives it (a plain 2-thread read here: 19 / 28 / 38 GB/s with 1 / 2 / 4
// streams per thread; in this kernel, from cold on the three bench shapes, 2 beat 4 for f32 values).
template <int M, int S, class V>
__attribute__((noinline))  // inlined into small_m's loop, one pass's registers moved with the others' code (up to 25%)
void small_m_rows_lanes(const float* x, const float* xr, int64_t K, const V* values, const uint8_t* meta, int64_t n0, int64_t n1,
                        float* dots) {
  // U steps a pass: S x U accumulator chains per row of x hide the FMA latency. At M = 3 and 4
  // (S = 1), U = 2 keeps the 6 or 8 chains in registers; U = 4 spilled half of them to the stack
  // (5-17% slower at M = 3-4 in cache, 2-8% on a weight streamed from memory, on Zen 3).
  constexpr int U = S == 1 && M < 3 ? 4 : 2;
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

struct LaneRows {
  static constexpr bool rearranged = true;
  // Streams per thread (measured in alternating runs, each after a dense GEMV so every one starts
  // cold): f32 values 2 (8-25% faster than 4 on the three bench shapes, 6 no better), bf16 4 (2
  // even), int8 1 (bound by the widening, not by the stream).
  template <class V>
  static void run(int rows, const float* xm, const float* xrm, int64_t K, const V* values, const uint8_t* meta, int64_t n0, int64_t n1,
                  float* dots) {
    switch (rows) {
      case 1: return small_m_rows_lanes<1, sizeof(V) == 4 ? 2 : sizeof(V) == 2 ? 4 : 1>(xm, xrm, K, values, meta, n0, n1, dots);
      case 2: return small_m_rows_lanes<2, sizeof(V) == 1 ? 1 : 2>(xm, xrm, K, values, meta, n0, n1, dots);
      case 3: return small_m_rows_lanes<3, 1>(xm, xrm, K, values, meta, n0, n1, dots);
      default: return small_m_rows_lanes<4, 1>(xm, xrm, K, values, meta, n0, n1, dots);
    }
  }
};

const KernelDef kStreaming[] = {
    {Kernel::streaming, kOrderStreaming, [](const Call& c) { return c.has_values(); }, run<LaneRows>},
};

}  // namespace

std::span<const KernelDef> streaming_kernels() { return kStreaming; }

#endif

}  // namespace sinter::sparse

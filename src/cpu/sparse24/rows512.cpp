// The 2:4 kernel for AVX-512 that reads values + meta in place (kernels.h): zmm lanes
// run over 16 kept values of one weight row (32 columns), and one vpermt2ps per row of x picks each
// lane's column of x from the two registers that hold those 32 columns, by indices made from the
// row's four meta bytes (a variable shift and one ternary-logic op, shared by every row of x).
// Four weight rows x up to four rows of x per pass: 16 accumulators. Per 16 kept values and row
// of x one permute and one FMA, as in the 16-row tiles, but with no tile layout: a call streams
// values + meta once, with no second copy of the weight. Built only with AVX-512.
#include "cpu/sparse24/kernels.h"

#if defined(SINTER_TILES16)
#include <immintrin.h>

#include "cpu/sparse24/kernel_common.h"  // parallel_for, activate, byte_offsets, kPf

// GCC 12's AVX-512 headers start some intrinsics (widenings, permutes) from an undefined vector
// and then warn that it may be used uninitialized; the instructions read no such input.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace sinter::sparse {
namespace {

// Columns per pass over a block of weight rows: four rows of x over this many columns (32 KiB of
// f32) stay in L1 beside the weights of four rows while the block's rows pass over them; the block's weights (kBlockQuads x 4
// rows over these columns) stay in L2 while the groups of four rows of x pass over them.
constexpr int64_t kChunkCols = 1024, kBlockQuads = 16;

// 16 kept values as f32.
template <class V> SINTER_INLINE __m512 values16(const V* p) {
  if constexpr (std::is_same_v<V, float>) return _mm512_loadu_ps(p);
  else if constexpr (std::is_same_v<V, bf16>)  // the bf16 bits are the high half of an f32
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
  else return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// The columns (0..31) of 16 kept values from their four meta bytes: kept value i is in group i / 2
// (columns 4 (i / 2) .. +3), at the 2-bit offset in bits 2i, 2i + 1 of the little-endian word.
SINTER_INLINE __m512i column_indices(const uint8_t* mt) {
  uint32_t word;
  std::memcpy(&word, mt, 4);
  const __m512i shifts = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i groups = _mm512_setr_epi32(0, 0, 4, 4, 8, 8, 12, 12, 16, 16, 20, 20, 24, 24, 28, 28);
  // (shifted & 3) | groups
  return _mm512_ternarylogic_epi32(_mm512_srlv_epi32(_mm512_set1_epi32(int(word)), shifts), _mm512_set1_epi32(3), groups, 0xEA);
}

// acc[r][m] += the products of weight rows w[r] with rows m of x over 32-column steps [s0, s1).
// Prefetch: the weights come from memory (requested kPf bytes ahead in each row); otherwise from
// the caches, where a request would only cost a load slot.
template <int MR, bool Prefetch, class V>
SINTER_INLINE void quad_steps(const float* x, int64_t K, const V* const w[4], const uint8_t* const mt[4], int64_t s0, int64_t s1,
                              __m512 acc[4][4]) {
  for (int64_t s = s0; s < s1; ++s) {
    __m512i idx[4];
    __m512 wv[4];
    for (int r = 0; r < 4; ++r) {
      if constexpr (Prefetch) {
        __builtin_prefetch(reinterpret_cast<const char*>(w[r] + 16 * s) + kPf, 0, kPfLocality);
        __builtin_prefetch(mt[r] + 4 * s + 256, 0, kPfLocality);
      }
      idx[r] = column_indices(mt[r] + 4 * s);
      wv[r] = values16(w[r] + 16 * s);
    }
    for (int m = 0; m < MR; ++m) {
      const __m512 lo = _mm512_loadu_ps(x + m * K + 32 * s), hi = _mm512_loadu_ps(x + m * K + 32 * s + 16);
      for (int r = 0; r < 4; ++r) acc[r][m] = _mm512_fmadd_ps(wv[r], _mm512_permutex2var_ps(lo, idx[r], hi), acc[r][m]);
    }
  }
}

template <class F> SINTER_INLINE void with_1_to_4(int n, const F& f) {
  switch (n) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    default: return f(std::integral_constant<int, 4>{});
  }
}

template <class V>
void rows_as(const float* x, int64_t M, int64_t K, const V* values, const uint8_t* meta, const float* scales, const float* bias, Act act,
             float* y, int64_t N) {
  const int64_t K2 = K / 2, K8 = K / 8, steps = K / 32, quads = (N + 3) / 4, blocks = (quads + kBlockQuads - 1) / kBlockQuads;
  const int64_t MG = (M + 3) / 4;                                                  // groups of four rows of x
  const int64_t chunk_steps = M <= 4 ? std::max<int64_t>(steps, 1) : kChunkCols / 32;  // one pass over K for decode
  parallel_dynamic(0, blocks, [&](const auto& next) {
    // the partial sums of a block: quad, group of x rows, weight row, row of x (16 lanes each)
    std::vector<float> partial(size_t(kBlockQuads * MG * 16 * 16));
    for (int64_t blk; (blk = next()) >= 0;) {
      const int64_t q0 = blk * kBlockQuads, q1 = std::min(quads, q0 + kBlockQuads);
      std::fill(partial.begin(), partial.end(), 0.0f);
      auto rows_of = [&](int64_t q, const V* w[4], const uint8_t* mt[4]) {
        for (int r = 0; r < 4; ++r) {
          const int64_t n = std::min(N - 1, 4 * q + r);  // a short last quad repeats its last row, unstored
          w[r] = values + n * K2, mt[r] = meta + n * K8;
        }
      };
      for (int64_t s0 = 0; s0 < steps; s0 += chunk_steps) {
        const int64_t s1 = std::min(steps, s0 + chunk_steps);
        for (int64_t g = 0; g < MG; ++g)
          for (int64_t q = q0; q < q1; ++q) {
            const V* w[4];
            const uint8_t* mt[4];
            rows_of(q, w, mt);
            float* acc_at = partial.data() + ((q - q0) * MG + g) * 256;
            __m512 acc[4][4];
            for (int r = 0; r < 4; ++r)
              for (int m = 0; m < 4; ++m) acc[r][m] = _mm512_loadu_ps(acc_at + 16 * (4 * r + m));
            const float* xg = x + 4 * g * K;
            const int mr = int(std::min<int64_t>(4, M - 4 * g));
            if (g == 0) with_1_to_4(mr, [&](auto n) { quad_steps<n, true>(xg, K, w, mt, s0, s1, acc); });
            else with_1_to_4(mr, [&](auto n) { quad_steps<n, false>(xg, K, w, mt, s0, s1, acc); });
            for (int r = 0; r < 4; ++r)
              for (int m = 0; m < 4; ++m) _mm512_storeu_ps(acc_at + 16 * (4 * r + m), acc[r][m]);
          }
      }
      // Sums, the last K % 32 columns (one to three meta bytes), scale, bias and activation.
      for (int64_t q = q0; q < q1; ++q) {
        const V* w[4];
        const uint8_t* mt[4];
        rows_of(q, w, mt);
        for (int r = 0; r < 4 && 4 * q + r < N; ++r) {
          const int64_t n = 4 * q + r;
          for (int64_t m = 0; m < M; ++m) {
            float dot = _mm512_reduce_add_ps(_mm512_loadu_ps(partial.data() + ((q - q0) * MG + m / 4) * 256 + 16 * (4 * r + m % 4)));
            for (int64_t b = 4 * steps; b < K8; ++b) {
              int off[4];
              byte_offsets(mt[r][b], off);
              for (int t = 0; t < 4; ++t) dot += float(w[r][4 * b + t]) * x[m * K + 8 * b + off[t]];
            }
            y[m * N + n] = activate(dot * scales[n] + (bias ? bias[n] : 0.0f), act);
          }
        }
      }
    }
  });
}

void run_rows(const Args& a) {
  if (a.M == 0 || a.N == 0) return;
  with_value_type(a.vt, "sparse24_linear", [&](auto v) {
    rows_as(a.x, a.M, a.K, static_cast<const decltype(v)*>(a.values), a.meta, a.scales, a.bias, a.act, a.y, a.N);
  });
}

// Intel Xeon (AVX-512), 2 threads, 4096 x 4096, 4096 x 11008 and 11008 x 4096, against the kernels
// that serve those sizes without it: f32 M = 2-4 0.61-1.17x the time, 8 0.64-1.01x, 16 0.79-1.08x;
// bf16 and int8 values M = 2-4 0.46-0.98x, 8 0.74-0.96x. Against the prepacked tiles at M = 2-4: f32
// values 0.54-0.76x the time on the two 180 MB shapes, so f32 values take it even when prepacked;
// bf16 0.96-1.36x, int8 1.15-1.44x keep their prepacked copy. From M = 6 it takes 1.3-1.8x their time.
constexpr int64_t kRowsMaxM = 8;

const KernelDef kRows[] = {
    {Kernel::rows512, kOrderRowsF32, [](const Call& c) { return c.has_values() && c.values == DType::f32 && c.M >= 2 && c.M <= kSmallM; },
     run_rows},
    {Kernel::rows512, kOrderRows,
     [](const Call& c) { return c.has_values() && c.M <= kRowsMaxM && (c.M >= 2 || c.values == DType::i8); }, run_rows},
};

}  // namespace

std::span<const KernelDef> rows512_kernels() { return kRows; }

}  // namespace sinter::sparse

#else
namespace sinter::sparse {
std::span<const KernelDef> rows512_kernels() { return {}; }
}  // namespace sinter::sparse
#endif

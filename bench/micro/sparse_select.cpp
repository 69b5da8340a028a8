// How fast a 2:4 kernel can pick each kept value's column of x on an AVX2 core: one thread, every
// operand in L1. The measurement behind docs/sparse.md's paragraph on M = 16 (`build/sparse_select`,
// built with the project; it prints percentages of the FMA peak it measures itself).
// - Port tests: 8 FMAs + 4 vpermilps, and 2 FMAs + 2 loads + 1 broadcast, in FMA-times.
// - permute: the selection of tiles8.cpp: vectors over 8 weight rows; a group's 4 columns of x
//   broadcast to both 128-bit lanes, one vpermilps per kept value and row of x.
// - address: the selection of k_major.cpp over the prepacked layout, at 16 rows of x: each kept
//   value broadcast, its column of a column-major x panel (2 registers) found by a byte offset.
// - mixed: one loop doing both on different weight rows, a share f of its FMAs on the permute side.
// Weights in the 8-row prepacked block: 8 u32 meta words (a group of 4 columns in 4 bits: its two
// kept positions), then the 16 kept values of each row interleaved (value j of row r at 8j + r).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

namespace {

constexpr int kBlock = 32 + 16 * 8 * 4;  // bytes of one block: 8 rows x 32 columns
constexpr int kQ = 8;                     // blocks per pass: 256 columns
alignas(64) uint8_t W[4][kQ * kBlock];    // 4 groups of 8 weight rows
alignas(64) float X4[16][kQ * 32];        // x row-major (m, k): the permute side
alignas(64) float XP[kQ * 32][16];        // x as one column-major panel (k, m): the address side
alignas(64) uint16_t OFF[4][kQ][16][8];   // byte offset into XP of kept value j of row r
alignas(64) float OUT[4096];

template <class F> double best_seconds(F f, int n = 30) {
  double b = 1e9;
  for (int i = 0; i < n; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    b = std::min(b, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return b;
}

// Weight group gp (permute side, rows of x m0 .. m0 + MR) and R rows from r0 of group ga (address
// side, all 16 rows of x), interleaved per group of 4 columns. MR = 0 or R = 0 leaves a side out.
// Offsets: from OFF (computed beforehand), or, with InLoop, from each block's meta words as the
// library's kmp_offsets computes them (vector shifts, masks and multiplies, 8 rows at a time).
template <int MR, int R, bool InLoop = false>
__attribute__((noinline)) void kernel(int gp, int m0, int ga, int r0, float* out) {
  __m256 acc[MR + 1], a[R + 1][2];
  for (int m = 0; m < MR; ++m) acc[m] = _mm256_setzero_ps();
  for (int r = 0; r < R; ++r) a[r][0] = a[r][1] = _mm256_setzero_ps();
  const char* xp = reinterpret_cast<const char*>(XP);
  for (int q = 0; q < kQ; ++q) {
    const uint8_t* bp = W[gp] + q * kBlock;
    const __m256i W8 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bp));
    const float* vals = reinterpret_cast<const float*>(bp + 32);
    const float* avals = reinterpret_cast<const float*>(W[ga] + q * kBlock + 32) + r0;
    alignas(32) uint16_t own[16][8];
    const uint16_t(*off)[8] = OFF[ga][q];
    if constexpr (InLoop) {
      const __m256i W8a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(W[ga] + q * kBlock));
#pragma GCC unroll 16
      for (int j = 0; j < 16; ++j) {
        const __m256i nib = _mm256_and_si256(_mm256_srli_epi32(W8a, 2 * j), _mm256_set1_epi32(3));
        const __m256i col = _mm256_add_epi32(nib, _mm256_set1_epi32(q * 32 + 4 * (j / 2)));
        const __m256i o = _mm256_mullo_epi32(col, _mm256_set1_epi32(16 * sizeof(float)));
        _mm_store_si128(reinterpret_cast<__m128i*>(own[j]), _mm_packus_epi32(_mm256_castsi256_si128(o), _mm256_extracti128_si256(o, 1)));
      }
      off = own;
    }
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
      if constexpr (MR > 0) {
        const __m256i i0 = _mm256_srli_epi32(W8, 4 * g), i1 = _mm256_srli_epi32(W8, 4 * g + 2);
        const __m256 v0 = _mm256_loadu_ps(vals + 16 * g), v1 = _mm256_loadu_ps(vals + 16 * g + 8);
#pragma GCC unroll 8
        for (int m = 0; m < MR; ++m) {
          const __m256 xb = _mm256_broadcast_ps(reinterpret_cast<const __m128*>(&X4[m0 + m][q * 32 + g * 4]));
          acc[m] = _mm256_fmadd_ps(v0, _mm256_permutevar_ps(xb, i0), acc[m]);
          acc[m] = _mm256_fmadd_ps(v1, _mm256_permutevar_ps(xb, i1), acc[m]);
        }
      }
#pragma GCC unroll 2
      for (int j = 2 * g; j < 2 * g + 2; ++j) {
        uint64_t o4[(R + 3) / 4 + 1];
        std::memcpy(o4, &off[j][r0], R * sizeof(uint16_t));
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const __m256 v = _mm256_broadcast_ss(avals + 8 * j + r);
          const float* xr = reinterpret_cast<const float*>(xp + ((o4[r / 4] >> (16 * (r % 4))) & 0xffff));
          a[r][0] = _mm256_fmadd_ps(v, _mm256_load_ps(xr), a[r][0]);
          a[r][1] = _mm256_fmadd_ps(v, _mm256_load_ps(xr + 8), a[r][1]);
        }
      }
    }
  }
  for (int m = 0; m < MR; ++m) _mm256_storeu_ps(out + 8 * m, acc[m]);
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(out + 64 + 16 * r, a[r][0]), _mm256_storeu_ps(out + 72 + 16 * r, a[r][1]);
}

// Port tests: 8 independent FMA chains (as many as hide the FMA latency at two a cycle), alone or
// with other instructions between them; 8 + 4 + 3 registers, so nothing spills.
enum class Mix { fma, fma_permute, fma_loads };
template <Mix K> __attribute__((noinline)) void ports(long n, float* out) {
  __m256 a[8], p[4];
  for (int i = 0; i < 8; ++i) a[i] = _mm256_set1_ps(float(i));
  for (int i = 0; i < 4; ++i) p[i] = _mm256_set1_ps(float(i));
  const __m256 b = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(0.001f);
  const __m256i ix = _mm256_set1_epi32(1);
  for (long k = 0; k < n; ++k) {
    const float* x = OUT + 8 * (k & 3);
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      if constexpr (K == Mix::fma_loads) {  // per 2 FMAs: one broadcast and two loads (the broadcast's
        // address moves with k, or the compiler hoists it out of the loop)
        const __m256 v = _mm256_broadcast_ss(OUT + 512 + 4 * (k & 7) + i / 2);
        a[i] = _mm256_fmadd_ps(v, _mm256_load_ps(x + 8 * i), a[i]);
      } else {
        a[i] = _mm256_fmadd_ps(a[i], b, c);
      }
      if constexpr (K == Mix::fma_permute)  // per 2 FMAs: one shuffle
        if (i % 2 == 0) p[i / 2] = _mm256_permutevar_ps(p[i / 2], ix);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) _mm256_storeu_ps(out + 8 * i, _mm256_add_ps(a[i], p[i / 2]));
}

void fill() {
  for (int gq = 0; gq < 4; ++gq)
    for (int q = 0; q < kQ; ++q) {
      uint8_t* b = W[gq] + q * kBlock;
      uint32_t mw[8];
      for (int r = 0; r < 8; ++r) {
        mw[r] = 0;
        for (int g = 0; g < 8; ++g) {
          const int p0 = std::rand() % 3, p1 = p0 + 1 + std::rand() % (3 - p0);
          mw[r] |= uint32_t(p0 | (p1 << 2)) << (4 * g);
        }
      }
      std::memcpy(b, mw, sizeof mw);
      float* v = reinterpret_cast<float*>(b + 32);
      for (int j = 0; j < 128; ++j) v[j] = 0.01f * float(j % 7);
      for (int j = 0; j < 16; ++j)
        for (int r = 0; r < 8; ++r) {
          const int g = j / 2, pos = (mw[r] >> (4 * g + 2 * (j % 2))) & 3;
          OFF[gq][q][j][r] = uint16_t((q * 32 + 4 * g + pos) * 16 * sizeof(float));
        }
    }
  for (int m = 0; m < 16; ++m)
    for (int k = 0; k < kQ * 32; ++k) X4[m][k] = XP[k][m] = 1.0f / float(m * 300 + k + 3);
}

}  // namespace

int main() {
  fill();
  const long n = 2000000;
  const int reps = 5000;
  for (int round = 0; round < 3; ++round) {
    const double t_fma = best_seconds([&] { ports<Mix::fma>(n, OUT); }, 5);
    const double peak = 8.0 * 16 * n / t_fma / 1e9;  // GFLOP/s: 8 FMAs of 8 lanes a step
    const double t_perm = best_seconds([&] { ports<Mix::fma_permute>(n, OUT); }, 5);
    const double t_load = best_seconds([&] { ports<Mix::fma_loads>(n, OUT); }, 5);
    // Percent of the peak for `calls` calls of kernel<MR, R> (useful FMAs: 2 MR + 4 R per group of 4 columns).
    auto rate = [&](auto run, int fmas_per_group, int calls) {
      const double t = best_seconds([&] { for (int k = 0; k < reps; ++k) run(); });
      return 100.0 * double(reps) * calls * kQ * 8 * fmas_per_group * 16 / t / 1e9 / peak;
    };
    const double perm = rate([] { for (int m0 = 0; m0 < 16; m0 += 8) kernel<8, 0>(0, m0, 1, 0, OUT); }, 16, 2);
    const double addr = rate([] { for (int r0 = 0; r0 < 8; r0 += 4) kernel<0, 4>(0, 0, 1, r0, OUT); }, 16, 2);
    // The offsets of a block's 8 rows computed once and used by its two sets of 4 rows, as kmp_group does.
    const double addr_in = rate([] { kernel<0, 4, true>(0, 0, 1, 0, OUT), kernel<0, 4>(0, 0, 1, 4, OUT); }, 16, 2);
    const double mix50 = rate([] { kernel<4, 2>(0, 0, 1, 0, OUT); }, 16, 1);
    const double mix27 = rate([] { kernel<3, 4>(0, 0, 1, 0, OUT); }, 22, 1);
    const double mix11 = rate([] { kernel<1, 4>(0, 0, 1, 0, OUT); }, 18, 1);
    std::printf("FMA peak %.0f GFLOP/s (one thread) | 8 FMAs + 4 vpermilps: %.1f FMA-times, 2 FMAs + 2 loads + 1 broadcast: %.2f | "
                "permute %.0f%%, address %.0f%% (offsets computed in the loop: %.0f%%), mixed f = 0.5 / 0.27 / 0.11: %.0f / %.0f / %.0f%% of the peak\n",
                peak, 8 * t_perm / t_fma, 2 * t_load / t_fma, perm, addr, addr_in, mix50, mix27, mix11);
  }
}
#else
int main() { std::puts("sparse_select: needs an AVX2 + FMA build (x86-64, -march with AVX2)"); }
#endif

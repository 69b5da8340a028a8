// The 16-row tiles' kernel for bf16 x with bf16 values on AVX512-BF16 (tiles16.h): vdpbf16ps on
// the pairs of kept values, one vpermw per pair.
#include "cpu/sparse24/kernels.h"

#if defined(SINTER_TILES16) && defined(__AVX512BF16__)
#include "cpu/sparse24/tiles16.h"

namespace sinter::sparse {
namespace {

// bf16 x and bf16 values: vdpbf16ps on pairs. Per group of four columns, vpermw gives lane r the
// pair (x[a], x[b]) of the two columns row r keeps, against the block's pair of values in lane r:
// one permute per 32 kept multiply-adds (the f32 tile: per 16). x's tiles hold each block's 16
// columns twice (words 0-15 and 16-31), so bit 4 of a vpermw index, left over from the next
// nibble, picks the same column.
template <int R, bool Stream>
__attribute__((noinline)) void tile_pairs(const uint8_t* wp, int64_t nb, const uint16_t* xt, float* c, int64_t ldc, int cols, bool first) {
  constexpr int A = R <= 2 ? 2 : 1;
  const __mmask16 mk = __mmask16((1u << cols) - 1);
  __m512 acc[R][A];
  start_sums(acc, c, ldc, mk, first);
  for (int64_t b = 0; b < nb; ++b, wp += kBytes<bf16>, xt += kPairTileRows * 32) {
    if constexpr (Stream)
      for (int64_t l = 0; l < kBytes<bf16>; l += 64) _mm_prefetch(reinterpret_cast<const char*>(wp) + kAhead + l, _MM_HINT_T0);
    const __m512i words = _mm512_load_si512(wp);
    __m512i ix[4];
    __m512bh pv[4];
#pragma GCC unroll 4
    for (int gg = 0; gg < 4; ++gg) {
      const __m512i d = _mm512_srli_epi32(words, 8 * gg);  // nibbles 2gg, 2gg + 1 in bits 0-7
      ix[gg] = _mm512_mask_blend_epi16(__mmask32(0xAAAAAAAAu), d, _mm512_slli_epi32(d, 12));  // into the low and high words
      pv[gg] = (__m512bh)_mm512_load_si512(wp + 64 + 64 * gg);
    }
#pragma GCC unroll 16
    for (int m = 0; m < R; ++m) {
      const __m512i xm = _mm512_load_si512(xt + 32 * m);
#pragma GCC unroll 4
      for (int gg = 0; gg < 4; ++gg)
        acc[m][gg % A] = _mm512_dpbf16_ps(acc[m][gg % A], (__m512bh)_mm512_permutexvar_epi16(ix[gg], xm), pv[gg]);
    }
  }
  store_sums(acc, c, ldc, mk);
}

template <bool Stream>
void pair_rows(int rows, const uint8_t* wp, int64_t nb, const uint16_t* xt, float* c, int64_t ldc, int cols, bool first) {
  with_rows(rows, [&](auto R) { tile_pairs<R, Stream>(wp, nb, xt, c, ldc, cols, first); });
}

void run_pair_tiles(const Args& a) {
  if (a.M == 0 || a.N == 0) return;
  linear_as<uint16_t, bf16>(a.xh, a.M, a.K, static_cast<const bf16*>(a.values), a.meta, a.packed, a.scales, a.bias, a.act, a.y, a.N);
}

bool bf16_pair(const Call& c) { return c.x == DType::bf16 && c.values == DType::bf16; }

// Prepacked always; from values + meta above kPairsM (the K-major pairs kernel below, pairs.cpp).
const KernelDef kTiles16Bf16[] = {
    {Kernel::pairs_prepacked16, kOrderPrepacked,
     [](const Call& c) { return bf16_pair(c) && (c.packed_only || (c.prepacked && prepacked_serves(c.values, c.M))); }, run_pair_tiles,
     true, true},
    {Kernel::pairs_tiles16, kOrderPairs, [](const Call& c) { return bf16_pair(c) && c.has_values() && c.M > kPairsM; }, run_pair_tiles,
     true},
};

}  // namespace

std::span<const KernelDef> tiles16_bf16_kernels() { return kTiles16Bf16; }

}  // namespace sinter::sparse

#else
namespace sinter::sparse {
std::span<const KernelDef> tiles16_bf16_kernels() { return {}; }
}  // namespace sinter::sparse
#endif

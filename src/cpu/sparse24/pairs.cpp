// 2:4 bf16 x bf16 K-major kernel on vdpbf16ps (AVX512-BF16): a group's two kept values are one
// pair (kernels.h).
#include "cpu/sparse24/kernel_common.h"

namespace sinter::sparse {

#if defined(__AVX512BF16__)
namespace {

// vdpbf16ps multiplies 16 pairs of bf16 into 16 f32 sums, and a 2:4 group's two kept values are
// such a pair. K-major as in k_major.cpp, 16 rows of x a vector: per group of four columns and pair
// of its columns (6), x is laid out as 16 lanes (x[m, a], x[m, b]); a weight row's group
// broadcasts its two kept values and picks its pair's vector by address: one vdpbf16ps does 32
// kept multiply-adds. Blocks of 64 columns over panels of 32 rows (2 threads, 4096 x 11008): M =
// 32 1.03-1.10x oneDNN's bf16 matmul, 512 1.08-1.09x, where 32 columns over 64 rows gave
// 0.92-0.96x and 1.05-1.06x: half the loads and stores of the sums, a block of pairs in 12 KiB.
constexpr int64_t kPrCols = 64;                          // columns per block: 16 groups, 8 meta bytes
constexpr int64_t kPrPanel = 32;                         // rows of x per full panel: 2 vectors of 16
constexpr int64_t kPrSlot = kPrPanel / 16 * 64;          // bytes of one pair of one group for a full panel
constexpr int64_t kPrBlock = kPrCols / 4 * 6 * kPrSlot;  // one block of pairs: 16 groups x 6 pairs (12 KiB)
constexpr int64_t kPrRowBytes = kPrCols + kPrCols / 8;   // a packed row's block: 32 bf16 values, then 8 meta bytes

// For a meta byte (two groups): the byte offsets of their pairs within a block of pairs, group 0
// in bits 0-15 and group 1 in bits 16-31, when both groups keep two distinct columns in
// increasing order (as to_sparse_semi_structured writes them); 0xffffffff when not (the packing
// puts such groups in order first).
struct PairOffsets {
  uint32_t at[256];
  PairOffsets() {
    static const int slot[4][4] = {{-1, 0, 1, 2}, {-1, -1, 3, 4}, {-1, -1, -1, 5}, {-1, -1, -1, -1}};
    for (int b = 0; b < 256; ++b) {
      uint32_t o = 0;
      for (int h = 0; h < 2 && o != 0xffffffffu; ++h) {
        const int lo = (b >> (4 * h)) & 3, hi = (b >> (4 * h + 2)) & 3;
        o = slot[lo][hi] < 0 ? 0xffffffffu : o | uint32_t((h * 6 + slot[lo][hi]) * kPrSlot) << (16 * h);
      }
      at[b] = o;
    }
  }
};
const PairOffsets& pair_offsets() {
  static const PairOffsets t;
  return t;
}

// A group whose meta is not two distinct columns in order: the same product with them in order.
// Swapped columns swap the two values; a column kept twice (meta a reader may hand us; our
// writer never makes it) keeps its first value at a free column's place with the second zeroed,
// and the second is returned as a correction (its column, value) to add after the block.
struct Correction {
  int64_t row, col;
  float value;
};
void order_group(uint16_t* vals, uint8_t* meta_byte, int h, int64_t row, int64_t col0, std::vector<Correction>& fix) {
  int lo = (*meta_byte >> (4 * h)) & 3, hi = (*meta_byte >> (4 * h + 2)) & 3;
  if (lo > hi) std::swap(lo, hi), std::swap(vals[0], vals[1]);
  if (lo == hi) {
    const uint16_t second = vals[1];
    uint32_t bits = uint32_t(second) << 16;
    float v;
    std::memcpy(&v, &bits, 4);
    if (v != 0.0f) fix.push_back({row, col0 + lo, v});
    if (lo == 3) lo = 2, vals[1] = vals[0], vals[0] = 0;  // (3, 3) -> (2, 3) with 0 at column 2
    else hi = lo + 1, vals[1] = 0;                        // (a, a) -> (a, a + 1) with 0 at a + 1
  }
  *meta_byte = uint8_t((*meta_byte & ~(15 << (4 * h))) | (lo | hi << 2) << (4 * h));
}

// Whether every group of a row's meta keeps two distinct columns in increasing order (64 bytes a step).
bool pairs_in_order(const uint8_t* meta, int64_t bytes) {
  const __m512i three = _mm512_set1_epi8(3);
  int64_t i = 0;
  for (; i + 64 <= bytes; i += 64) {
    const __m512i b = _mm512_loadu_si512(meta + i);
    const __m512i lo0 = _mm512_and_si512(b, three), hi0 = _mm512_and_si512(_mm512_srli_epi16(b, 2), three);
    const __m512i lo1 = _mm512_and_si512(_mm512_srli_epi16(b, 4), three), hi1 = _mm512_and_si512(_mm512_srli_epi16(b, 6), three);
    if (_mm512_cmpge_epu8_mask(lo0, hi0) | _mm512_cmpge_epu8_mask(lo1, hi1)) return false;
  }
  for (; i < bytes; ++i)
    if (pair_offsets().at[meta[i]] == 0xffffffffu) return false;
  return true;
}

// The pairs of one block of columns for a panel of nv vectors: xt is the panel transposed
// (column k at xt + k pw, pw = 16 nv), columns past K already zero.
void build_pairs(const uint16_t* xt, int64_t pw, int nv, uint8_t* out) {
  static const int pa[6] = {0, 0, 0, 1, 1, 2}, pb[6] = {1, 2, 3, 2, 3, 3};
  for (int g = 0; g < kPrCols / 4; ++g)
    for (int u = 0; u < nv; ++u) {
      __m512i lo[4], hi[4];
      for (int j = 0; j < 4; ++j) {
        lo[j] = _mm512_maskz_cvtepu16_epi32(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xt + (4 * g + j) * pw + 16 * u)));
        hi[j] = _mm512_maskz_slli_epi32(0xffff, lo[j], 16);  // maskz: GCC 12 warns on the plain forms' undefined source
      }
      for (int s = 0; s < 6; ++s)
        _mm512_store_si512(out + (g * 6 + s) * kPrSlot + 64 * u, _mm512_or_si512(lo[pa[s]], hi[pb[s]]));
    }
}

// R rows of a packed chunk over one block of pairs, NV vectors of 16 rows of x; acc: R x 16 NV.
template <int R, int NV> SINTER_INLINE void pairs_rows(const uint8_t* wr, const uint8_t* pb, float* acc) {
  const PairOffsets& tab = pair_offsets();
  __m512 a[R][NV];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < NV; ++u) a[r][u] = _mm512_load_ps(acc + 16 * (NV * r + u));
  uint32_t os[R][kPrCols / 8];  // every pair offset of the block looked up first, as in k_major_row
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int h = 0; h < kPrCols / 8; ++h) os[r][h] = tab.at[wr[r * kPrRowBytes + kPrCols + h]];
#pragma GCC unroll 4
  for (int h = 0; h < kPrCols / 8; ++h) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const uint8_t* w = wr + r * kPrRowBytes;
      const uint32_t o = os[r][h];
#pragma GCC unroll 2
      for (int gg = 0; gg < 2; ++gg) {
        const int g = 2 * h + gg;
        uint32_t pair;
        std::memcpy(&pair, w + 4 * g, 4);
        const __m512bh wv = (__m512bh)_mm512_set1_epi32(int(pair));
        const uint8_t* xg = pb + h * 2 * 6 * kPrSlot + ((o >> (16 * gg)) & 0xffff);
#pragma GCC unroll 4
        for (int u = 0; u < NV; ++u) a[r][u] = _mm512_dpbf16_ps(a[r][u], (__m512bh)_mm512_load_si512(xg + 64 * u), wv);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < NV; ++u) _mm512_store_ps(acc + 16 * (NV * r + u), a[r][u]);
}

// The next block of pairs (kPrBlock bytes at next) is requested a few lines per R rows: its
// loads go by the meta, in no order a hardware prefetcher follows.
template <int NV> void pairs_block(const uint8_t* wb, int64_t nr, const uint8_t* pb, float* acc, const uint8_t* next) {
  constexpr int R = NV == 1 ? 8 : 4;  // 8 chains of sums either way
  constexpr int64_t lines = kPrBlock / 64;
  const int64_t per = (lines + (nr + R - 1) / R - 1) / std::max<int64_t>((nr + R - 1) / R, 1);  // lines per R rows
  int64_t r = 0, l = 0;
  for (; r + R <= nr; r += R) {
    for (int64_t e = std::min(lines, l + per); next && l < e; ++l) _mm_prefetch(reinterpret_cast<const char*>(next) + 64 * l, _MM_HINT_T0);
    pairs_rows<R, NV>(wb + r * kPrRowBytes, pb, acc + r * 16 * NV);
  }
  for (; r < nr; ++r) pairs_rows<1, NV>(wb + r * kPrRowBytes, pb, acc + r * 16 * NV);
}

void pairs_panel(int nv, const uint8_t* wb, int64_t nr, const uint8_t* pb, float* acc, const uint8_t* next) {
  static_assert(kPrPanel == 32, "panels of one or two vectors");
  if (nv == 1) return pairs_block<1>(wb, nr, pb, acc, next);
  pairs_block<2>(wb, nr, pb, acc, next);
}

// M <= 16 (one vector of x): each block of weights would be used once, so the rows are read in
// place, four at a time (two chains of sums each) over a span of kStreamBlocks blocks of columns
// whose pairs (192 KiB used) stay in L2, and the next four rows are requested ahead: a row of a
// 4096-wide bf16 weight is one page, and the hardware prefetcher does not cross pages. Measured
// at M = 16 (alternating runs, 2 threads, 4096 x 4096 and 4096 x 11008): 1.33-1.45x the packed
// path; spans of 4 / 8 / 16 / 32 / 64 blocks ran 0.9-1.0 / 1.0-1.3 / 1.15-1.3 / 1.25-1.33 /
// 1.25-1.27x the prepacked tiles (one noisy outlier left out).
constexpr int64_t kStreamBlocks = 32;
template <int R>
void pairs_stream_rows(const uint8_t* w, int64_t ws, const uint8_t* m, int64_t ms, int64_t nkb, const uint8_t* pb, float* acc,
                       const uint8_t* next_w, const uint8_t* next_m, int next_rows) {
  const PairOffsets& tab = pair_offsets();
  __m512 a[R][2];
  for (int r = 0; r < R; ++r) a[r][0] = _mm512_load_ps(acc + 16 * r), a[r][1] = _mm512_setzero_ps();
  for (int64_t kb = 0; kb < nkb; ++kb, w += kPrCols, m += kPrCols / 8, pb += kPrBlock) {
    for (int r = 0; r < next_rows; ++r) _mm_prefetch(reinterpret_cast<const char*>(next_w + r * ws + kb * kPrCols), _MM_HINT_T0);
    if (kb % 8 == 0)
      for (int r = 0; r < next_rows; ++r) _mm_prefetch(reinterpret_cast<const char*>(next_m + r * ms + kb * kPrCols / 8), _MM_HINT_T0);
#pragma GCC unroll 8
    for (int h = 0; h < kPrCols / 8; ++h)
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const uint32_t o = tab.at[m[r * ms + h]];
#pragma GCC unroll 2
        for (int gg = 0; gg < 2; ++gg) {
          uint32_t pair;
          std::memcpy(&pair, w + r * ws + 4 * (2 * h + gg), 4);
          const uint8_t* xg = pb + h * 2 * 6 * kPrSlot + ((o >> (16 * gg)) & 0xffff);
          a[r][gg] = _mm512_dpbf16_ps(a[r][gg], (__m512bh)_mm512_load_si512(xg), (__m512bh)_mm512_set1_epi32(int(pair)));
        }
      }
  }
  for (int r = 0; r < R; ++r) _mm512_store_ps(acc + 16 * r, _mm512_add_ps(a[r][0], a[r][1]));
}

void k_major_pairs(const uint16_t* x, int64_t M, int64_t K, const uint16_t* values, const uint8_t* meta, const float* scales,
                   const float* bias, Act act, float* y, int64_t N) {
  constexpr int64_t PW = kPrPanel;
  const int64_t KB = (K + kPrCols - 1) / kPrCols, Kp = KB * kPrCols;  // x padded with zero columns to whole blocks
  const int64_t full = M / PW, rest = M % PW, nv_last = (rest + 15) / 16, P = full + (rest > 0);
  auto panel_width = [&](int64_t p) { return p < full ? PW : 16 * nv_last; };
  // x's pairs, block-major per panel (pairs[p][kb]), each panel built from its transpose (column k
  // at d + k pw) in a scratch buffer of the thread's.
  Tensor pairs_buf = Tensor::empty({P * KB * kPrBlock}, DType::u8);
  uint8_t* pairs = pairs_buf.data<uint8_t>();
  parallel_for(0, P, 1, [&](int64_t p0, int64_t p1) {
    Tensor xt_buf = Tensor::empty({Kp * PW}, DType::bf16);
    uint16_t* d = reinterpret_cast<uint16_t*>(xt_buf.data_ptr());
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t pw = panel_width(p), m0 = p * PW;
      for (int64_t k0 = 0; k0 < Kp; k0 += 32)
        for (int64_t r = 0; r < pw; ++r) {
          const uint16_t* src = m0 + r < M ? x + (m0 + r) * K : nullptr;  // rows past M are zero
          for (int64_t k = k0; k < k0 + 32; ++k) d[k * pw + r] = src && k < K ? src[k] : 0;
        }
      for (int64_t kb = 0; kb < KB; ++kb) build_pairs(d + kb * kPrCols * pw, pw, int(pw / 16), pairs + (p * KB + kb) * kPrBlock);
    }
  });
  // 64 weight rows per chunk: a panel's sums (64 x 32 floats, 8 KiB), its block of pairs (12 KiB)
  // and the rows' block of weights stay in L1 (measured at one thread with 64-row panels, 4096 x
  // 4096, M = 128 and 512: 32, 64 and 128 rows 0.85-0.87x, 1.01-1.03x and 0.88-0.89x oneDNN's
  // bf16 matmul).
  const int64_t NC = std::max<int64_t>(8, std::min<int64_t>(64, (N / (4 * num_threads()) + 7) / 8 * 8));
  const int64_t chunks = (N + NC - 1) / NC, K2 = K / 2, K8 = K / 8;
  parallel_dynamic(0, chunks, [&](const auto& next) {
    Tensor w_buf = Tensor::empty({KB * NC * kPrRowBytes}, DType::u8);
    Tensor acc_buf = Tensor::empty({P * PW * NC}, DType::f32);  // per panel p: NC rows x its width
    uint8_t* wp = w_buf.data<uint8_t>();
    float* acc = acc_buf.data<float>();
    std::vector<Correction> fix;
    const PairOffsets& tab = pair_offsets();
    for (int64_t c; (c = next()) >= 0;) {
      const int64_t n0 = c * NC, nr = std::min(NC, N - n0);
      fix.clear();
      if (P == 1 && nv_last == 1 && K % kPrCols == 0) {  // M <= 16: the rows in place, unless their meta needs ordering
        bool ordered = true;
        for (int64_t r = 0; r < nr && ordered; ++r) ordered = pairs_in_order(meta + (n0 + r) * K8, K8);
        if (ordered) {
          const uint8_t* w0 = reinterpret_cast<const uint8_t*>(values + n0 * K2);
          const uint8_t* m0 = meta + n0 * K8;
          std::memset(acc, 0, size_t(nr) * 16 * sizeof(float));
          for (int64_t ks = 0; ks < KB; ks += kStreamBlocks) {
            const int64_t nkb = std::min(kStreamBlocks, KB - ks);
            for (int64_t r = 0; r < nr; r += 4) {
              const int rows = int(std::min<int64_t>(4, nr - r)), ahead = int(std::clamp<int64_t>(nr - r - 4, 0, 4));
              const uint8_t* w = w0 + r * K + ks * kPrCols;
              const uint8_t* m = m0 + r * K8 + ks * kPrCols / 8;
              const uint8_t* pb = pairs + ks * kPrBlock;
              if (rows == 4) pairs_stream_rows<4>(w, K, m, K8, nkb, pb, acc + r * 16, w + 4 * K, m + 4 * K8, ahead);
              else
                for (int i = 0; i < rows; ++i) pairs_stream_rows<1>(w + i * K, K, m + i * K8, K8, nkb, pb, acc + (r + i) * 16, w, m, 0);
            }
          }
          panel_epilogue(acc, M, PW, NC, panel_width, n0, nr, scales, bias, act, y, N);  // one panel, 16 wide
          continue;
        }
      }
      // Block-major: per block of columns, every row's values then meta. Rows are read S side by
      // side, as in k_major: one row at a time left the packing waiting on memory at M = 16.
      constexpr int64_t S = 4;
      for (int64_t r0 = 0; r0 < nr; r0 += S) {
        const int64_t rs = std::min(S, nr - r0);
        bool ordered[S];
        for (int64_t i = 0; i < rs; ++i) ordered[i] = pairs_in_order(meta + (n0 + r0 + i) * K8, K8);
        for (int64_t kb = 0; kb < KB; ++kb)
          for (int64_t i = 0; i < rs; ++i) {
            const int64_t r = r0 + i;
            uint8_t* d = wp + (kb * NC + r) * kPrRowBytes;
            const int64_t k0 = kb * kPrCols, kc = std::min(kPrCols, K - k0);
            if (kc == kPrCols) {
              std::memcpy(d, values + (n0 + r) * K2 + k0 / 2, kPrCols);
              std::memcpy(d + kPrCols, meta + (n0 + r) * K8 + k0 / 8, kPrCols / 8);
            } else {  // the last, partial block: zero values past K, each group's meta (0, 1)
              std::memset(d, 0, kPrRowBytes);
              std::memset(d + kPrCols, 0x44, kPrCols / 8);
              std::memcpy(d, values + (n0 + r) * K2 + k0 / 2, size_t(kc));
              std::memcpy(d + kPrCols, meta + (n0 + r) * K8 + k0 / 8, size_t(kc / 8));
            }
            for (int h = 0; h < kPrCols / 8 && !ordered[i]; ++h)
              if (tab.at[d[kPrCols + h]] == 0xffffffffu)
                for (int gg = 0; gg < 2; ++gg)
                  order_group(reinterpret_cast<uint16_t*>(d) + 2 * (2 * h + gg), d + kPrCols + h, gg, r, k0 + 4 * (2 * h + gg), fix);
          }
      }
      std::memset(acc, 0, size_t(acc_buf.numel()) * sizeof(float));
      for (int64_t kb = 0; kb < KB; ++kb)
        for (int64_t p = 0; p < P; ++p) {
          const int64_t np = p + 1 < P ? p + 1 : 0, nkb = p + 1 < P ? kb : kb + 1;  // the block after this one
          pairs_panel(int(panel_width(p) / 16), wp + kb * NC * kPrRowBytes, nr, pairs + (p * KB + kb) * kPrBlock, acc + p * PW * NC,
                      nkb < KB ? pairs + (np * KB + nkb) * kPrBlock : nullptr);
        }
      for (const Correction& f : fix)  // columns a weight row's meta named twice
        for (int64_t m = 0; m < M; ++m) {
          const int64_t p = m / PW, pw = panel_width(p);
          uint32_t bits = uint32_t(x[m * K + f.col]) << 16;
          float xv;
          std::memcpy(&xv, &bits, 4);
          acc[p * PW * NC + f.row * pw + (m - p * PW)] += f.value * xv;
        }
      panel_epilogue(acc, M, PW, NC, panel_width, n0, nr, scales, bias, act, y, N);
    }
  });
}
void run_pairs(const Args& a) {
  if (a.M > 0 && a.N > 0) k_major_pairs(a.xh, a.M, a.K, static_cast<const uint16_t*>(a.values), a.meta, a.scales, a.bias, a.act, a.y, a.N);
}

bool bf16_pair(const Call& c) { return c.x == DType::bf16 && c.values == DType::bf16 && c.has_values(); }

// bf16 x with bf16 values. Zen 4, 2 threads, 4096 x 4096, against the f32 kernels on values + meta:
// M = 16-32 1.18-1.27x, 48-128 1.37-1.45x. Against the 8-row prepacked tiles (4096 x 4096 and
// 4096 x 11008): M = 12 0.97x, 16 1.22-1.28x, 20 0.84-0.87x, 24 0.97-1.01x, 28 1.13-1.16x, 32
// 1.25-1.30x: a prepacked weight keeps its 8-row tiles at kPairsM < M < kPairsPrepackedM. With
// the 16-row tiles this kernel serves kSmallM < M <= kPairsM (their pairs kernel the rest).
constexpr int64_t kPairsPrepackedM = 26;

const KernelDef kPairs[] = {
    {Kernel::pairs_k_major, kOrderPairsFirst,
     [](const Call& c) { return pack_format().id == kPack8Rows && bf16_pair(c) && (c.M == kPairsM || c.M >= kPairsPrepackedM); },
     run_pairs, true},
    {Kernel::pairs_k_major, kOrderPairs + 1,
     [](const Call& c) { return bf16_pair(c) && (pack_format().id == kPack16Rows ? c.M > kSmallM : c.M >= kPairsM); }, run_pairs, true},
};

}  // namespace

std::span<const KernelDef> pairs_kernels() { return kPairs; }

#else
std::span<const KernelDef> pairs_kernels() { return {}; }
#endif

}  // namespace sinter::sparse

// bf16 x with bf16 values on AMX (Intel Xeon from Sapphire Rapids), where oneDNN's dense bf16 GEMM
// runs on the tile unit and the vector kernels cannot keep up from M = 16. Dense compute on 2:4
// bytes: each thread expands 32 weight rows at a time into bf16 tiles (vpexpandw at the meta's
// kept columns, into a buffer that stays in L2) and runs them through TDPBF16PS against x^T, packed
// once per call in the tiles' pair layout: y^T = W x^T, 2 x 2 tiles of 16 x 16 outputs at a time.
// Memory reads the 2:4 bytes (0.56x dense) and the tile unit does dense work; docs/sparse.md.
#include "cpu/sparse24/kernels.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BW__) && defined(__AVX512VBMI2__) && defined(__linux__)
#include <sys/syscall.h>

#include <array>
#include <cstdlib>
#include <unistd.h>

#include "cpu/sparse24/kernel_common.h"

namespace sinter::sparse {
namespace {

constexpr int64_t kPanel = 32;          // weight rows a thread expands at a time (two A tiles)
constexpr int64_t kTile = 512;          // u16 in a 16 x 32 bf16 tile
constexpr int64_t kAheadRows = 4;      // weight rows a thread asks for ahead of the one it expands
constexpr int64_t kChunkBytes = 1 << 20; // x^T a group of panels meets per pass (rows of x: a multiple of 32)
constexpr int64_t kGroupBytes = 512 << 10; // expanded weight rows a thread keeps for the passes of x

// Linux hands the tile registers to a process that asks (arch_prctl ARCH_REQ_XCOMP_PERM);
// SINTER_SPARSE24_AMX=0 keeps bf16 2:4 calls on the vector kernels.
bool amx_ready() {
  static const bool ok = [] {
    if (const char* e = std::getenv("SINTER_SPARSE24_AMX"); e && std::string(e) == "0") return false;
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}

// Eight tiles of 16 rows x 64 bytes: 0-3 the sums (weight rows 0-15 / 16-31 x rows of x 0-15 /
// 16-31), 4-5 the expanded weights, 6-7 x^T.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

// Per nibble of meta (one group of four columns, offsets a = bits 0-1, b = bits 2-3): the bits of
// its kept columns, and 0xFF where a < b, which is what an expanding load reproduces.
constexpr std::array<uint8_t, 16> kNibbleTable(bool order) {
  std::array<uint8_t, 16> t{};
  for (int n = 0; n < 16; ++n) t[size_t(n)] = order ? uint8_t((n & 3) < (n >> 2) ? 0xFF : 0) : uint8_t(1 << (n & 3) | 1 << (n >> 2));
  return t;
}
constexpr std::array<uint8_t, 16> kColumnBits = kNibbleTable(false), kInOrder = kNibbleTable(true);

// One weight row as bf16 over KB blocks of 32 columns, written every 32 u16 at `out` + kb * stride:
// per 64 meta bytes, two byte shuffles give the kept columns' bits of 16 blocks, then one
// expansion per block. False where the meta is out of order or names a column twice, which an
// expansion cannot reproduce (plain_row computes such a row).
bool expand_row(const uint16_t* v, const uint8_t* meta, int64_t K, int64_t KB, uint16_t* out, int64_t stride) {
  const __m512i bits_of = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kColumnBits.data())));
  const __m512i order_of = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kInOrder.data())));
  const __m512i low = _mm512_set1_epi8(0x0F);
  const int64_t K8 = K / 8;
  bool in_order = true;
  alignas(64) uint32_t masks[16];
  for (int64_t b0 = 0; b0 < K8; b0 += 64) {
    const __mmask64 valid = K8 - b0 >= 64 ? ~__mmask64(0) : (__mmask64(1) << (K8 - b0)) - 1;
    const __m512i m = _mm512_maskz_loadu_epi8(valid, meta + b0);
    const __m512i lo = _mm512_and_si512(m, low), hi = _mm512_and_si512(_mm512_srli_epi16(m, 4), low);
    const __m512i bits = _mm512_or_si512(_mm512_shuffle_epi8(bits_of, lo), _mm512_slli_epi16(_mm512_shuffle_epi8(bits_of, hi), 4));
    _mm512_store_si512(masks, _mm512_maskz_mov_epi8(valid, bits));
    in_order &= _mm512_test_epi8_mask(_mm512_shuffle_epi8(order_of, lo), _mm512_shuffle_epi8(order_of, hi)) == valid;
    for (int64_t kb = b0 / 4, end = std::min(KB, kb + 16); kb < end; ++kb) {
      // A plain load and the register form of the expansion: the memory form stalls the stream
      // (23 against 40 GB/s at M = 16). The last block of a row loads only its own values.
      if (kb % 2 == 0) {  // one stream per thread reaches ~12 GB/s: ask for rows ahead
        _mm_prefetch(reinterpret_cast<const char*>(v + 16 * kb + kAheadRows * K / 2), _MM_HINT_T1);
        if (kb % 16 == 0) _mm_prefetch(reinterpret_cast<const char*>(meta + 4 * kb + kAheadRows * K8), _MM_HINT_T1);
      }
      const int64_t nv = std::min<int64_t>(16, K / 2 - 16 * kb);
      const __m256i vals = nv == 16 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + 16 * kb))
                                    : _mm256_maskz_loadu_epi16(__mmask16((1u << nv) - 1), v + 16 * kb);
      _mm512_storeu_si512(out + kb * stride, _mm512_maskz_expand_epi16(__mmask32(masks[kb - b0 / 4]), _mm512_castsi256_si512(vals)));
    }
  }
  return in_order;
}

// y[m][n] for every row of x, one weight row plainly (each kept value times its column of x, in
// f32): the rows whose meta an expansion cannot reproduce (out of order, a column named twice).
void plain_row(const Args& g, int64_t n) {
  const auto* v = static_cast<const uint16_t*>(g.values) + n * (g.K / 2);
  const uint8_t* meta = g.meta + n * (g.K / 8);
  for (int64_t m = 0; m < g.M; ++m) {
    const uint16_t* x = g.xh + m * g.K;
    float sum = 0;
    for (int64_t b = 0; b < g.K / 8; ++b) {
      int off[4];
      byte_offsets(meta[b], off);
      for (int j = 0; j < 4; ++j) sum += fn::bits_to_float(uint32_t(v[4 * b + j]) << 16) * fn::bits_to_float(uint32_t(x[8 * b + off[j]]) << 16);
    }
    g.y[m * g.N + n] = activate(sum * g.scales[n] + (g.bias ? g.bias[n] : 0.0f), g.act);
  }
}

// x^T for rows [m0, m0 + 16 * MB) of x in the B tiles' pair layout: per block of 16 rows and 32
// columns, u32 r * 16 + m holds columns 2r, 2r + 1 of row m; rows past M and columns past K zero.
void pack_x(const uint16_t* x, int64_t M, int64_t K, int64_t m0, int64_t MB, int64_t KB, uint32_t* out) {
  parallel_for(0, MB, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t mb = b0; mb < b1; ++mb) {
      uint32_t* blk = out + mb * KB * (kTile / 2);
      std::memset(blk, 0, size_t(KB) * kTile * 2);
      for (int64_t m = 0; m < 16 && m0 + 16 * mb + m < M; ++m) {
        const uint16_t* row = x + (m0 + 16 * mb + m) * K;
        for (int64_t p = 0; p < K / 2; ++p) {
          uint32_t pair;
          std::memcpy(&pair, row + 2 * p, 4);
          blk[(p / 16) * (kTile / 2) + (p % 16) * 16 + m] = pair;
        }
      }
    }
  });
}

// y[m][n] = act(scale[n] * c[n][m] + bias[n]) for the nv x mv corner of a 16 x 16 tile of sums.
void store_tile(const float* c, int64_t nv, int64_t mv, const float* scales, const float* bias, Act act, float* y, int64_t N) {
  const __m512i column = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32(16));
  const __mmask16 k = __mmask16((1u << nv) - 1);
  const __m512 s = _mm512_maskz_loadu_ps(k, scales), b = bias ? _mm512_maskz_loadu_ps(k, bias) : _mm512_setzero_ps();
  for (int64_t m = 0; m < mv; ++m) {
    __m512 v = _mm512_fmadd_ps(_mm512_i32gather_ps(column, c + m, 4), s, b);
    if (act == Act::relu) v = _mm512_max_ps(v, _mm512_setzero_ps());
    float* out = y + m * N;
    _mm512_mask_storeu_ps(out, k, v);
    if (act == Act::silu || act == Act::gelu)
      for (int64_t i = 0; i < nv; ++i) out[i] = activate(out[i], act);
  }
}

// Sums of a 32-row panel (A: rows at `a`, lda u16 apart) against one or two blocks of 16 rows of x
// (B: b0, b1) over blocks [kb0, kb1) of 32 columns, added to the 16 x 16 tiles at c (or started
// from zero): c + 512 j + 256 t holds weight rows 16t.. against x block j.
template <bool Two>
void tile_sums(const uint16_t* a, int64_t lda, const uint32_t* b0, const uint32_t* b1, int64_t kb0, int64_t kb1, bool first, float* c) {
  if (first) {
    _tile_zero(0);  // the tile intrinsics are statements (asm), one per line
    _tile_zero(1);
    if constexpr (Two) _tile_zero(2);
    if constexpr (Two) _tile_zero(3);
  } else {
    _tile_loadd(0, c, 64);
    _tile_loadd(1, c + 256, 64);
    if constexpr (Two) _tile_loadd(2, c + 512, 64);
    if constexpr (Two) _tile_loadd(3, c + 768, 64);
  }
  for (int64_t kb = kb0; kb < kb1; ++kb) {
    _tile_loadd(4, a + 32 * kb, lda * 2);
    _tile_loadd(5, a + 16 * lda + 32 * kb, lda * 2);
    _tile_loadd(6, b0 + kb * (kTile / 2), 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 5, 6);
    if constexpr (Two) {
      _tile_loadd(7, b1 + kb * (kTile / 2), 64);
      _tile_dpbf16ps(2, 4, 7);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c, 64);
  _tile_stored(1, c + 256, 64);
  if constexpr (Two) _tile_stored(2, c + 512, 64);
  if constexpr (Two) _tile_stored(3, c + 768, 64);
}

// The panel of weight rows [n0, n0 + 32) (expanded at a) against blocks [mb0, mb1) of 16 rows of x
// (packed at xp), into y. Over many rows of x the columns go in slices of kSliceBlocks, so a
// slice of the panel (32 KiB) stays in L1 while the rows of x pass over it; the sums wait in c.
void panel_product(const uint16_t* a, int64_t lda, const uint32_t* xp, int64_t mb0, int64_t mb1, int64_t KB, int64_t n0, const Args& g, float* c) {
  constexpr int64_t kSliceBlocks = 16;
  const int64_t slice = mb1 - mb0 > 2 ? kSliceBlocks : KB;
  for (int64_t kb0 = 0; kb0 < KB; kb0 += slice)
    for (int64_t mb = mb0; mb < mb1; mb += 2) {
      const uint32_t* b0 = xp + mb * KB * (kTile / 2);
      float* cm = c + (mb - mb0) * 512;
      if (mb + 1 < mb1)
        tile_sums<true>(a, lda, b0, b0 + KB * (kTile / 2), kb0, std::min(KB, kb0 + slice), kb0 == 0, cm);
      else
        tile_sums<false>(a, lda, b0, nullptr, kb0, std::min(KB, kb0 + slice), kb0 == 0, cm);
    }
  const int64_t nv0 = std::clamp<int64_t>(g.N - n0, 0, 16), nv1 = std::clamp<int64_t>(g.N - n0 - 16, 0, 16);
  const float* bias = g.bias ? g.bias + n0 : nullptr;
  for (int64_t mb = mb0; mb < mb1; ++mb) {
    const int64_t m = 16 * mb, mv = std::min<int64_t>(16, g.M - m);
    const float* cm = c + (mb - mb0) * 512;  // its two tiles: weight rows 0-15, then 16-31
    float* y = g.y + m * g.N + n0;
    if (nv0 > 0) store_tile(cm, nv0, mv, g.scales + n0, bias, g.act, y, g.N);
    if (nv1 > 0) store_tile(cm + 256, nv1, mv, g.scales + n0 + 16, bias ? bias + 16 : nullptr, g.act, y + 16, g.N);
  }
}

// Threads take groups of panels; a group is expanded once (into L2) and every chunk of rows of x
// (packed whole, beforehand) passes over it.
void run_amx(const Args& g) {
  if (g.M == 0 || g.N == 0) return;
  const int64_t KB = (g.K + 31) / 32, MB = (g.M + 15) / 16, panels = (g.N + kPanel - 1) / kPanel;
  const int64_t lda = 32 * KB + 32;  // u16 between expanded rows: one line more, so a tile's 16 rows fall in different sets
  const int64_t chunk = std::max<int64_t>(2, kChunkBytes / (KB * kTile * 2) / 2 * 2);                 // blocks of 16 rows of x per pass
  const int64_t group = MB <= chunk ? 1 : std::max<int64_t>(1, kGroupBytes / (kPanel * lda * 2));  // panels per group
  const int64_t K2 = g.K / 2, K8 = g.K / 8;
  const auto* values = static_cast<const uint16_t*>(g.values);
  const Tensor xbuf = Tensor::empty({MB * KB * kTile / 2}, DType::f32);  // the caching allocator's, 64-byte aligned
  auto* xp = reinterpret_cast<uint32_t*>(xbuf.data_ptr());
  pack_x(g.xh, g.M, g.K, 0, MB, KB, xp);
  parallel_dynamic(0, (panels + group - 1) / group, [&](const auto& next) {
    static const TileConfig config;
    _tile_loadconfig(&config);
    const Tensor abuf = Tensor::empty({group * kPanel * lda}, DType::bf16), cbuf = Tensor::empty({chunk * 512}, DType::f32);
    auto* a = reinterpret_cast<uint16_t*>(abuf.data_ptr());
    for (int64_t gi = next(); gi >= 0; gi = next()) {
      const int64_t p0 = gi * group, p1 = std::min(panels, p0 + group);
      std::vector<int64_t> plain;
      for (int64_t i = 0; i < (p1 - p0) * kPanel; ++i) {
        const int64_t n = p0 * kPanel + i;
        if (n >= g.N)
          std::memset(a + i * lda, 0, size_t(lda) * 2);
        else if (!expand_row(values + n * K2, g.meta + n * K8, g.K, KB, a + i * lda, 32))
          plain.push_back(n);
      }
      for (int64_t mb0 = 0; mb0 < MB; mb0 += chunk)
        for (int64_t p = p0; p < p1; ++p)
          panel_product(a + (p - p0) * kPanel * lda, lda, xp, mb0, std::min(MB, mb0 + chunk), KB, p * kPanel, g, cbuf.data<float>());
      for (int64_t n : plain) plain_row(g, n);
    }
    _tile_release();
  });
}

// From kAmxM rows of x the tile unit beats the vector kernels (below it they read the weight's
// bytes as fast); values + meta only (a weight held only prepacked keeps its tile kernels).
constexpr int64_t kAmxM = 5;

const KernelDef kAmx[] = {
    {Kernel::amx_bf16, kOrderAmx,
     [](const Call& c) {
       return c.x == DType::bf16 && c.values == DType::bf16 && c.has_values() && c.M >= kAmxM && amx_ready();
     },
     run_amx, true},
};

}  // namespace

std::span<const KernelDef> amx_kernels() { return kAmx; }

}  // namespace sinter::sparse

#else
namespace sinter::sparse {
std::span<const KernelDef> amx_kernels() { return {}; }
}  // namespace sinter::sparse
#endif

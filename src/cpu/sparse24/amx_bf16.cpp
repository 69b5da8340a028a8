// bf16 x with bf16 values on AMX (Intel Xeon from Sapphire Rapids), where oneDNN's dense bf16 GEMM
// runs on the tile unit and the vector kernels cannot keep up from M = 16. Dense compute on 2:4
// bytes: panels of 32 weight rows expanded to bf16 (vpexpandw at the meta's kept columns) and run
// through TDPBF16PS against x^T, packed once per call: y^T = W x^T, 2 x 2 tiles of 16 x 16 sums.
// Up to 128 rows of x a panel is expanded a few blocks at a time into L1 (run_fused); above, a
// group of panels into L2 for every row block of x to pass over (run_group). docs/sparse.md.
#include "cpu/sparse24/kernels.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BW__) && defined(__AVX512VBMI2__) && defined(__linux__)
#include <array>
#include <cstdlib>

#include "cpu/simd/amx.h"
#include "cpu/simd/transpose.h"
#include "cpu/sparse24/kernel_common.h"

namespace sinter::sparse {
namespace {

constexpr int64_t kPanel = 32;          // weight rows a thread expands at a time (two A tiles)
constexpr int64_t kSliceBlocks = 64;    // blocks of 32 columns a panel is expanded at a time (2048 columns)
constexpr int64_t kGroupBytes = 1 << 20; // expanded weight slices a thread keeps (L2: 2 MiB a core)

// SINTER_SPARSE24_AMX=0 keeps bf16 2:4 calls on the vector kernels (SINTER_AMX=0 every kernel).
bool amx_ready() {
  static const bool ok = [] {
    if (const char* e = std::getenv("SINTER_SPARSE24_AMX"); e && std::string(e) == "0") return false;
    return cpu::simd::amx_ready();
  }();
  return ok;
}

// Tiles 0-3 the sums (weight rows 0-15 / 16-31 x rows of x 0-15 / 16-31), 4-5 the expanded
// weights, 6-7 x^T.
using cpu::simd::TileConfig;

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
  alignas(64) uint32_t masks[kSliceBlocks];  // all of them first: a mask read right after its vector store waits for it
  for (int64_t b0 = 0; b0 < K8; b0 += 64) {
    const __mmask64 valid = K8 - b0 >= 64 ? ~__mmask64(0) : (__mmask64(1) << (K8 - b0)) - 1;
    const __m512i m = _mm512_maskz_loadu_epi8(valid, meta + b0);
    const __m512i lo = _mm512_and_si512(m, low), hi = _mm512_and_si512(_mm512_srli_epi16(m, 4), low);
    const __m512i bits = _mm512_or_si512(_mm512_shuffle_epi8(bits_of, lo), _mm512_slli_epi16(_mm512_shuffle_epi8(bits_of, hi), 4));
    _mm512_store_si512(masks + b0 / 4, _mm512_maskz_mov_epi8(valid, bits));
    in_order &= _mm512_test_epi8_mask(_mm512_shuffle_epi8(order_of, lo), _mm512_shuffle_epi8(order_of, hi)) == valid;
  }
  for (int64_t kb = 0; kb < KB; ++kb) {
    // A plain load and the register form of the expansion (the memory form stalls the stream);
    // the last block of a row loads only its own values.
    const int64_t nv = std::min<int64_t>(16, K / 2 - 16 * kb);
    const __m256i vals = nv == 16 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + 16 * kb))
                                  : _mm256_maskz_loadu_epi16(__mmask16((1u << nv) - 1), v + 16 * kb);
    _mm512_storeu_si512(out + kb * stride, _mm512_maskz_expand_epi16(__mmask32(masks[kb]), _mm512_castsi256_si512(vals)));
  }
  return in_order;
}

// Weight row n's columns k0 .. k0 + kc (nkb blocks of 32, zero past kc) at out as bf16: expanded
// from 2:4 values and meta, or copied from a dense bf16 weight (Args::meta null: the dense
// linear's kernel, amx_dense_bf16). False where an expansion cannot reproduce the meta.
bool row_into(const Args& g, int64_t n, int64_t k0, int64_t kc, int64_t nkb, uint16_t* out) {
  const auto* v = static_cast<const uint16_t*>(g.values);
  if (g.meta) return expand_row(v + n * (g.K / 2) + k0 / 2, g.meta + n * (g.K / 8) + k0 / 8, kc, nkb, out, 32);
  for (int64_t kb = 0; kb < nkb; ++kb)
    _mm512_storeu_si512(out + 32 * kb, _mm512_maskz_loadu_epi16(cpu::simd::first_bits32(kc - 32 * kb), v + n * g.K + k0 + 32 * kb));
  return true;
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
    const float y = activate(sum * g.scales[n] + (g.bias ? g.bias[n] : 0.0f), g.act);
    if (g.yh)
      g.yh[m * g.N + n] = bf16(y).bits;
    else
      g.y[m * g.N + n] = y;
  }
}

using cpu::simd::transpose16;

// x^T in the B tiles' pair layout: tile (mb, kb) (1 KiB at out + (mb * KB + kb) * 256) holds in
// row r the pairs of columns 32 kb + 2r, + 1 of rows 16 mb .. + 15 of x; rows past M and columns
// past K zero. One 16 x 16 transpose per tile.
void pack_x(const uint16_t* x, int64_t M, int64_t K, int64_t MB, int64_t KB, uint32_t* out) {
  parallel_for(0, MB * KB, 64, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t mb = t / KB, kb = t % KB, cols = std::min<int64_t>(32, K - 32 * kb);
      const __mmask32 k = cols == 32 ? ~__mmask32(0) : (__mmask32(1) << cols) - 1;
      __m512i r[16];
      for (int m = 0; m < 16; ++m)
        r[m] = 16 * mb + m < M ? _mm512_maskz_loadu_epi16(k, x + (16 * mb + m) * K + 32 * kb) : _mm512_setzero_si512();
      transpose16(r);
      for (int i = 0; i < 16; ++i) _mm512_store_si512(out + t * 256 + 16 * i, r[i]);
    }
  });
}

// y[m0 + m][n0 + n] = act(scale[n] * c[n][m] + bias[n]) for the nv x mv corner of a 16 x 16 tile
// of sums (c: weight row n at c + 16 n), in f32 or straight to bf16 (Args::yh).
void store_tile(const float* c, int64_t nv, int64_t mv, const Args& g, int64_t m0, int64_t n0) {
  const __mmask16 k = __mmask16((1u << nv) - 1);
  const __m512 s = g.scales ? _mm512_maskz_loadu_ps(k, g.scales + n0) : _mm512_set1_ps(1.0f);
  const __m512 b = g.bias ? _mm512_maskz_loadu_ps(k, g.bias + n0) : _mm512_setzero_ps();
  __m512i r[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_load_si512(c + 16 * i);
  transpose16(r);
  for (int64_t m = 0; m < mv; ++m) {
    __m512 v = _mm512_fmadd_ps(_mm512_castsi512_ps(r[m]), s, b);
    if (g.act == Act::relu) v = _mm512_max_ps(v, _mm512_setzero_ps());
    if (g.act == Act::silu || g.act == Act::gelu) {
      alignas(64) float t[16];
      _mm512_store_ps(t, v);
      for (int64_t i = 0; i < nv; ++i) t[i] = activate(t[i], g.act);
      v = _mm512_load_ps(t);
    }
    const int64_t at = (m0 + m) * g.N + n0;
    if (g.yh)
      _mm256_mask_storeu_epi16(g.yh + at, k, (__m256i)_mm512_cvtneps_pbh(v));  // rounded to nearest even, as bf16(float)
    else
      _mm512_mask_storeu_ps(g.y + at, k, v);
  }
}

// Where a call's sums start: from zero, from c, or in the tiles already (a previous call's).
enum class Start { zero, load, held };

// Sums of a 32-row panel (A: rows at `a`, lda u16 apart, blocks of 32 columns from 0) against one
// or two blocks of 16 rows of x (B: tiles at b0, b1) over KB blocks: c + 512 j + 256 t holds weight
// rows 16t.. against x block j, stored there unless `store` is false (they stay in the tiles).
// `pf`: lines to ask L2 for meanwhile (the next rows of x), pf_lines per block. `between` runs
// after the products are issued, before the tile stores.
template <bool Two, class Between>
void tile_sums(const uint16_t* a, int64_t lda, const uint32_t* b0, const uint32_t* b1, int64_t KB, Start start, bool store,
               float* c, const char* pf, int pf_lines, const Between& between) {
  if (start == Start::zero) {
    _tile_zero(0);  // the tile intrinsics are statements (asm), one per line
    _tile_zero(1);
    if constexpr (Two) _tile_zero(2);
    if constexpr (Two) _tile_zero(3);
  } else if (start == Start::load) {
    _tile_loadd(0, c, 64);
    _tile_loadd(1, c + 256, 64);
    if constexpr (Two) _tile_loadd(2, c + 512, 64);
    if constexpr (Two) _tile_loadd(3, c + 768, 64);
  }
  for (int64_t kb = 0; kb < KB; ++kb) {
    if (pf)
      for (int l = 0; l < pf_lines; ++l) _mm_prefetch(pf + (kb * pf_lines + l) * 64, _MM_HINT_T1);
    _tile_loadd(4, a + 32 * kb, lda * 2);
    _tile_loadd(5, a + 16 * lda + 32 * kb, lda * 2);
    _tile_loadd(6, b0 + kb * 256, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 5, 6);
    if constexpr (Two) {
      _tile_loadd(7, b1 + kb * 256, 64);
      _tile_dpbf16ps(2, 4, 7);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  between();  // vector work for the core while the tile unit finishes the products issued above
  if (!store) return;
  _tile_stored(0, c, 64);
  _tile_stored(1, c + 256, 64);
  if constexpr (Two) _tile_stored(2, c + 512, 64);
  if constexpr (Two) _tile_stored(3, c + 768, 64);
}

// The sums of a panel (weight rows n ..) against blocks mb (and mb + 1 where `two`) of x, into y.
void store_pair(const Args& g, const float* sums, int64_t n, int64_t mb, bool two) {
  const int64_t nv0 = std::clamp<int64_t>(g.N - n, 0, 16), nv1 = std::clamp<int64_t>(g.N - n - 16, 0, 16);
  for (int j = 0; j < (two ? 2 : 1); ++j) {
    const int64_t m = 16 * (mb + j), mv = std::min<int64_t>(16, g.M - m);
    if (nv0 > 0) store_tile(sums + 512 * j, nv0, mv, g, m, n);
    if (nv1 > 0) store_tile(sums + 512 * j + 256, nv1, mv, g, m, n + 16);
  }
}

// The sums of a panel and pair of blocks of x waiting for store_pair: it runs while the tile unit
// works on the next ones (the tile stores wait for the unit's pipeline to drain, and the vector
// work would otherwise wait for the stores). The next call's `between` runs it before that call
// stores its own sums, so both may use one buffer.
struct Pending {
  const Args* g = nullptr;
  const float* sums = nullptr;
  int64_t n = 0, mb = 0;
  bool two = false;
  void flush() {
    if (sums) store_pair(*g, sums, n, mb, two);
    sums = nullptr;
  }
};

// Up to kFusedBlocks blocks of rows of x: each panel is expanded 8 blocks of columns at a time into
// an L1 buffer and multiplied at once (one pair of blocks of x: the sums stay in the tiles; more:
// they wait in `sums`, 1024 floats a pair, between). Expanding a whole panel into L2 first, the stores' line fills
// crowd out the weight stream's (12 against 20 GB/s a thread at M = 16), which only pays where
// many rows of x share the expansion.
constexpr int64_t kFusedXBytes = 1 << 20;  // x^T (whole, read by every panel) in L2: else the group path
constexpr int64_t kFusedBlocks = 8;  // to 128 rows of x; from there the group path (M = 256: 3.9 against 4.6 ms on 4096 x 4096)

void run_fused(const Args& g, const uint32_t* xp, int64_t KB, int64_t MB, int64_t p0, int64_t p1, float* sums, Pending& pending,
               std::vector<int64_t>& plain) {
  const int64_t K2 = g.K / 2, K8 = g.K / 8, pairs = (MB + 1) / 2;
  // 8 blocks at a time (an 18 KiB buffer, in L1), or all of K up to 32 blocks where several pairs
  // would otherwise keep their sums in memory between blocks (each wait drains the tile unit's
  // pipeline): 768 x 3072, M = 64, 0.23 against 0.25 ms; from K = 4096 the L1 buffer wins.
  const int64_t kBlocks = pairs == 1 || KB > 32 ? 8 : KB, lda = 32 * kBlocks + 32, kAhead = 2 * kBlocks;
  // Rows of values more than 8 KiB apart (K > 4096): the prefetchers lose the 32 streams and are
  // told two chunks ahead (11008 x 4096, M = 16, calls alternating with dense: 2.4 ms told, 3.4 not);
  // nearer, they follow them, and telling them costs (4096 x 4096: 0.62 ms not told, 0.92 told).
  const int64_t row_bytes = g.meta ? K2 * 2 : g.K * 2, block_bytes = g.meta ? 32 : 64;  // a row of values, a block's share of it
  const bool far_rows = row_bytes > 8192;
  alignas(64) uint16_t a[kPanel * (32 * 32 + 32)];  // up to 32 blocks
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t n0 = p * kPanel;
    uint32_t out_of_order = 0;  // a bit per row of the panel
    for (int64_t kb0 = 0; kb0 < KB; kb0 += kBlocks) {
      const int64_t nkb = std::min(kBlocks, KB - kb0), kc = std::min<int64_t>(32 * nkb, g.K - 32 * kb0);
      for (int64_t i = 0; i < kPanel; ++i) {
        const int64_t n = n0 + i;
        if (n >= g.N) {
          std::memset(a + i * lda, 0, sizeof(uint16_t) * lda);
          continue;
        }
        if (far_rows && kb0 + kAhead < KB) {  // 32 rows far apart: the prefetchers need to be told
          const auto* v = static_cast<const char*>(g.values) + (n * row_bytes + (kb0 + kAhead) * block_bytes);
          for (int64_t l = 0; l < nkb * block_bytes; l += 64) _mm_prefetch(v + l, _MM_HINT_T1);
          if (g.meta) _mm_prefetch(reinterpret_cast<const char*>(g.meta + n * K8 + 4 * (kb0 + kAhead)), _MM_HINT_T1);
        }
        if (!row_into(g, n, 32 * kb0, kc, nkb, a + i * lda)) out_of_order |= 1u << i;
      }
      for (int64_t q = 0; q < pairs; ++q) {
        const bool two = 2 * q + 1 < MB, first = kb0 == 0, last = kb0 + nkb >= KB;
        const uint32_t* b0 = xp + (2 * q * KB + kb0) * 256;
        float* c = sums + 1024 * q;
        const Start start = first ? Start::zero : pairs > 1 ? Start::load : Start::held;
        const auto between = [&] { pending.flush(); };
        if (two)
          tile_sums<true>(a, lda, b0, b0 + KB * 256, nkb, start, pairs > 1 || last, c, nullptr, 0, between);
        else
          tile_sums<false>(a, lda, b0, nullptr, nkb, start, pairs > 1 || last, c, nullptr, 0, between);
        if (last) pending = {&g, c, n0, 2 * q, two};
      }
    }
    for (int i = 0; i < kPanel; ++i)
      if (out_of_order >> i & 1) plain.push_back(n0 + i);
  }
}

// The work of one thread's group of panels: expanded a slice of columns at a time (kSliceBlocks
// blocks of 32, so the group stays in L2), each slice met by every pair of blocks of rows of x in
// turn, a pair's rows of x (from L3, the first time) then serving every panel of the group from L2.
struct Group {
  const Args& g;
  const uint32_t* xp;
  int64_t KB, MB, lda, n0, panels;
  uint16_t* a;  // panels x 32 rows, lda apart
  float* c;     // the sums between slices: per pair of blocks of x, per panel, four tiles
};

void run_group(const Group& w, Pending& pending, std::vector<int64_t>& plain) {
  const Args& g = w.g;
  alignas(64) float tile[1024];  // one slice: the sums, which no later slice needs
  for (int64_t kb0 = 0; kb0 < w.KB; kb0 += kSliceBlocks) {
    const int64_t nkb = std::min(kSliceBlocks, w.KB - kb0), k0 = 32 * kb0, kc = std::min<int64_t>(32 * nkb, g.K - k0);
    const bool first = kb0 == 0, last = kb0 + nkb == w.KB;
    for (int64_t i = 0; i < w.panels * kPanel; ++i) {
      const int64_t n = w.n0 + i;
      if (n >= g.N)
        std::memset(w.a + i * w.lda, 0, size_t(w.lda) * 2);
      else if (!row_into(g, n, k0, kc, nkb, w.a + i * w.lda))
        plain.push_back(n);  // in any slice (a row may come twice: run_amx keeps one)
    }
    for (int64_t mb = 0; mb < w.MB; mb += 2) {
      const bool two = mb + 1 < w.MB;
      const uint32_t* b0 = w.xp + (mb * w.KB + kb0) * 256;
      const char* pf = mb + 2 < w.MB ? reinterpret_cast<const char*>(w.xp + ((mb + 2) * w.KB + kb0) * 256) : nullptr;
      const int pf_lines = int(std::max<int64_t>(1, 32 / w.panels));  // the next pair's 2 KiB a block over the group's passes
      for (int64_t p = 0; p < w.panels; ++p) {
        float* sums = first && last ? tile : w.c + ((mb / 2) * w.panels + p) * 1024;
        const char* pfp = pf ? pf + p * pf_lines * nkb * 64 : nullptr;
        const Start start = first ? Start::zero : Start::load;
        const auto between = [&] { pending.flush(); };
        if (two)
          tile_sums<true>(w.a + p * kPanel * w.lda, w.lda, b0, b0 + w.KB * 256, nkb, start, true, sums, pfp, pf_lines, between);
        else
          tile_sums<false>(w.a + p * kPanel * w.lda, w.lda, b0, nullptr, nkb, start, true, sums, pfp, pf_lines, between);
        if (last) pending = {&g, sums, w.n0 + p * kPanel, mb, two};
      }
    }
  }
  pending.flush();  // before `tile` goes
}

// Threads take groups of panels (rows of W); x is packed whole beforehand.
void run_amx(const Args& g) {
  if (g.M == 0 || g.N == 0) return;
  const int64_t KB = (g.K + 31) / 32, MB = (g.M + 15) / 16, panels = (g.N + kPanel - 1) / kPanel;
  const int64_t slice = std::min(KB, kSliceBlocks), lda = 32 * slice + 32;  // one line more: a tile's 16 rows fall in different sets
  const int64_t group = std::clamp<int64_t>(kGroupBytes / (kPanel * lda * 2), 1, std::max<int64_t>(1, panels / (8 * num_threads())));
  const Tensor xbuf = Tensor::empty({MB * KB * 256}, DType::f32);  // the caching allocator's, 64-byte aligned
  auto* xp = reinterpret_cast<uint32_t*>(xbuf.data_ptr());
  pack_x(g.xh, g.M, g.K, MB, KB, xp);
  const bool fused = MB <= 2 || (MB <= kFusedBlocks && MB * KB * 1024 <= kFusedXBytes);
  const int64_t pairs = (MB + 1) / 2;
  parallel_dynamic(0, (panels + group - 1) / group, [&](const auto& next) {
    static const TileConfig config;
    _tile_loadconfig(&config);
    // The sums between blocks (fused: a pair's; grouped: a pair's per panel, where K takes several
    // slices) and the group's expanded rows.
    const Tensor cbuf = Tensor::empty({fused ? pairs * 1024 : KB > slice ? pairs * group * 1024 : 1}, DType::f32);
    const Tensor abuf = Tensor::empty({fused ? 1 : group * kPanel * lda}, DType::bf16);
    std::vector<int64_t> plain;
    Pending pending;
    for (int64_t gi = next(); gi >= 0; gi = next()) {
      const int64_t p0 = gi * group, np = std::min(panels, p0 + group) - p0;
      if (fused)
        run_fused(g, xp, KB, MB, p0, p0 + np, cbuf.data<float>(), pending, plain);
      else
        run_group({g, xp, KB, MB, lda, p0 * kPanel, np, reinterpret_cast<uint16_t*>(abuf.data_ptr()), cbuf.data<float>()}, pending, plain);
    }
    pending.flush();
    _tile_release();
    std::sort(plain.begin(), plain.end());
    plain.erase(std::unique(plain.begin(), plain.end()), plain.end());
    for (int64_t n : plain) plain_row(g, n);
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
     run_amx, true, false, true},
};

}  // namespace

std::span<const KernelDef> amx_kernels() { return kAmx; }

bool amx_dense_bf16(const uint16_t* x, const uint16_t* w, const float* bias, uint16_t* y, int64_t M, int64_t N, int64_t K) {
  if (!cpu::simd::amx_ready()) return false;
  run_amx(Args{nullptr, x, M, K, N, w, DType::bf16, nullptr, nullptr, nullptr, bias, Act::none, nullptr, y});
  return true;
}

}  // namespace sinter::sparse

#else
namespace sinter::sparse {
std::span<const KernelDef> amx_kernels() { return {}; }
bool amx_dense_bf16(const uint16_t*, const uint16_t*, const float*, uint16_t*, int64_t, int64_t, int64_t) { return false; }
}  // namespace sinter::sparse
#endif

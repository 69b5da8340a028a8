// 2:4 K-major kernel (AVX2 / AVX-512, the rows the tiles leave): x as column-major panels, each
// kept value broadcast against its column of x, picked by address; and the same over the 8-row
// prepacked layout in place.
#include "cpu/sparse24/kernel_common.h"
#include <utility>

namespace sinter::sparse {

#if defined(__AVX2__)
namespace {

// A meta byte's four kept columns as byte offsets into a column-major panel of x (ColBytes a column).
template <int ColBytes> struct PanelOffsets {  // 16 bits each
  uint64_t at[256];
  PanelOffsets() {
    for (int b = 0; b < 256; ++b) {
      int off[4];
      byte_offsets(uint8_t(b), off);
      at[b] = 0;
      for (int t = 0; t < 4; ++t) at[b] |= uint64_t(off[t] * ColBytes) << (16 * t);
    }
  }
};

// One register of a K-major panel's rows: 8 floats with AVX2, 16 with AVX-512. Zen 5 runs a zmm
// FMA at the rate of a ymm one, so there the 16-float kernel does twice the multiply-adds a cycle:
// measured (Zen 5, 2 threads, 4096 x 11008, alternating in one process) 1.49x the ymm
// kernel at M = 128 and 1.68x at M = 512; 128-row panels (8 registers) ran 1.05-1.08x 64-row ones
// (4 registers, two weight rows side by side). On Zen 4 zmm and ymm were even.
#if defined(__AVX512F__)
struct KmVec {
  using T = __m512;
  static constexpr int L = 16;
  static SINTER_INLINE T load(const float* p) { return _mm512_load_ps(p); }
  static SINTER_INLINE void store(float* p, T v) { _mm512_store_ps(p, v); }
  static SINTER_INLINE T bcast(const float* p) { return _mm512_set1_ps(*p); }
  static SINTER_INLINE T fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
};
#else
struct KmVec {
  using T = __m256;
  static constexpr int L = 8;
  static SINTER_INLINE T load(const float* p) { return _mm256_load_ps(p); }
  static SINTER_INLINE void store(float* p, T v) { _mm256_store_ps(p, v); }
  static SINTER_INLINE T bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static SINTER_INLINE T fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
};
#endif
constexpr int kKmPanelVecs = 8;  // registers of rows per full panel: 64 rows (AVX2) or 128 (AVX-512)

// x packed as column-major panels of PV registers of rows (the last panel NV registers wide), so
// a kept value (n, k) multiplies the NV registers of column k: one broadcast and NV loads feeding
// NV FMAs, the column found by address (PanelOffsets) on the load ports, not by a permute sharing
// the FMA pipes. Each thread packs its weight rows one 64-column block at a time (as f32, then the
// meta bytes) just before the panels pass over it, the next block requested meanwhile. Measured
// (2 threads, the three bench shapes) against the permute tiles: M = 32-64 1.1-1.4x, 128
// 1.25-1.38x, 512 1.27-1.52x, 2048 1.26-1.61x; whole-chunk packing ran 0.92-0.96x this (Zen 5),
// and reading the blocks in place (short runs over many rows) 0.6-0.7x the tiles.
constexpr int64_t kKmCols = 64;                  // columns per block: 8 meta bytes
constexpr int64_t kKmRowFloats = kKmCols / 2 + 2;  // a row's block: 32 values, then 8 meta bytes (2 floats)

// R consecutive rows of a packed block (for narrow panels one row's NV accumulators alone would
// wait on the FMA latency, so R rows run side by side).
template <class Vec, int R, int NV>
SINTER_INLINE void k_major_row(const float* wr, const float* xb, float* acc_out) {
  constexpr int PW = Vec::L * NV;
  static const PanelOffsets<PW * 4> tab;
  typename Vec::T a[R][NV];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < NV; ++u) a[r][u] = Vec::load(acc_out + PW * r + Vec::L * u);
  // Every column offset of the block is looked up before the first FMA: the FMAs' loads then wait
  // on no load of meta or table (measured on Zen 5: 15-20% faster than looking each up in turn).
  uint64_t o[R][kKmCols / 8];
  for (int r = 0; r < R; ++r) {
    const uint8_t* mb = reinterpret_cast<const uint8_t*>(wr + r * kKmRowFloats + kKmCols / 2);
#pragma GCC unroll 8
    for (int i = 0; i < kKmCols / 8; ++i) o[r][i] = tab.at[mb[i]];
  }
  const char* x = reinterpret_cast<const char*>(xb);
#pragma GCC unroll 8
  for (int i = 0; i < kKmCols / 8; ++i, x += 8 * PW * 4) {
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const float* w = wr + r * kKmRowFloats;
#pragma GCC unroll 4
      for (int t = 0; t < 4; ++t) {
        const float* xr = reinterpret_cast<const float*>(x + ((o[r][i] >> (16 * t)) & 0xffff));
        const typename Vec::T v = Vec::bcast(w + 4 * i + t);
#pragma GCC unroll 8
        for (int u = 0; u < NV; ++u) a[r][u] = Vec::fma(v, Vec::load(xr + Vec::L * u), a[r][u]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < NV; ++u) Vec::store(acc_out + PW * r + Vec::L * u, a[r][u]);
}

// Rows [0, nr) of a packed chunk over one block of a panel NV registers wide; acc: nr x NV L
// floats. The next block of x (`lines` cache lines at `next`) is requested a few lines per row.
template <class Vec, int NV, int Chains>
void k_major_rows(const float* wb, int64_t nr, const float* xb, float* acc, const char* next, int64_t lines) {
  constexpr int R = NV >= Chains ? 1 : (Chains + NV - 1) / NV;
  const int64_t per_row = (lines + nr - 1) / std::max<int64_t>(nr, 1);
  int64_t r = 0;
  for (; r < nr; r += R) {
    for (int64_t l = r * per_row; next && l < std::min(lines, (r + R) * per_row); ++l) _mm_prefetch(next + 64 * l, _MM_HINT_T0);
    if (r + R > nr) break;
    k_major_row<Vec, R, NV>(wb + r * kKmRowFloats, xb, acc + r * Vec::L * NV);
  }
  for (; r < nr; ++r) k_major_row<Vec, 1, NV>(wb + r * kKmRowFloats, xb, acc + r * Vec::L * NV);
}

// x (M, K) as column-major panels of PW rows (panel p at data + p PW Kp: Kp columns of its width,
// the last panel L nv_last rows wide), rows past M and columns past K zero: the K-major kernels' x.
struct ColumnPanels {
  int64_t full, nv_last, P, PW, L;
  Tensor buf;  // caching allocator: 64-byte aligned
  float* data;
  int64_t width(int64_t p) const { return p < full ? PW : L * nv_last; }
  ColumnPanels(const float* x, int64_t M, int64_t K, int64_t Kp, int64_t L_, int64_t PW_)
      : full(M / PW_), nv_last((M % PW_ + L_ - 1) / L_), P(full + (M % PW_ > 0)), PW(PW_), L(L_),
        buf(Tensor::empty({Kp * (full * PW_ + L_ * nv_last)}, DType::f32)), data(buf.data<float>()) {
    parallel_for(0, P, 1, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t pw = width(p), m0 = p * PW;
        float* d = data + p * PW * Kp;
        for (int64_t k0 = 0; k0 < Kp; k0 += 8)  // 8 columns at a time: a cache line of each row of x
          for (int64_t r = 0; r < pw; ++r) {
            const float* src = m0 + r < M ? x + (m0 + r) * K : nullptr;
            for (int64_t k = k0; k < k0 + 8; ++k) d[k * pw + r] = src && k < K ? src[k] : 0.0f;
          }
      }
    });
  }
};

template <class Vec, int PV, int Chains, class V>
void k_major(const float* x, int64_t M, int64_t K, const V* values, const uint8_t* meta, const float* scales, const float* bias,
             Act act, float* y, int64_t N) {
  constexpr int64_t L = Vec::L, PW = L * PV;  // rows of x per full panel
  const int64_t KB = (K + kKmCols - 1) / kKmCols, Kp = KB * kKmCols;  // x padded with zero columns to whole blocks
  const ColumnPanels xs(x, M, K, Kp, L, PW);
  const int64_t full = xs.full, nv_last = xs.nv_last, P = xs.P;
  const auto panel_width = [&](int64_t p) { return xs.width(p); };
  const float* xp = xs.data;
  // Weight rows per chunk: each chunk reads all of x once, so more rows when x is large, but at
  // least four chunks per thread. Measured (Zen 5, 4096 x 11008, alternating) with the
  // weights packed a block at a time: 32 / 64 / 128 / 256 rows at M = 128 26.0 / 22.7 / 22.5 / 22.2
  // ms, at M = 2048 366 / 335 / 318 / 308 ms. On the same machine the AVX2 build's K-major kernel
  // (whole chunks packed first and 64 rows at M = 128 before) went from 38-41 to 36-38 ms at
  // M = 128 and from 144-162 to 130-144 at M = 512 (separate processes, alternated three times).
  const int64_t want = M <= 256 ? 128 : 256;
  const int64_t NC = std::max<int64_t>(8, std::min(want, (N / (4 * num_threads()) + 7) / 8 * 8));
  const int64_t chunks = (N + NC - 1) / NC, K2 = K / 2, K8 = K / 8;
  parallel_dynamic(0, chunks, [&](const auto& next) {
    Tensor w_buf = Tensor::empty({NC * kKmRowFloats}, DType::f32);  // one block of the chunk's rows
    Tensor acc_buf = Tensor::empty({(full * PW + L * nv_last) * NC}, DType::f32);  // per panel p: NC rows x its width
    float* wp = w_buf.data<float>();
    float* acc = acc_buf.data<float>();
    for (int64_t c; (c = next()) >= 0;) {
      const int64_t n0 = c * NC, nr = std::min(NC, N - n0);
      // Block kb of the chunk's rows as f32 (32 values, then 8 meta bytes a row), packed just
      // before the panels pass over it, so it stays in L1; its lines were requested while the
      // previous block computed (request), so the packing does not wait on memory.
      const auto pack = [&](int64_t kb) {
        const int64_t k0 = kb * kKmCols, kc = std::min<int64_t>(kKmCols, K - k0);
        for (int64_t r = 0; r < nr; ++r) {
          const V* vs = values + (n0 + r) * K2 + k0 / 2;
          const uint8_t* ms = meta + (n0 + r) * K8 + k0 / 8;
          float* d = wp + r * kKmRowFloats;
          if (kc == kKmCols) {
            for (int64_t i = 0; i < kKmCols / 2; i += 8) _mm256_storeu_ps(d + i, (__m256)load_values(vs + i));
            std::memcpy(d + kKmCols / 2, ms, size_t(kKmCols / 8));
          } else {  // the last, partial block: zero values and meta past K (they pick padded zero columns)
            std::memset(d, 0, kKmRowFloats * sizeof(float));
            for (int64_t i = 0; i < kc / 2; ++i) d[i] = float(vs[i]);
            std::memcpy(d + kKmCols / 2, ms, size_t(kc / 8));
          }
        }
      };
      const auto request = [&](int64_t kb) {
        const int64_t k0 = kb * kKmCols;
        for (int64_t r = 0; r < nr; ++r) {
          const char* vs = reinterpret_cast<const char*>(values + (n0 + r) * K2 + k0 / 2);
          for (int64_t o = 0; o < int64_t(kKmCols / 2 * sizeof(V)); o += 64) _mm_prefetch(vs + o, _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(meta + (n0 + r) * K8 + k0 / 8), _MM_HINT_T0);
        }
      };
      std::memset(acc, 0, size_t(acc_buf.numel()) * sizeof(float));
      for (int64_t kb = 0; kb < KB; ++kb) {
        pack(kb);
        if (kb + 1 < KB) request(kb + 1);
        for (int64_t p = 0; p < P; ++p) {
          const int64_t pw = panel_width(p);
          const int64_t np = p + 1 < P ? p + 1 : 0, nkb = p + 1 < P ? kb : kb + 1;  // the block after this one
          const float* next = nkb < KB ? xp + np * PW * Kp + nkb * kKmCols * panel_width(np) : nullptr;
          with_1_to_8(int(pw / L), [&](auto NV) {
            k_major_rows<Vec, NV, Chains>(wp, nr, xp + p * PW * Kp + kb * kKmCols * pw, acc + p * PW * NC,
                                                   reinterpret_cast<const char*>(next), kKmCols * panel_width(np) * 4 / 64);
          });
        }
      }
      panel_epilogue(acc, M, PW, NC, panel_width, n0, nr, scales, bias, act, y, N);
    }
  });
}

#if !defined(SINTER_TILES16)
// K-major over the 8-row prepacked layout (f32 values; kernels.h): a block of 8 rows x 32
// columns holds row r's kept value j at 8 j + r and its meta word at r, so a kept value is
// broadcast from where it lies and picks its column of x (a column-major panel) by address, with
// no packing pass: the prepacked weight may be the only copy a server holds. The columns' byte
// offsets are computed eight rows at a time per block (kmp_offsets) and shared by the group's
// row sets. On Zen 3 the permute tiles (tiles8.cpp) share the FMA pipes with their vpermilps;
// this kernel's selection runs on the load ports: 1.03-1.13x the tiles at M = 24-128 (kernels.h).
constexpr int kKmpBlocks = 2;  // 32-column blocks per pass of a row set: x's 64 columns stay in L1

// Byte offsets into a panel block (ColBytes a column) of the kept values of nb blocks: off[q][j][r]
// for row r's kept value j, computed eight rows at a time from the meta words; 16 bits each, so
// one load brings four rows' offsets (at M = 16 the tiles' speed, against 0.92-0.95x with 32).
template <int ColBytes> SINTER_INLINE void kmp_offsets(const uint8_t* blk, int nb, uint16_t (*off)[16][8]) {
  for (int q = 0; q < nb; ++q, blk += kBlockBytes<float>) {
    const __m256i W8 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk));
    const __m256i three = _mm256_set1_epi32(3);
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) {
      const __m256i nib = _mm256_and_si256(_mm256_srli_epi32(W8, 2 * j), three);
      const __m256i col = _mm256_add_epi32(nib, _mm256_set1_epi32(4 * (j / 2) + 32 * q));
      const __m256i o = _mm256_mullo_epi32(col, _mm256_set1_epi32(ColBytes));
      _mm_store_si128(reinterpret_cast<__m128i*>(off[q][j]), _mm_packus_epi32(_mm256_castsi256_si128(o), _mm256_extracti128_si256(o, 1)));
    }
  }
}

template <class Vec, int R, int NV, int r0>
SINTER_INLINE void kmp_rows(const uint8_t* blk, int nb, const char* xb, const uint16_t (*off)[16][8], float* acc) {
  constexpr int PW = Vec::L * NV;
  typename Vec::T a[R][NV];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < NV; ++u) a[r][u] = Vec::load(acc + PW * r + Vec::L * u);
  for (int q = 0; q < nb; ++q, blk += kBlockBytes<float>) {
    const float* vals = reinterpret_cast<const float*>(blk + 32) + r0;
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) {
      uint64_t o4[(R + 3) / 4] = {};  // four rows' offsets a load
      std::memcpy(o4, &off[q][j][r0], R * sizeof(uint16_t));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const typename Vec::T v = Vec::bcast(vals + 8 * j + r);
        const float* xr = reinterpret_cast<const float*>(xb + ((o4[r / 4] >> (16 * (r % 4))) & 0xffff));
#pragma GCC unroll 8
        for (int u = 0; u < NV; ++u) a[r][u] = Vec::fma(v, Vec::load(xr + Vec::L * u), a[r][u]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < NV; ++u) Vec::store(acc + PW * r + Vec::L * u, a[r][u]);
}

// The 8 rows of a group over nb blocks, R rows at a time: R NV accumulators hide the FMA latency.
template <class Vec, int NV>
void kmp_group(const uint8_t* blk, int nb, const char* xb, float* acc) {
  constexpr int R = NV == 1 ? 8 : NV <= 3 ? 4 : NV < 8 ? 2 : 1, PW = Vec::L * NV;
  alignas(32) uint16_t off[kKmpBlocks][16][8];
  kmp_offsets<PW * 4>(blk, nb, off);
  [&]<int... s>(std::integer_sequence<int, s...>) {
    (kmp_rows<Vec, R, NV, s * R>(blk, nb, xb, off, acc + s * R * PW), ...);
  }(std::make_integer_sequence<int, 8 / R>{});
}

void k_major_prepacked(const float* x, int64_t M, int64_t K, const uint8_t* packed, const float* scales, const float* bias, Act act,
                       float* y, int64_t N) {
  using Vec = KmVec;
  constexpr int64_t L = Vec::L, PW = L * kKmPanelVecs;
  const int64_t Q = (K + 31) / 32, Kp = Q * 32;
  const ColumnPanels xs(x, M, K, Kp, L, PW);
  const int64_t full = xs.full, nv_last = xs.nv_last, P = xs.P;
  const auto panel_width = [&](int64_t p) { return xs.width(p); };
  const float* xp = xs.data;
  const int64_t chunk = 8 * kTilesRowGroups, chunks = (N + chunk - 1) / chunk, kblocks = (Q + kTilesQb - 1) / kTilesQb;
  parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    Tensor acc_buf = Tensor::empty({(full * PW + L * nv_last) * chunk}, DType::f32);  // panel p: chunk rows x its width
    float* acc = acc_buf.data<float>();
    for (int64_t ch = c0; ch < c1; ++ch) {
      const int64_t n0 = ch * chunk, nr = std::min(chunk, N - n0), groups = (nr + 7) / 8;
      std::memset(acc, 0, size_t(acc_buf.numel()) * sizeof(float));
      for (int64_t kb = 0; kb < kblocks; ++kb) {
        const int64_t q0 = kb * kTilesQb, nq = std::min(kTilesQb, Q - q0);
        for (int64_t b = 0; b < groups; ++b) {
          const uint8_t* g = packed + prepacked_at<float>(N, K, ch, b, q0);
          for (int64_t q = 0; q < nq; q += kKmpBlocks) {
            const int nb = int(std::min<int64_t>(kKmpBlocks, nq - q));
            // the weight is one stream per thread: request the blocks a group ahead
            for (int64_t l = 0; l < nb * kBlockBytes<float>; l += 64)
              _mm_prefetch(reinterpret_cast<const char*>(g) + (nq + q) * kBlockBytes<float> + l, _MM_HINT_T0);
            for (int64_t p = 0; p < P; ++p) {
              const int64_t pw = panel_width(p);
              const char* xb = reinterpret_cast<const char*>(xp + p * PW * Kp + (q0 + q) * 32 * pw);
              float* a = acc + p * PW * chunk + 8 * b * pw;
              with_1_to_8(int(pw / L), [&](auto NV) { kmp_group<Vec, NV>(g + q * kBlockBytes<float>, nb, xb, a); });
            }
          }
        }
      }
      panel_epilogue(acc, M, PW, chunk, panel_width, n0, nr, scales, bias, act, y, N);
    }
  });
}
#endif  // the 8-row prepacked layout

void run_k_major(const Args& a) {
  if (a.M == 0 || a.N == 0) return;
  switch (a.vt) {
    case DType::f32: return k_major<KmVec, kKmPanelVecs, 8>(a.x, a.M, a.K, static_cast<const float*>(a.values), a.meta, a.scales, a.bias, a.act, a.y, a.N);
    case DType::bf16: return k_major<KmVec, kKmPanelVecs, 8>(a.x, a.M, a.K, static_cast<const bf16*>(a.values), a.meta, a.scales, a.bias, a.act, a.y, a.N);
    case DType::i8: return k_major<KmVec, kKmPanelVecs, 8>(a.x, a.M, a.K, static_cast<const int8_t*>(a.values), a.meta, a.scales, a.bias, a.act, a.y, a.N);
    default: return plain_rows(a.x, a.M, a.K, [&](int64_t i) { return value_at(a.values, a.vt, i); }, a.meta, a.scales, a.bias, a.act, a.y, a.N);
  }
}

// From values + meta: every M the tiles leave (M > kSmallM past their range).
const KernelDef kKMajor[] = {
    {Kernel::k_major, kOrderKMajor, [](const Call& c) { return c.has_values() && c.M > kSmallM; }, run_k_major},
};

}  // namespace

std::span<const KernelDef> k_major_kernels() { return kKMajor; }

#if !defined(SINTER_TILES16)
namespace {

void run_k_major_prepacked(const Args& a) {
  if (a.M > 0 && a.N > 0) k_major_prepacked(a.x, a.M, a.K, a.packed, a.scales, a.bias, a.act, a.y, a.N);
}

// f32 values prepacked in the 8-row layout at kKmpMinM <= M <= kKmpMaxM: read in place instead of
// by the permute tiles. Zen 3, 2 threads, the three `sinter bench sparse` shapes, one-copy
// weights, the two alternating in one process: M = 24-64 1.03-1.12x the tiles' speed, 128
// 1.09-1.13x; M = 8 0.71-0.75x, 16 0.98-1.02x, 20 0.88-0.92x; M = 512 0.89-1.05x.
constexpr int64_t kKmpMinM = 24, kKmpMaxM = 128;

const KernelDef kKMajorPrepacked[] = {
    {Kernel::k_major_prepacked8, kOrderPrepacked,
     [](const Call& c) {
       return pack_format().id == kPack8Rows && c.values == DType::f32 && c.M >= kKmpMinM && c.M <= kKmpMaxM &&
              (c.packed_only || (c.prepacked && prepacked_serves(c.values, c.M)));
     },
     run_k_major_prepacked, false, true},
};

}  // namespace

std::span<const KernelDef> k_major_prepacked8_kernels() { return kKMajorPrepacked; }
#else
std::span<const KernelDef> k_major_prepacked8_kernels() { return {}; }
#endif

#else
std::span<const KernelDef> k_major_kernels() { return {}; }
std::span<const KernelDef> k_major_prepacked8_kernels() { return {}; }
#endif

}  // namespace sinter::sparse

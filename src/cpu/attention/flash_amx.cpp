// FlashAttention-2 forward for bf16 q, k and v on AMX tiles (Intel Xeon from Sapphire Rapids):
// S = Q K^T and O += P V by TDPBF16PS with f32 sums, the online softmax on AVX-512 between them
// (scores in log2 units, as flash_forward_f32's). K and V are packed once per call into the tiles'
// pair layout (K^T: pairs of head dims per key; V: pairs of keys per head dim), zero past their
// ends, so any head dims run; each job (32 query rows of one kv head, the group's heads stacked as
// in flash_forward_f32) packs its Q. P is rounded to bf16 for P V; the row sums stay f32.
#include "cpu/attention/flash.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__linux__)
#include "core/parallel.h"
#include "cpu/attention/flash_exp2.h"
#include "cpu/attention/amx_tiles.h"
#include "cpu/simd/amx.h"

namespace sinter::detail {
namespace {

constexpr int64_t kRows = 32;  // query rows a job: two A tiles
constexpr int64_t kKeys = 128; // keys a softmax step: four passes of 32 through the tiles
static_assert(kKeys / 32 == kRows / 8, "a step issues one pass of the next step's scores per 8 rows of exponentials");

// K and V of every (batch, kv head) in the tiles' pair layout. K^T tile (key block of 16, head
// dims 32 kd..): row i holds, per key, head dims 2i and 2i + 1. V tile (key block of 32, head dims
// 16 dt..): row i holds, per head dim, keys 2i and 2i + 1.
struct PackedKV {
  int64_t DC, DT, KT, KC;  // 32-dim chunks of D, 16-dim tiles of Dv, 16-key and 32-key blocks
  Tensor kbuf, vbuf;       // the caching allocator's, 64-byte aligned: a tile row split across two lines loads 3x slower
  uint16_t *k, *v;
  const uint16_t* k_tile(int64_t bh, int64_t kt, int64_t kd) const { return k + ((bh * KT + kt) * DC + kd) * kTile; }
  const uint16_t* v_tile(int64_t bh, int64_t kc, int64_t dt) const { return v + ((bh * KC + kc) * DT + dt) * kTile; }
};

PackedKV pack_kv(const Geometry& g, const bf16* k, const bf16* v) {
  PackedKV p{(g.D + 31) / 32, (g.Dv + 31) / 32 * 2, (g.Lkv + 31) / 32 * 2, (g.Lkv + 31) / 32, {}, {}, nullptr, nullptr};
  const int64_t BH = g.B * g.Hkv;
  p.kbuf = Tensor::empty({BH * p.KT * p.DC * kTile}, DType::bf16), p.vbuf = Tensor::empty({BH * p.KC * p.DT * kTile}, DType::bf16);
  p.k = reinterpret_cast<uint16_t*>(p.kbuf.data_ptr()), p.v = reinterpret_cast<uint16_t*>(p.vbuf.data_ptr());
  parallel_for(0, BH * p.KC, 4, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t bh = t / p.KC, kc = t % p.KC, b = bh / g.Hkv, hk = bh % g.Hkv;
      const auto* K = reinterpret_cast<const uint16_t*>(g.lk.at(k, b, hk, 0));
      const auto* V = reinterpret_cast<const uint16_t*>(g.lv.at(v, b, hk, 0));
      auto k_row = [&](int64_t n) { return n < g.Lkv ? K + n * g.lk.r : nullptr; };
      auto v_row = [&](int64_t n) { return n < g.Lkv ? V + n * g.lv.r : nullptr; };
      for (int64_t kt = 2 * kc; kt < 2 * kc + 2; ++kt) pack_column_pairs(k_row, 16 * kt, g.D, p.k + (bh * p.KT + kt) * p.DC * kTile);
      pack_row_pairs(v_row, 32 * kc, g.Dv, p.v + (bh * p.KC + kc) * p.DT * kTile);
    }
  });
  return p;
}

// A thread's buffers, grown to the call's head dims: Q (rows x Dp bf16), the scores S (rows x
// kKeys), P in bf16 (the A tiles of P V) and the output sums (rows x Dvp).
struct Scratch {
  AlignedBuffer q, p, s, acc;
};

// Pass h of S (kRows x kKeys, f32) for keys j0..: keys j0 + 32 h .. + 31. Tiles 0-3 the sums,
// 4-5 Q, 6-7 K^T.
void scores_pass(const PackedKV& p, int64_t bh, const uint16_t* q, int64_t Dp, int64_t j0, int64_t h, float* s) {
  const int64_t kt = (j0 + 32 * h) / 16;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t kd = 0; kd < p.DC; ++kd) {
    _tile_loadd(4, q + 32 * kd, Dp * 2);
    _tile_loadd(5, q + 16 * Dp + 32 * kd, Dp * 2);
    _tile_loadd(6, p.k_tile(bh, kt, kd), 64);
    _tile_loadd(7, p.k_tile(bh, kt + 1, kd), 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  float* sh = s + 32 * h;
  _tile_stored(0, sh, kKeys * 4);
  _tile_stored(1, sh + 16, kKeys * 4);
  _tile_stored(2, sh + 16 * kKeys, kKeys * 4);
  _tile_stored(3, sh + 16 * kKeys + 16, kKeys * 4);
}

// acc (kRows x Dvp) += P (kRows x 32 passes keys, bf16) V: tiles 0-3 the sums, 4-5 P, 6-7 V.
void accumulate(const PackedKV& p, int64_t bh, const uint16_t* pb, int64_t j0, int64_t passes, float* acc, int64_t Dvp) {
  for (int64_t dc = 0; dc < Dvp / 32; ++dc) {
    float* a = acc + 32 * dc;
    _tile_loadd(0, a, Dvp * 4);
    _tile_loadd(1, a + 16, Dvp * 4);
    _tile_loadd(2, a + 16 * Dvp, Dvp * 4);
    _tile_loadd(3, a + 16 * Dvp + 16, Dvp * 4);
    for (int64_t h = 0; h < passes; ++h) {
      const int64_t kc = j0 / 32 + h;
      _tile_loadd(4, pb + 32 * h, kKeys * 2);
      _tile_loadd(5, pb + 16 * kKeys + 32 * h, kKeys * 2);
      _tile_loadd(6, p.v_tile(bh, kc, 2 * dc), 64);
      _tile_loadd(7, p.v_tile(bh, kc, 2 * dc + 1), 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, a, Dvp * 4);
    _tile_stored(1, a + 16, Dvp * 4);
    _tile_stored(2, a + 16 * Dvp, Dvp * 4);
    _tile_stored(3, a + 16 * Dvp + 16, Dvp * 4);
  }
}

// The online softmax of one step over keys j0 .. j0 + cols for the job's rows: S in, P (bf16, 0
// outside each row's visible keys [lo, hi)) out; the running max m, the lanes of the running
// sums l and the output sums acc rescaled. c: scale log2(e) (the mask pass, where there is a
// mask, has applied it already and c is 1). Rows with nothing visible yet keep P = 0.
struct Step {
  float *s, *m, *l, *acc, *row_max;
  uint16_t* p;
  const int64_t *lo, *hi;
  int64_t rows, Dvp;
  float c;
};
constexpr int kRegs = kKeys / 16;

// Row r's max over its visible keys (kRegs registers of S, lanes k), 4 chains.
SINTER_INLINE float row_max(const float* sr, const __mmask16* k) {
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  __m512 mx[4];
  for (int j = 0; j < 4; ++j) mx[j] = _mm512_mask_mov_ps(_mm512_set1_ps(ninf), k[j], _mm512_loadu_ps(sr + 16 * j));
  for (int j = 4; j < kRegs; ++j) mx[j % 4] = _mm512_mask_max_ps(mx[j % 4], k[j], mx[j % 4], _mm512_loadu_ps(sr + 16 * j));
  return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(mx[0], mx[1]), _mm512_max_ps(mx[2], mx[3])));
}

// Row r's P = 2^(s c - m) in bf16 (0 outside lanes k) and the lanes of its sum.
SINTER_INLINE __m512 row_exp(const float* sr, const __mmask16* k, __m512 cs, __m512 mn, uint16_t* pr) {
  __m512 sum = _mm512_setzero_ps();
  for (int j = 0; j < kRegs; j += 2) {
    __m512 pv[2];
    for (int i = 0; i < 2; ++i) {
      pv[i] = _mm512_maskz_mov_ps(k[j + i], (__m512)vexp2_nonpos((fvec)_mm512_fmsub_ps(_mm512_loadu_ps(sr + 16 * (j + i)), cs, mn)));
      sum = _mm512_add_ps(sum, pv[i]);
    }
    _mm512_storeu_si512(pr + 16 * j, (__m512i)_mm512_cvtne2ps_pbh(pv[1], pv[0]));
  }
  return sum;
}

// `between(i)` runs after rows 8i .. 8i + 7 of the exponentials (i = 0 .. 3): the tile unit's
// work for the next step goes in there a piece at a time.
template <class Between> void softmax_step(const Step& t, Between between) {
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  // Each row's visible lanes: every lane for a row that sees the whole step (the compiler drops
  // the masking there), else per register.
  auto with_lanes = [&](int64_t r, auto body) {
    __mmask16 k[kRegs];
    if (t.lo[r] == 0 && t.hi[r] == kKeys) {
      for (int j = 0; j < kRegs; ++j) k[j] = 0xFFFF;
      return body(k);
    }
    for (int j = 0; j < kRegs; ++j) k[j] = bits16(t.lo[r] - 16 * j, t.hi[r] - 16 * j);
    return body(k);
  };
  for (int64_t r = 0; r < t.rows; ++r)
    t.row_max[r] = with_lanes(r, [&](const __mmask16* k) { return row_max(t.s + r * kKeys, k); }) * t.c;
  alignas(64) float alpha[kRows];
  for (int64_t r0 = 0; r0 < t.rows; r0 += 16) {  // the new maxima and rescales, 16 rows at a time
    const __m512 m = _mm512_loadu_ps(t.m + r0), mn = _mm512_max_ps(m, _mm512_loadu_ps(t.row_max + r0));
    const __mmask16 none = _mm512_cmp_ps_mask(mn, _mm512_set1_ps(ninf), _CMP_EQ_OQ);  // nothing visible yet
    const __m512 a = (__m512)vexp2_nonpos((fvec)_mm512_sub_ps(m, _mm512_mask_mov_ps(mn, none, _mm512_setzero_ps())));
    _mm512_store_ps(alpha + r0, _mm512_mask_mov_ps(a, none, _mm512_set1_ps(1.0f)));
    _mm512_storeu_ps(t.m + r0, mn);
  }
  const __m512 cs = _mm512_set1_ps(t.c);
  for (int64_t r = 0; r < t.rows; ++r) {
    uint16_t* pr = t.p + r * kKeys;
    if (t.m[r] == ninf) {
      std::memset(pr, 0, kKeys * 2);
    } else {
      const __m512 mn = _mm512_set1_ps(t.m[r]), av = _mm512_set1_ps(alpha[r]);
      const __m512 sum = with_lanes(r, [&](const __mmask16* k) { return row_exp(t.s + r * kKeys, k, cs, mn, pr); });
      _mm512_storeu_ps(t.l + 16 * r, _mm512_fmadd_ps(_mm512_loadu_ps(t.l + 16 * r), av, sum));
      if (alpha[r] != 1.0f) {
        float* ar = t.acc + r * t.Dvp;
        for (int64_t d = 0; d < t.Dvp; d += 16) _mm512_storeu_ps(ar + d, _mm512_mul_ps(_mm512_loadu_ps(ar + d), av));
      }
    }
    if (r % 8 == 7) between(r / 8);
  }
  for (int64_t i = t.rows / 8; i < kRows / 8; ++i) between(i);  // the passes rows past the last would have issued
}

}  // namespace

bool flash_amx_takes(const Geometry& g) {
  return g.dropout == 0 && g.scale > 0 && (g.Hq / g.Hkv) * g.Lq > 4 && cpu::simd::amx_ready();
}

void flash_forward_amx(const Geometry& g, const bf16* q, const bf16* k, const bf16* v, const float* mask, bf16* o, float* lse) {
  const PackedKV p = pack_kv(g, k, v);
  const int64_t group = g.Hq / g.Hkv, R = group * g.Lq, tiles = (R + kRows - 1) / kRows;
  const int64_t Dp = p.DC * 32, Dvp = p.DT * 16;
  const float c = float(g.scale * double(kLog2e)), ninf = -std::numeric_limits<float>::infinity();
  parallel_dynamic(0, g.B * g.Hkv * tiles, [&](const auto& next) {
    static const cpu::simd::TileConfig config;
    _tile_loadconfig(&config);
    thread_local Scratch sc;  // looked up once here, not per use
    auto* const q_pack = reinterpret_cast<uint16_t*>(sc.q.at_least(kRows * Dp / 2));
    // Per row: visible keys [first, lim) of the call and [lo, hi) of a step, the mask's row, the
    // running max and the lanes of the running sum.
    int64_t first[kRows], lim[kRows], lo[kRows], hi[kRows];
    const float* mask_of[kRows];
    alignas(64) float m[kRows], row_max[kRows], l[kRows * 16];
    float* const s_buf[2] = {sc.s.at_least(2 * kRows * kKeys), sc.s.at_least(2 * kRows * kKeys) + kRows * kKeys};
    Step st{s_buf[0], m, l, sc.acc.at_least(kRows * Dvp), row_max,
            reinterpret_cast<uint16_t*>(sc.p.at_least(kRows * kKeys / 2)), lo, hi, 0, Dvp, g.has_mask ? 1.0f : c};
    for (int64_t job; (job = next()) >= 0;) {
      const int64_t t = tiles - 1 - job % tiles, bh = job / tiles, b = bh / g.Hkv, hk = bh % g.Hkv;  // late tiles first
      const int64_t r0 = t * kRows, rows = std::min(kRows, R - r0);
      auto head = [&](int64_t r) { return hk * group + (r0 + r) / g.Lq; };
      auto pos = [&](int64_t r) { return (r0 + r) % g.Lq; };
      int64_t kbegin = g.Lkv, kend = 0;
      for (int64_t r = 0; r < kRows; ++r) {  // Q packed, zero past D and past the last row
        const auto* qr = r < rows ? reinterpret_cast<const uint16_t*>(g.lq.at(q, b, head(r), pos(r))) : nullptr;
        for (int64_t d = 0; d < Dp; d += 32)
          _mm512_storeu_si512(q_pack + r * Dp + d, qr ? _mm512_maskz_loadu_epi16(first_bits32(g.D - d), qr + d) : _mm512_setzero_si512());
        if (r >= rows) continue;
        first[r] = key_first(g, pos(r)), lim[r] = key_limit(g, pos(r)), mask_of[r] = mask_row(g, mask, b, head(r), pos(r));
        kbegin = std::min(kbegin, first[r]), kend = std::max(kend, lim[r]);
      }
      std::fill(st.acc, st.acc + kRows * Dvp, 0.0f);
      std::fill(m, m + kRows, ninf);
      std::fill(l, l + kRows * 16, 0.0f);
      std::fill(st.p + rows * kKeys, st.p + kRows * kKeys, uint16_t(0));  // rows past the last: P = 0
      st.rows = rows;
      // The next step's scores go to the tile unit a pass at a time while this step's exponentials
      // run on the vector unit (each alone left the other idle); S alternates between two buffers.
      auto passes_of = [&](int64_t j0) { return j0 < kend ? (std::min(kKeys, kend - j0) + 31) / 32 : 0; };
      const int64_t j_first = kbegin / kKeys * kKeys;
      for (int64_t h = 0; h < passes_of(j_first); ++h) scores_pass(p, bh, q_pack, Dp, j_first, h, s_buf[0]);
      for (int64_t j0 = j_first, step = 0; j0 < kend; j0 += kKeys, ++step) {
        const int64_t cols = std::min(kKeys, kend - j0), next = passes_of(j0 + kKeys);
        st.s = s_buf[step % 2];
        float* const s_next = s_buf[(step + 1) % 2];
        for (int64_t r = 0; r < rows; ++r) {
          lo[r] = std::clamp<int64_t>(first[r] - j0, 0, cols), hi[r] = std::clamp<int64_t>(lim[r] - j0, lo[r], cols);
          if (g.has_mask) {  // s c + mask log2(e), in place
            float* sr = st.s + r * kKeys;
            const float* mr = mask_of[r] + j0 * g.ms[3];
            for (int64_t j = lo[r]; j < hi[r]; ++j) sr[j] = sr[j] * c + mr[j * g.ms[3]] * kLog2e;
          }
        }
        softmax_step(st, [&](int64_t h) {
          if (h < next) scores_pass(p, bh, q_pack, Dp, j0 + kKeys, h, s_next);
        });
        accumulate(p, bh, st.p, j0, passes_of(j0), st.acc, Dvp);
      }
      for (int64_t r = 0; r < rows; ++r) {
        const float sum = _mm512_reduce_add_ps(_mm512_load_ps(l + 16 * r)), inv = sum > 0 ? 1.0f / sum : 0.0f;
        auto* orow = reinterpret_cast<uint16_t*>(g.lo.at(o, b, head(r), pos(r)));
        const float* ar = st.acc + r * Dvp;
        for (int64_t d = 0; d < g.Dv; d += 16) {
          const __m256bh y = _mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_loadu_ps(ar + d), _mm512_set1_ps(inv)));
          _mm256_mask_storeu_epi16(orow + d, bits16(0, g.Dv - d), (__m256i)y);
        }
        lse[(b * g.Hq + head(r)) * g.Lq + pos(r)] = sum > 0 ? m[r] * kLn2 + std::log(sum) : ninf;
      }
    }
    _tile_release();
  });
}

}  // namespace sinter::detail

#else
namespace sinter::detail {
bool flash_amx_takes(const Geometry&) { return false; }
void flash_forward_amx(const Geometry&, const bf16*, const bf16*, const bf16*, const float*, bf16*, float*) {
  SINTER_CHECK(false, "[internal] sdpa: the AMX kernel is not built for this CPU");
}
}  // namespace sinter::detail
#endif

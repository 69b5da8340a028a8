// FlashAttention-2 backward for bf16 on AMX tiles. Per (batch, kv head), for each block of 32 keys
// and each tile of 32 query rows (the group's heads stacked, as in the forward), five products by
// TDPBF16PS with f32 sums. S and dP are computed transposed (keys x queries), so a query's terms
// (its log-sum-exp and delta) are lanes: S^T = K Q^T, dP^T = V dO^T, then P^T and dS^T on AVX-512,
// dV += P^T dO, dK += dS^T Q, dQ^T += K^T dS^T (f32 for the whole job, transposed out at its end).
// Every operand is packed once per job into the layout its product reads (amx_tiles.h).
#include "cpu/attention/flash.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__linux__)
#include "core/parallel.h"
#include "cpu/attention/amx_tiles.h"
#include "cpu/attention/flash_exp2.h"
#include "cpu/simd/amx.h"

namespace sinter::detail {
namespace {

// A job's packed operands and sums (row counts rounded up to 32, head dims to 32: Rp, Lp, Dp, Dvp).
struct Job {
  uint16_t *kr, *vr, *kt;      // K and V rows (A of S^T, dP^T); K^T rows (A of dQ^T), per block of 32 keys Dp x 32
  uint16_t *qt, *dot, *qp, *dop;  // Q and dO as B tiles: column pairs (S^T, dP^T), row pairs (dK, dV)
  float* dqt;                  // dQ^T, per tile of 32 query rows Dp x 32 (rows a tile apart, not a whole row of
                               // Rp: 16 rows 4 KiB or more apart share an L1 set and evict each other)
  int64_t Rp, Lp, Dp, Dvp;
};
// One key block's buffers: S^T and dP^T (32 x 32 f32), P^T and dS^T of every query tile that sees
// the block (bf16 rows, the A tiles of dV and dK: Rp / 32 x 32 x 32), dS^T of a tile as row pairs
// (B tiles of dQ^T), dK and dV of the block (32 x Dp / Dvp f32).
struct Block {
  float *st, *dpt, *dk, *dv;
  uint16_t *pt, *dst, *dsp;
};
struct Scratch {
  AlignedBuffer st, dpt, dk, dv, pt, dst, dsp;
  std::vector<float> lse2, delta;
  std::vector<int32_t> first, lim;
  std::vector<const float*> mask;
};
// The job's operands, sized by the call (so a long one's do not stay with the thread): from the
// caching allocator, 64-byte aligned.
uint16_t* bf16_buffer(std::vector<Tensor>& keep, int64_t n) {
  keep.push_back(Tensor::empty({n}, DType::bf16));
  return reinterpret_cast<uint16_t*>(keep.back().data_ptr());
}

// Tiles 0-3 (rows 0-15 / 16-31 of A x columns 0-15 / 16-31 of B) += the products of chunks
// n = 0 .. chunks - 1: a_tiles(n) loads chunk n's A into tiles 4-5, b_tiles(n) its B into 6-7.
template <class A, class B> SINTER_INLINE void products(int64_t chunks, A a_tiles, B b_tiles) {
  for (int64_t n = 0; n < chunks; ++n) {
    a_tiles(n);
    b_tiles(n);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
}
SINTER_INLINE void store_c(float* c0, float* c1, float* c2, float* c3, int64_t rs) {
  _tile_stored(0, c0, rs);
  _tile_stored(1, c1, rs);
  _tile_stored(2, c2, rs);
  _tile_stored(3, c3, rs);
}

// S^T (or dP^T) of key block j0 and query tile qt: A = rows of K (V), B = Q's (dO's) column pairs.
void transposed_scores(const uint16_t* rows, const uint16_t* pairs, int64_t j0, int64_t qt, int64_t Dp, float* out) {
  const int64_t DC = Dp / 32;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  products(
      DC,
      [&](int64_t kd) {
        _tile_loadd(4, rows + j0 * Dp + 32 * kd, Dp * 2);
        _tile_loadd(5, rows + (j0 + 16) * Dp + 32 * kd, Dp * 2);
      },
      [&](int64_t kd) {
        _tile_loadd(6, pairs + (2 * qt * DC + kd) * kTile, 64);
        _tile_loadd(7, pairs + ((2 * qt + 1) * DC + kd) * kTile, 64);
      });
  store_c(out, out + 16, out + 16 * 32, out + 16 * 32 + 16, 128);
}

// acc (32 keys x width f32) = X^T Y over the visible query tiles tiles[0 .. n): A = X^T's rows (per
// tile 32 keys x 32 queries bf16, 1 KiB apart), B = Y's row pairs. One long product per head dim
// chunk, its sums in the tiles throughout (a sum stored and loaded back waits for the store).
void key_sums(const uint16_t* xt, const uint16_t* pairs, const int64_t* tiles, int64_t n, int64_t width, float* acc) {
  const int64_t DT = width / 16;
  for (int64_t dc = 0; dc < width / 32; ++dc) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    products(
        n,
        [&](int64_t i) {
          _tile_loadd(4, xt + i * 1024, 64);
          _tile_loadd(5, xt + i * 1024 + 16 * 32, 64);
        },
        [&](int64_t i) {
          _tile_loadd(6, pairs + (tiles[i] * DT + 2 * dc) * kTile, 64);
          _tile_loadd(7, pairs + (tiles[i] * DT + 2 * dc + 1) * kTile, 64);
        });
    float* a = acc + 32 * dc;
    store_c(a, a + 16, a + 16 * width, a + 16 * width + 16, width * 4);
  }
}

// dQ^T of query tile qt += K^T (key block j0) dS^T (its row pairs, loaded once), 32 head dims at a
// time: tiles 0-1 and 2-3 the sums of 16 each, 4 and 5 their rows of K^T.
void query_sums(const Job& j, const uint16_t* dsp, int64_t j0, int64_t qt) {
  const uint16_t* kt = j.kt + j0 * j.Dp;  // the key block's Dp x 32
  float* const c = j.dqt + qt * j.Dp * 32;
  _tile_loadd(6, dsp, 64);
  _tile_loadd(7, dsp + kTile, 64);
  for (int64_t d = 0; d < j.Dp; d += 32) {
    float *c0 = c + d * 32, *c1 = c0 + 16 * 32;
    _tile_loadd(0, c0, 128);
    _tile_loadd(1, c0 + 16, 128);
    _tile_loadd(4, kt + d * 32, 64);
    _tile_loadd(2, c1, 128);
    _tile_loadd(3, c1 + 16, 128);
    _tile_loadd(5, kt + (d + 16) * 32, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
    _tile_stored(0, c0, 128);
    _tile_stored(1, c0 + 16, 128);
    _tile_stored(2, c1, 128);
    _tile_stored(3, c1 + 16, 128);
  }
}

// n floats rounded to bf16 at dst.
void store_bf16(const float* src, int64_t n, bf16* dst) {
  for (int64_t d = 0; d < n; d += 16)
    _mm256_mask_storeu_epi16(dst + d, bits16(0, n - d), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + d)));
}

// P^T and dS^T of one block from S^T and dP^T, for key j0 + kk and query row r0 + lane, visible
// where first <= key < lim: P = 2^(S c - lse) (S c + mask log2(e) where there is a mask), dS =
// P (dP - delta) scale. As bf16 rows (A tiles of dV and dK) and dS^T as row pairs (B of dQ^T).
void block_gradients(const Geometry& g, const Block& blk, int64_t at_tile, int64_t j0, int64_t r0, const int32_t* first,
                     const int32_t* lim, const float* lse2, const float* delta, const float* const* mask_of, float c, float scale) {
  uint16_t *const pt = blk.pt + at_tile * 1024, *const dst = blk.dst + at_tile * 1024;
  if (g.has_mask) {
    for (int64_t kk = 0; kk < 32; ++kk)
      for (int64_t n = 0; n < 32; ++n) {
        const int64_t r = r0 + n, key = j0 + kk;
        if (first[r] <= key && key < lim[r]) blk.st[kk * 32 + n] = blk.st[kk * 32 + n] * c + mask_of[r][key * g.ms[3]] * kLog2e;
      }
    c = 1.0f;
  }
  const __m512 cs = _mm512_set1_ps(c), sv = _mm512_set1_ps(scale);
  for (int64_t kk = 0; kk < 32; ++kk) {
    const __m512i key = _mm512_set1_epi32(int32_t(j0 + kk));
    __m512 p[2], ds[2];
    for (int h = 0; h < 2; ++h) {
      const int64_t r = r0 + 16 * h, at = kk * 32 + 16 * h;
      const __mmask16 vis = _mm512_cmp_epi32_mask(_mm512_loadu_si512(first + r), key, _MM_CMPINT_LE) &
                            _mm512_cmp_epi32_mask(key, _mm512_loadu_si512(lim + r), _MM_CMPINT_LT);
      const __m512 t = _mm512_fmsub_ps(_mm512_load_ps(blk.st + at), cs, _mm512_loadu_ps(lse2 + r));
      p[h] = _mm512_maskz_mov_ps(vis, (__m512)vexp2_nonpos((fvec)t));
      ds[h] = _mm512_mul_ps(_mm512_mul_ps(p[h], _mm512_sub_ps(_mm512_load_ps(blk.dpt + at), _mm512_loadu_ps(delta + r))), sv);
    }
    _mm512_store_si512(pt + kk * 32, (__m512i)_mm512_cvtne2ps_pbh(p[1], p[0]));
    _mm512_store_si512(dst + kk * 32, (__m512i)_mm512_cvtne2ps_pbh(ds[1], ds[0]));
  }
  static const Interleave il;
  for (int64_t i = 0; i < 16; ++i) {
    const __m512i a = _mm512_load_si512(dst + 2 * i * 32), b = _mm512_load_si512(dst + (2 * i + 1) * 32);
    _mm512_store_si512(blk.dsp + 32 * i, _mm512_permutex2var_epi16(a, il.lo, b));
    _mm512_store_si512(blk.dsp + kTile + 32 * i, _mm512_permutex2var_epi16(a, il.hi, b));
  }
}

// K^T rows from K's rows, per block of 32 keys Dp x 32: two transposes of column pairs and an unzip.
template <class Row> void pack_transposed(Row row, int64_t Lp, int64_t D, int64_t Dp, uint16_t* out) {
  alignas(64) uint16_t even[32], odd[32];
  for (int i = 0; i < 16; ++i) even[i] = uint16_t(2 * i), even[16 + i] = uint16_t(32 + 2 * i), odd[i] = uint16_t(2 * i + 1), odd[16 + i] = uint16_t(33 + 2 * i);
  const __m512i ev = _mm512_load_si512(even), od = _mm512_load_si512(odd);
  for (int64_t n0 = 0; n0 < Lp; n0 += 32)
    for (int64_t d0 = 0; d0 < Dp; d0 += 32) {
      __m512i a[16], b[16];
      for (int n = 0; n < 16; ++n) a[n] = load_row32(row, n0 + n, d0, D), b[n] = load_row32(row, n0 + 16 + n, d0, D);
      cpu::simd::transpose16(a), cpu::simd::transpose16(b);  // a[i]: per row, columns d0 + 2i and + 1
      for (int i = 0; i < 16; ++i) {
        _mm512_storeu_si512(out + (n0 * Dp + (d0 + 2 * i) * 32), _mm512_permutex2var_epi16(a[i], ev, b[i]));
        _mm512_storeu_si512(out + (n0 * Dp + (d0 + 2 * i + 1) * 32), _mm512_permutex2var_epi16(a[i], od, b[i]));
      }
    }
}

}  // namespace

bool flash_amx_backward_takes(const Geometry& g) { return g.dropout == 0 && g.scale > 0 && cpu::simd::amx_ready(); }

void flash_backward_amx(const Geometry& g, const bf16* q, const bf16* k, const bf16* v, const bf16* o, const float* lse,
                        const bf16* dout, const float* dlse, const float* mask, bf16* dq, bf16* dk, bf16* dv) {
  const int64_t group = g.Hq / g.Hkv, R = group * g.Lq;
  const int64_t Rp = round_up(R, 32), Lp = round_up(g.Lkv, 32), Dp = round_up(g.D, 32), Dvp = round_up(g.Dv, 32);
  const float scale = float(g.scale), c = float(g.scale * double(kLog2e));
  parallel_dynamic(0, g.B * g.Hkv, [&](const auto& next) {
    static const cpu::simd::TileConfig config;
    _tile_loadconfig(&config);
    thread_local Scratch sc;
    std::vector<Tensor> keep;  // allocated at the thread's first job
    Job j{};
    const Block blk{sc.st.at_least(32 * 32), sc.dpt.at_least(32 * 32), sc.dk.at_least(32 * Dp), sc.dv.at_least(32 * Dvp),
                    sc.pt.u16(Rp * 32), sc.dst.u16(Rp * 32), sc.dsp.u16(2 * kTile)};
    std::vector<int64_t> seen(size_t(Rp / 32));  // the query tiles that see a key block
    sc.lse2.resize(size_t(Rp)), sc.delta.resize(size_t(Rp)), sc.first.resize(size_t(Rp)), sc.lim.resize(size_t(Rp)), sc.mask.resize(size_t(Rp));
    float *lse2 = sc.lse2.data(), *delta = sc.delta.data();
    int32_t *first = sc.first.data(), *lim = sc.lim.data();
    const float** mask_of = sc.mask.data();
    for (int64_t job; (job = next()) >= 0;) {
      if (keep.empty()) {
        keep.push_back(Tensor::empty({Dp * Rp}, DType::f32));
        j = {bf16_buffer(keep, Lp * Dp), bf16_buffer(keep, Lp * Dvp), bf16_buffer(keep, Dp * Lp), bf16_buffer(keep, Rp * Dp),
             bf16_buffer(keep, Rp * Dvp), bf16_buffer(keep, Rp * Dp), bf16_buffer(keep, Rp * Dvp), keep[0].data<float>(), Rp, Lp, Dp, Dvp};
      }
      const int64_t b = job / g.Hkv, hk = job % g.Hkv;
      auto head = [&](int64_t r) { return hk * group + r / g.Lq; };
      auto u16 = [](const bf16* p) { return reinterpret_cast<const uint16_t*>(p); };
      auto q_row = [&](int64_t r) { return r < R ? u16(g.lq.at(q, b, head(r), r % g.Lq)) : nullptr; };
      auto do_row = [&](int64_t r) { return r < R ? u16(g.ldo.at(dout, b, head(r), r % g.Lq)) : nullptr; };
      auto k_row = [&](int64_t n) { return n < g.Lkv ? u16(g.lk.at(k, b, hk, n)) : nullptr; };
      auto v_row = [&](int64_t n) { return n < g.Lkv ? u16(g.lv.at(v, b, hk, n)) : nullptr; };
      for (int64_t n = 0; n < Lp; n += 32)
        for (int64_t i = 0; i < 32; ++i)
          for (int64_t d = 0; d < std::max(Dp, Dvp); d += 32) {
            if (d < Dp) _mm512_storeu_si512(j.kr + (n + i) * Dp + d, load_row32(k_row, n + i, d, g.D));
            if (d < Dvp) _mm512_storeu_si512(j.vr + (n + i) * Dvp + d, load_row32(v_row, n + i, d, g.Dv));
          }
      pack_transposed(k_row, Lp, g.D, Dp, j.kt);
      for (int64_t r = 0; r < Rp; r += 16) {
        pack_column_pairs(q_row, r, g.D, j.qt + r / 16 * (Dp / 32) * kTile);
        pack_column_pairs(do_row, r, g.Dv, j.dot + r / 16 * (Dvp / 32) * kTile);
      }
      for (int64_t r = 0; r < Rp; r += 32) {
        pack_row_pairs(q_row, r, g.D, j.qp + r / 16 * (Dp / 32) * kTile);
        pack_row_pairs(do_row, r, g.Dv, j.dop + r / 16 * (Dvp / 32) * kTile);
      }
      // Per query row: its keys [first, lim) (none for padding or a row that saw no key), lse in
      // log2 units, delta = rowsum(dO O) - dlse.
      for (int64_t r = 0; r < Rp; ++r) {
        const int64_t i = r % g.Lq, base = (b * g.Hq + head(r)) * g.Lq + i;
        const float l = r < R ? lse[base] : 0.0f;
        const bool sees = r < R && std::isfinite(l);
        first[r] = sees ? int32_t(key_first(g, i)) : 0, lim[r] = sees ? int32_t(key_limit(g, i)) : 0;
        lse2[r] = sees ? l * kLog2e : 0.0f;
        mask_of[r] = r < R ? mask_row(g, mask, b, head(r), i) : nullptr;
        float s = 0;
        if (r < R) {
          const bf16 *O = g.lo.at(o, b, head(r), i), *dO = g.ldo.at(dout, b, head(r), i);
          for (int64_t d = 0; d < g.Dv; ++d) s += float(dO[d]) * float(O[d]);
          s -= dlse[base];
        }
        delta[r] = s;
      }
      std::fill(j.dqt, j.dqt + Dp * Rp, 0.0f);
      for (int64_t j0 = 0; j0 < Lp; j0 += 32) {
        int64_t n_seen = 0;
        for (int64_t qt = 0; qt < Rp / 32; ++qt) {
          int32_t lo = int32_t(g.Lkv), hi = 0;
          for (int64_t r = 32 * qt; r < 32 * qt + 32; ++r)
            if (lim[r] > first[r]) lo = std::min(lo, first[r]), hi = std::max(hi, lim[r]);
          if (hi <= j0 || lo >= j0 + 32) continue;  // no row of the tile sees a key of the block
          transposed_scores(j.kr, j.qt, j0, qt, Dp, blk.st);
          transposed_scores(j.vr, j.dot, j0, qt, Dvp, blk.dpt);
          block_gradients(g, blk, n_seen, j0, 32 * qt, first, lim, lse2, delta, mask_of, c, scale);
          query_sums(j, blk.dsp, j0, qt);
          seen[size_t(n_seen++)] = qt;
        }
        key_sums(blk.pt, j.dop, seen.data(), n_seen, Dvp, blk.dv);  // dV = P^T dO
        key_sums(blk.dst, j.qp, seen.data(), n_seen, Dp, blk.dk);   // dK = dS^T Q
        for (int64_t n = j0; n < std::min(j0 + 32, g.Lkv); ++n) {
          store_bf16(blk.dk + (n - j0) * Dp, g.D, g.ldk.at(dk, b, hk, n));
          store_bf16(blk.dv + (n - j0) * Dvp, g.Dv, g.ldv.at(dv, b, hk, n));
        }
      }
      for (int64_t r0 = 0; r0 < R; r0 += 16)  // dQ: dQ^T transposed, 16 x 16 at a time
        for (int64_t d0 = 0; d0 < Dp; d0 += 16) {
          __m512i t[16];
          for (int i = 0; i < 16; ++i) t[i] = _mm512_loadu_si512(j.dqt + (r0 / 32 * Dp + d0 + i) * 32 + r0 % 32);
          cpu::simd::transpose16(t);
          for (int64_t i = 0; i < std::min<int64_t>(16, R - r0) && d0 < g.D; ++i) {
            const int64_t r = r0 + i;
            store_bf16(reinterpret_cast<const float*>(&t[i]), std::min<int64_t>(16, g.D - d0), g.ldq.at(dq, b, head(r), r % g.Lq) + d0);
          }
        }
    }
    _tile_release();
  });
}

}  // namespace sinter::detail

#else
namespace sinter::detail {
bool flash_amx_backward_takes(const Geometry&) { return false; }
void flash_backward_amx(const Geometry&, const bf16*, const bf16*, const bf16*, const bf16*, const float*, const bf16*, const float*,
                        const float*, bf16*, bf16*, bf16*) {
  SINTER_CHECK(false, "[internal] sdpa_flash_backward: the AMX kernel is not built for this CPU");
}
}  // namespace sinter::detail
#endif

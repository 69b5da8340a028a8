#pragma once
// The f32 flash kernels' register-blocked micro-kernels (GCC vector types, one register wide),
// shared by the forward (flash_forward.cpp) and the backward (flash_backward.cpp).
#include "cpu/attention/flash.h"
#include "cpu/attention/flash_exp2.h"

namespace sinter::detail {
namespace {

// The f32 kernels' tile GEMMs (GCC vector types, one register wide): S = Q K^T over a transposed
// tile and O += P V over the head dimension, in blocks of 6 rows x 2 registers (x 4 registers on
// AVX-512 where the tile or head dim allows).
constexpr int64_t kFBr = 64, kFBc = 64;
constexpr int64_t kFewBc = 1024;  // keys per tile for a few rows (decode): longer runs of each of K and V

SINTER_INLINE fvec vload(const float* p) { fvec v; std::memcpy(&v, p, sizeof v); return v; }
SINTER_INLINE void vstore(float* p, fvec v) { std::memcpy(p, &v, sizeof v); }
// The first n floats at p (0 <= n <= kV) in a register, the other lanes 0: a head dim's tail,
// read without touching what lies past it (the next row, or the end of the buffer).
SINTER_INLINE fvec vload_n(const float* p, int64_t n) {
#if defined(__AVX512F__)
  return (fvec)_mm512_maskz_loadu_ps(__mmask16((1u << n) - 1u), p);
#elif defined(__AVX__)
  const ivec lane = {0, 1, 2, 3, 4, 5, 6, 7};
  return (fvec)_mm256_maskload_ps(p, (__m256i)(lane < int32_t(n)));
#else
  fvec v{};
  std::memcpy(&v, p, size_t(n) * sizeof(float));
  return v;
#endif
}
// kV bf16 values at p widened to f32 (the first n, the other lanes 0): K and V read in place at
// decode, where widening the whole cache to f32 first tripled the bytes each step moves.
SINTER_INLINE fvec vload(const bf16* p) { return cpu::simd::widen_bf16(p); }
SINTER_INLINE fvec vload_n(const bf16* p, int64_t n) {
#if defined(__AVX512F__)
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(__mmask16((1u << n) - 1u), p));
  return (fvec)_mm512_slli_epi32(w, 16);
#else
  fvec v{};
  for (int64_t i = 0; i < n; ++i) v[i] = float(p[i]);
  return v;
#endif
}
// Floats of a head dim of n past d0, in the register j of a block: kV, fewer at the tail, or 0.
SINTER_INLINE int64_t lanes_at(int64_t n, int64_t d0, int j) { return std::clamp<int64_t>(n - d0 - j * kV, 0, kV); }

// Rows per micro-kernel block: 6 x 2 registers of accumulators, 2 loads and 6 broadcasts per 12
// FMAs (the BLAS shape for 16 registers): FMA-bound rather than load-bound. AVX-512's 32 registers
// also hold 6 x 4 (kWide: 4 loads and 6 broadcasts per 24 FMAs), which measured 7-10% faster on the
// whole causal forward at S = 8192 (Intel Xeon, 2 threads); 8 or 12 rows x 2 measured as 6 x 2.
constexpr int kMr = 6;
#if defined(__AVX512F__)
constexpr bool kWide = true;
#else
constexpr bool kWide = false;
#endif

// f(std::integral_constant<int, m>) for 1 <= m <= MR: a block kernel for the rows left.
template <int MR, class F> SINTER_INLINE void with_rows(int64_t m, F&& f) {
  if constexpr (MR == 1) f(std::integral_constant<int, 1>{});
  else if (m >= MR) f(std::integral_constant<int, MR>{});
  else with_rows<MR - 1>(m, f);
}

// One block of MR rows: s(MR, NV registers) = q rows x kt columns [c0, c0 + NV kV).
template <int MR, int NV = 2> SINTER_INLINE void scores_block(const float* const* qr, const float* kt, float* s, int64_t c0, int64_t D) {
  fvec acc[MR][NV] = {};
  for (int64_t d = 0; d < D; ++d) {
    fvec k[NV];
    for (int j = 0; j < NV; ++j) k[j] = vload(kt + d * kFBc + c0 + j * kV);
    for (int r = 0; r < MR; ++r) {
      const float qv = qr[r][d];
      for (int j = 0; j < NV; ++j) acc[r][j] += k[j] * qv;
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NV; ++j) vstore(s + r * kFBc + c0 + j * kV, acc[r][j]);
}

// s(rows, kFBc) = q(rows, D) kt(D, kFBc) over the first `cols` columns (cols rounded up to kNr;
// kt is zero-padded there); row r of q at q + r * q_rs. With col_rows, column block c0 needs only
// rows below col_rows[c0 / kNr] (a causal tile on the diagonal, S^T): blocks past it are not
// written. With row_cols, row r needs only its first row_cols[r] columns (the diagonal, S): a block
// of rows stops at the column block holding its rows' last.
void scores_tile(const float* q, const float* kt, float* s, int64_t rows, int64_t cols, int64_t D, int64_t q_rs = -1,
                 const int64_t* col_rows = nullptr, const int64_t* row_cols = nullptr) {
  if (q_rs < 0) q_rs = D;
  for (int64_t r0 = 0; r0 < rows; r0 += kMr) {
    const float* qr[kMr];
    for (int64_t r = 0; r < kMr; ++r) qr[r] = q + std::min(r0 + r, rows - 1) * q_rs;
    float* sr = s + r0 * kFBc;
    int64_t n = cols;
    if (row_cols) {
      n = 0;
      for (int64_t r = r0; r < std::min(rows, r0 + kMr); ++r) n = std::max(n, row_cols[r]);
    }
    for (int64_t c0 = 0; c0 < n;) {
      const bool here = !col_rows || r0 < col_rows[c0 / kNr];
      const bool next = c0 + kNr < n && (!col_rows || r0 < col_rows[c0 / kNr + 1]);
      if (kWide && here && next) {  // two column blocks at once (6 x 4 registers)
        with_rows<kMr>(rows - r0, [&](auto mr) { scores_block<decltype(mr)::value, 4>(qr, kt, sr, c0, D); });
        c0 += 2 * kNr;
        continue;
      }
      if (here) with_rows<kMr>(rows - r0, [&](auto mr) { scores_block<decltype(mr)::value>(qr, kt, sr, c0, D); });
      c0 += kNr;
    }
  }
}

// One block of MR rows: acc rows [.., d0, d0 + NV kV) += sum over c of p(r, c) v(c, ..). TAIL:
// v's rows end inside the block (at v_cols): its loads are masked, the accumulators' lanes past
// it gain 0.
template <int MR, int NV = 2, bool TAIL = false>
SINTER_INLINE void pv_block(const float* const* pr, int64_t p_cs, const float* v, float* const* ar, int64_t cols, int64_t d0,
                            int64_t v_rs, int64_t v_cols) {
  fvec a[MR][NV];
  int64_t n[NV] = {};
  if constexpr (TAIL)
    for (int j = 0; j < NV; ++j) n[j] = lanes_at(v_cols, d0, j);
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NV; ++j) a[r][j] = vload(ar[r] + d0 + j * kV);
  for (int64_t c = 0; c < cols; ++c) {
    fvec vv[NV];
    for (int j = 0; j < NV; ++j) {
      if constexpr (TAIL) vv[j] = vload_n(v + c * v_rs + d0 + j * kV, n[j]);
      else vv[j] = vload(v + c * v_rs + d0 + j * kV);
    }
    for (int r = 0; r < MR; ++r) {
      const float pv = pr[r][c * p_cs];
      for (int j = 0; j < NV; ++j) a[r][j] += vv[j] * pv;
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NV; ++j) vstore(ar[r] + d0 + j * kV, a[r][j]);
}

// The same with p transposed (p(r, c) at p[c * p_cs + r]): one pointer walks the columns, where
// six row pointers each stepping p_cs cost an add apiece per column (the loop is issue-bound).
// NV registers of the head dim per block (2, or 4 where AVX-512's 32 registers hold 6 x 4
// accumulators: a broadcast of p then feeds four FMAs instead of two; the same in pv_block and
// scores_block).
template <int MR, int NV = 2, bool TAIL = false>
SINTER_INLINE void pv_block_t(const float* p, int64_t p_cs, const float* v, float* const* ar, int64_t cols, int64_t d0,
                              int64_t v_rs, int64_t v_cols) {
  fvec a[MR][NV];
  int64_t n[NV] = {};
  if constexpr (TAIL)
    for (int j = 0; j < NV; ++j) n[j] = lanes_at(v_cols, d0, j);
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NV; ++j) a[r][j] = vload(ar[r] + d0 + j * kV);
  for (int64_t c = 0; c < cols; ++c, p += p_cs, v += v_rs) {
    fvec vv[NV];
    for (int j = 0; j < NV; ++j) {
      if constexpr (TAIL) vv[j] = vload_n(v + d0 + j * kV, n[j]);
      else vv[j] = vload(v + d0 + j * kV);
    }
    for (int r = 0; r < MR; ++r) {
      const float pr = p[r];
      for (int j = 0; j < NV; ++j) a[r][j] += vv[j] * pr;
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NV; ++j) vstore(ar[r] + d0 + j * kV, a[r][j]);
}

// The block of pv_tile holding v's last floats (read masked), kept out of line: inlined, its six
// row variants grew the flash kernels' loop enough to slow the aligned head dims' code (5% on the
// masked forward, Zen 3).
// A tail of at most one register takes one register's FMAs (a head dim of 16 on AVX-512: the
// second register's half of them added zeros, 57% of the forward at D = 16).
[[gnu::noinline]] void pv_tail_block(const float* pt, int64_t p_rs, const float* const* pr, int64_t p_cs, const float* v,
                                     float* const* ar, int64_t rows, int64_t cols, int64_t d0, int64_t v_rs, int64_t v_cols) {
  with_rows<kMr>(rows, [&](auto mr) {
    constexpr int MR = decltype(mr)::value;
    if (v_cols - d0 <= kV) {
      if (p_rs == 1) pv_block_t<MR, 1, true>(pt, p_cs, v, ar, cols, d0, v_rs, v_cols);
      else pv_block<MR, 1, true>(pr, p_cs, v, ar, cols, d0, v_rs, v_cols);
    } else {
      if (p_rs == 1) pv_block_t<MR, 2, true>(pt, p_cs, v, ar, cols, d0, v_rs, v_cols);
      else pv_block<MR, 2, true>(pr, p_cs, v, ar, cols, d0, v_rs, v_cols);
    }
  });
}

// acc(rows, Dv) += p(rows, cols) v(cols, Dv), p(r, c) at p[r * p_rs + c * p_cs] (so a transposed
// tile needs no copy: its elements are broadcast one at a time anyway); Dv a multiple of kNr;
// row r of acc at acc + r * acc_rs, row c of v at v + c * v_rs. With row_cols, p(r, c) = 0 for
// c >= row_cols[r] (a causal tile on the diagonal): each block of rows stops at its rows' last
// nonzero column; with row_first, p(r, c) = 0 for c < row_first[r] (the diagonal read transposed):
// each block of rows starts at its rows' first nonzero column. With v_cols < Dv, v's rows hold
// only v_cols floats (a head dim that is no multiple of kNr, acc padded to Dv): they are read
// masked, and acc's columns past v_cols stay as they were.
void pv_tile(const float* p, const float* v, float* acc, int64_t rows, int64_t cols, int64_t Dv, int64_t p_rs = kFBc,
             int64_t p_cs = 1, int64_t acc_rs = -1, const int64_t* row_cols = nullptr, int64_t v_rs = -1,
             const int64_t* row_first = nullptr, int64_t v_cols = -1) {
  if (acc_rs < 0) acc_rs = Dv;
  if (v_rs < 0) v_rs = Dv;
  if (v_cols < 0) v_cols = Dv;
  for (int64_t r0 = 0; r0 < rows; r0 += kMr) {
    int64_t n = cols, c0 = 0;
    if (row_cols) {
      n = 0;
      for (int64_t r = r0; r < std::min(rows, r0 + kMr); ++r) n = std::max(n, row_cols[r]);
    }
    if (row_first) {
      c0 = n;
      for (int64_t r = r0; r < std::min(rows, r0 + kMr); ++r) c0 = std::min(c0, row_first[r]);
    }
    if (c0 >= n) continue;
    const float* pr[kMr];
    float* ar[kMr];
    for (int64_t r = 0; r < kMr; ++r)
      pr[r] = p + std::min(r0 + r, rows - 1) * p_rs + c0 * p_cs, ar[r] = acc + std::min(r0 + r, rows - 1) * acc_rs;
    const float* vc = v + c0 * v_rs;
    const int64_t full = std::min(Dv, v_cols / kNr * kNr);  // blocks wholly inside v's rows
    for (int64_t d0 = 0; d0 < full;) {
      if (kWide && full - d0 >= 2 * kNr) {
        with_rows<kMr>(rows - r0, [&](auto mr) {
          if (p_rs == 1) pv_block_t<decltype(mr)::value, 4>(p + r0 + c0 * p_cs, p_cs, vc, ar, n - c0, d0, v_rs, v_cols);
          else pv_block<decltype(mr)::value, 4>(pr, p_cs, vc, ar, n - c0, d0, v_rs, v_cols);
        });
        d0 += 2 * kNr;
        continue;
      }
      with_rows<kMr>(rows - r0, [&](auto mr) {
        if (p_rs == 1) pv_block_t<decltype(mr)::value>(p + r0 + c0 * p_cs, p_cs, vc, ar, n - c0, d0, v_rs, v_cols);
        else pv_block<decltype(mr)::value>(pr, p_cs, vc, ar, n - c0, d0, v_rs, v_cols);
      });
      d0 += kNr;
    }
    if (full < Dv) pv_tail_block(p + r0 + c0 * p_cs, p_rs, pr, p_cs, vc, ar, rows - r0, n - c0, full, v_rs, v_cols);
  }
}

}  // namespace
}  // namespace sinter::detail

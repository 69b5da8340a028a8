// FlashAttention-2 on the CPU: tiles of Q against tiles of K/V with an online softmax, fp32
// accumulation, fully masked tiles skipped; the forward saves only O and the row log-sum-exp, and
// the backward recomputes the scores tile by tile. Memory: O(tile^2) per thread, not O(L^2).
//   sdpa_flash(q, k, v[, mask]) -> (o, lse)  q (B, Hq, Lq, D), k/v (B, Hkv, Lkv, D), Hq % Hkv == 0
//   sdpa_flash_backward(q, k, v, o, lse, do, dlse[, mask]) -> (dq, dk, dv)
// mask: additive, broadcastable to (B, Hq, Lq, Lkv), read in the compute dtype (f32 for bf16 inputs).
// Dropout (attrs dropout_p, seed, counter) draws element (b, h, i, j) of the attention matrix as
// the dropout op draws element ((b Hq + h) Lq + i) Lkv + j: the math backend's mask, regenerated
// tile by tile in the backward. bf16 inputs compute in f32 (lse stays f32). A row that sees no
// key (or only -inf) gives 0 and lse = -inf, as PyTorch's safe softmax.
#include <cmath>
#include <limits>

#include <cstring>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "cpu/simd/lanes.h"
#include "ops/common.h"
#include "ops/scalar_fns.h"
#include "sinter/random.h"

namespace sinter {
namespace detail {

void check_attention_mask(const Shape& m, const Shape& full, const char* op) {
  bool ok = m.size() <= 4;
  for (size_t i = 0; ok && i < m.size(); ++i) ok = m[m.size() - 1 - i] == full[3 - i] || m[m.size() - 1 - i] == 1;
  SINTER_CHECK_SHAPE(ok, "[", op, "] the mask", m, " does not broadcast to (B, Hq, Lq, Lkv) = ", full);
}

namespace {

constexpr int64_t kBr = 32, kBc = 64;  // query rows x key columns per tile

struct Geometry {
  int64_t B, Hq, Hkv, Lq, Lkv, D, Dv;
  double scale;
  bool causal;
  int64_t window = 0;  // sliding window (causal only): row i sees keys (i + offset - window, i + offset]
  // Elements between consecutive heads of k and v: Lkv * D when contiguous, more for a view of
  // the first Lkv positions of a KV cache (read in place, not copied).
  int64_t k_hs = 0, v_hs = 0;
  bool has_mask = false;
  int64_t ms[4] = {0, 0, 0, 0};  // the mask's strides, broadcast to (B, Hq, Lq, Lkv)
  double dropout = 0;
  uint64_t seed = 0, counter = 0;
  int64_t offset() const { return Lkv - Lq; }  // bottom-right alignment: query i sees keys j <= i + offset
};

Geometry geometry(std::span<const TensorMeta> in, const Attrs& a) {
  const Shape &q = in[0].shape, &k = in[1].shape, &v = in[2].shape;
  SINTER_CHECK_SHAPE(q.size() == 4 && k.size() == 4 && v.size() == 4, "[sdpa_flash] q, k, v must be (B, H, L, D), got q", q,
                     " k", k, " v", v);
  SINTER_CHECK_SHAPE(k[0] == q[0] && v[0] == q[0] && k[3] == q[3] && v[1] == k[1] && v[2] == k[2],
                     "[sdpa_flash] inconsistent shapes q", q, " k", k, " v", v);
  SINTER_CHECK_SHAPE(k[1] > 0 && q[1] % k[1] == 0, "[sdpa_flash] ", q[1], " query heads are not a multiple of ", k[1],
                     " key/value heads");
  for (size_t i = 1; i < 3; ++i)
    SINTER_CHECK_DTYPE(in[i].dtype == in[0].dtype, "[sdpa_flash] q, k, v dtypes differ: ", in[0].dtype, ", ", in[1].dtype,
                       ", ", in[2].dtype);
  SINTER_CHECK_DTYPE(in[0].dtype == DType::f32 || in[0].dtype == DType::f64 || in[0].dtype == DType::bf16,
                     "[sdpa_flash] needs f32, bf16 or f64, got ", in[0].dtype);
  const int64_t window = a.has("window") ? a.i("window") : 0;
  SINTER_CHECK(window >= 0 && (window == 0 || a.b("causal")), "[sdpa_flash] a sliding window (", window,
               ") needs causal attention and a positive size");
  Geometry g{q[0], q[1], k[1], q[2], k[2], q[3], v[3], a.f("scale"), a.b("causal"), window, k[2] * q[3], v[2] * v[3]};
  if (a.has("dropout_p")) {
    g.dropout = a.f("dropout_p");
    SINTER_CHECK(g.dropout >= 0 && g.dropout < 1, "[sdpa_flash] dropout_p must be in [0, 1), got ", g.dropout);
    g.seed = uint64_t(a.i("seed")), g.counter = uint64_t(a.i("counter"));
  }
  return g;
}

// The optional additive mask (input `at`): checked against the geometry, its broadcast strides kept.
void check_mask(std::span<const TensorMeta> in, size_t at, const Geometry& g, const char* op) {
  if (in.size() <= at) return;
  check_attention_mask(in[at].shape, {g.B, g.Hq, g.Lq, g.Lkv}, op);
  SINTER_CHECK_DTYPE(is_floating(in[at].dtype), "[", op, "] the mask must be additive (floating), got ", in[at].dtype);
}
// The mask in the compute dtype, broadcast to (B, Hq, Lq, Lkv); its strides go to g.ms.
Tensor mask_view(const Tensor& mask, DType ct, Geometry& g) {
  Tensor m = (mask.dtype() == ct ? mask : mask.to(ct)).expand({g.B, g.Hq, g.Lq, g.Lkv});
  g.has_mask = true;
  for (int i = 0; i < 4; ++i) g.ms[i] = m.size(i) == 1 ? 0 : m.stride(i);
  return m;
}

// Row (b, h, i) of the mask, or null.
template <class T> SINTER_INLINE const T* mask_row(const Geometry& g, const T* mask, int64_t b, int64_t h, int64_t i) {
  return g.has_mask ? mask + b * g.ms[0] + h * g.ms[1] + i * g.ms[2] : nullptr;
}

// Dropout multipliers z[c] (0 or 1 / (1 - p)) for elements e0, e0 + 1, ... of the attention
// matrix: the same Philox draws, in the same order, as the dropout op on the materialised matrix.
template <class T> void dropout_multipliers(const Geometry& g, uint64_t e0, int64_t n, T* z) {
  const float fp = float(g.dropout);
  const T keep = T(1.0 / (1.0 - g.dropout));
  uint64_t e = e0;
  for (int64_t c = 0; c < n;) {
    uint32_t r[4];
    philox(g.seed, g.counter + e / 4, r);
    for (uint64_t k = e % 4; k < 4 && c < n; ++k, ++c, ++e)
      z[c] = float(r[k] >> 8) * (1.0f / 16777216.0f) >= fp ? keep : T(0);
  }
}
inline uint64_t element_index(const Geometry& g, int64_t b, int64_t h, int64_t i, int64_t j) {
  return uint64_t(((b * g.Hq + h) * g.Lq + i) * g.Lkv + j);
}

// Visible key range [key_first, key_limit) for query row i: causal and sliding window, or everything.
inline int64_t key_limit(const Geometry& g, int64_t i) {
  return g.causal ? std::clamp<int64_t>(i + g.offset() + 1, 0, g.Lkv) : g.Lkv;
}
inline int64_t key_first(const Geometry& g, int64_t i) {
  return g.window > 0 ? std::clamp<int64_t>(i + g.offset() + 1 - g.window, 0, g.Lkv) : 0;
}

template <class T>
void flash_forward(const Geometry& g, const T* q, const T* k, const T* v, const T* mask, T* o, T* lse) {
  const int64_t q_tiles = (g.Lq + kBr - 1) / kBr, group = g.Hq / g.Hkv;
  parallel_dynamic(0, g.B * g.Hq * q_tiles, [&](const auto& next) {
    std::vector<T> s(static_cast<size_t>(kBr * kBc)), acc(static_cast<size_t>(kBr * g.Dv)), m(static_cast<size_t>(kBr)),
        l(static_cast<size_t>(kBr)), kt(static_cast<size_t>(g.D * kBc)), z(static_cast<size_t>(kBc));
    for (int64_t job; (job = next()) >= 0;) {
      const int64_t qt = q_tiles - 1 - job % q_tiles, bh = job / q_tiles, b = bh / g.Hq, h = bh % g.Hq, hk = h / group;  // late (costly) tiles first
      const int64_t i0 = qt * kBr, rows = std::min(kBr, g.Lq - i0);
      const T* Q = q + ((b * g.Hq + h) * g.Lq + i0) * g.D;
      const T* K = k + (b * g.Hkv + hk) * g.k_hs;
      const T* V = v + (b * g.Hkv + hk) * g.v_hs;
      std::fill(acc.begin(), acc.end(), T(0));
      std::fill(m.begin(), m.end(), -std::numeric_limits<T>::infinity());
      std::fill(l.begin(), l.end(), T(0));
      const int64_t kend = key_limit(g, i0 + rows - 1);  // tiles past the last row's limit are fully masked
      for (int64_t j0 = 0; j0 < kend; j0 += kBc) {
        const int64_t cols = std::min(kBc, kend - j0);
        // K tile transposed to (D, cols): scores then vectorize across keys instead of reducing over D.
        for (int64_t c = 0; c < cols; ++c)
          for (int64_t d = 0; d < g.D; ++d) kt[size_t(d * kBc + c)] = K[(j0 + c) * g.D + d];
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t lim = key_limit(g, i0 + r) - j0, first = key_first(g, i0 + r) - j0;
          const T* qr = Q + r * g.D;
          T* sr = s.data() + r * kBc;
          std::fill(sr, sr + cols, T(0));
          for (int64_t d = 0; d < g.D; ++d) {
            const T qd = qr[d] * T(g.scale);
            const T* ktd = kt.data() + d * kBc;
#pragma omp simd
            for (int64_t c = 0; c < cols; ++c) sr[c] += qd * ktd[c];
          }
          if (const T* mr = mask_row(g, mask, b, h, i0 + r))
            for (int64_t c = 0; c < cols; ++c) sr[c] += mr[(j0 + c) * g.ms[3]];
          for (int64_t c = std::max<int64_t>(lim, 0); c < cols; ++c) sr[c] = -std::numeric_limits<T>::infinity();
          for (int64_t c = 0; c < std::min(first, cols); ++c) sr[c] = -std::numeric_limits<T>::infinity();
          T row_max = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : row_max)
          for (int64_t c = 0; c < cols; ++c) row_max = std::max(row_max, sr[c]);
          const T m_new = std::max(m[size_t(r)], row_max);
          if (m_new == -std::numeric_limits<T>::infinity()) continue;  // nothing visible yet
          const T alpha = fn::exp_(m[size_t(r)] - m_new);
          T row_sum = 0;
#pragma omp simd reduction(+ : row_sum)
          for (int64_t c = 0; c < cols; ++c) {
            sr[c] = fn::exp_(sr[c] - m_new);
            row_sum += sr[c];
          }
          l[size_t(r)] = l[size_t(r)] * alpha + row_sum;
          m[size_t(r)] = m_new;
          if (g.dropout > 0) {  // the normaliser counts every key; the output only the kept ones
            dropout_multipliers(g, element_index(g, b, h, i0 + r, j0), cols, z.data());
            for (int64_t c = 0; c < cols; ++c) sr[c] *= z[size_t(c)];
          }
          T* ar = acc.data() + r * g.Dv;
#pragma omp simd
          for (int64_t d = 0; d < g.Dv; ++d) ar[d] *= alpha;
          for (int64_t c = 0; c < cols; ++c) {
            const T p = sr[c];
            if (p == T(0)) continue;
            const T* vc = V + (j0 + c) * g.Dv;
#pragma omp simd
            for (int64_t d = 0; d < g.Dv; ++d) ar[d] += p * vc[d];
          }
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        T* orow = o + ((b * g.Hq + h) * g.Lq + i0 + r) * g.Dv;
        const T inv = l[size_t(r)] > 0 ? T(1) / l[size_t(r)] : T(0);  // no visible key: 0, lse -inf
        for (int64_t d = 0; d < g.Dv; ++d) orow[d] = acc[size_t(r * g.Dv + d)] * inv;
        lse[(b * g.Hq + h) * g.Lq + i0 + r] = l[size_t(r)] > 0 ? m[size_t(r)] + std::log(l[size_t(r)]) : -std::numeric_limits<T>::infinity();
      }
    }
  });
}

// The f32 forward with register-blocked micro-kernels (GCC vector types, one register wide):
// S = Q K^T in 6-row x 2-register blocks over a transposed K tile, then O += P V in 6-row x
// 2-register blocks of the head dimension.
typedef float fvec __attribute__((vector_size(cpu::simd::kVectorBytes)));
constexpr int64_t kV = cpu::simd::kVectorBytes / 4, kNr = 2 * kV;  // floats per register, per block row
constexpr int64_t kFBr = 64, kFBc = 64;
constexpr int64_t kFewBc = 1024;  // keys per tile for a few rows (decode): longer runs of each of K and V

SINTER_INLINE fvec vload(const float* p) { fvec v; std::memcpy(&v, p, sizeof v); return v; }
SINTER_INLINE void vstore(float* p, fvec v) { std::memcpy(p, &v, sizeof v); }

// Rows per micro-kernel block: 6 x 2 registers of accumulators, 2 loads and 6 broadcasts per 12
// FMAs (the BLAS shape for 16 registers): FMA-bound rather than load-bound.
constexpr int kMr = 6;

// One block of MR rows: s(MR, 2 registers) = q rows x kt columns [c0, c0 + kNr).
template <int MR> SINTER_INLINE void scores_block(const float* const* qr, const float* kt, float* s, int64_t c0, int64_t D) {
  fvec acc[MR][2] = {};
  for (int64_t d = 0; d < D; ++d) {
    const fvec k0 = vload(kt + d * kFBc + c0), k1 = vload(kt + d * kFBc + c0 + kV);
    for (int r = 0; r < MR; ++r) {
      const float qv = qr[r][d];
      acc[r][0] += k0 * qv;
      acc[r][1] += k1 * qv;
    }
  }
  for (int r = 0; r < MR; ++r) {
    vstore(s + r * kFBc + c0, acc[r][0]);
    vstore(s + r * kFBc + c0 + kV, acc[r][1]);
  }
}

// s(rows, kFBc) = q(rows, D) kt(D, kFBc) over the first `cols` columns (cols rounded up to kNr;
// kt is zero-padded there); row r of q at q + r * q_rs. With col_rows, column block c0 needs only
// rows below col_rows[c0 / kNr] (a causal tile on the diagonal): blocks past it are not written.
void scores_tile(const float* q, const float* kt, float* s, int64_t rows, int64_t cols, int64_t D, int64_t q_rs = -1,
                 const int64_t* col_rows = nullptr) {
  if (q_rs < 0) q_rs = D;
  for (int64_t r0 = 0; r0 < rows; r0 += kMr) {
    const float* qr[kMr];
    for (int64_t r = 0; r < kMr; ++r) qr[r] = q + std::min(r0 + r, rows - 1) * q_rs;
    float* sr = s + r0 * kFBc;
    for (int64_t c0 = 0; c0 < cols; c0 += kNr)
      if (!col_rows || r0 < col_rows[c0 / kNr]) switch (std::min<int64_t>(kMr, rows - r0)) {
        case 1: scores_block<1>(qr, kt, sr, c0, D); break;
        case 2: scores_block<2>(qr, kt, sr, c0, D); break;
        case 3: scores_block<3>(qr, kt, sr, c0, D); break;
        case 4: scores_block<4>(qr, kt, sr, c0, D); break;
        case 5: scores_block<5>(qr, kt, sr, c0, D); break;
        default: scores_block<kMr>(qr, kt, sr, c0, D); break;
      }
  }
}

// One block of MR rows: acc rows [.., d0, d0 + kNr) += sum over c of p(r, c) v(c, ..).
template <int MR>
SINTER_INLINE void pv_block(const float* const* pr, int64_t p_cs, const float* v, float* const* ar, int64_t cols, int64_t d0,
                            int64_t Dv) {
  fvec a[MR][2];
  for (int r = 0; r < MR; ++r) a[r][0] = vload(ar[r] + d0), a[r][1] = vload(ar[r] + d0 + kV);
  for (int64_t c = 0; c < cols; ++c) {
    const fvec v0 = vload(v + c * Dv + d0), v1 = vload(v + c * Dv + d0 + kV);
    for (int r = 0; r < MR; ++r) {
      const float pv = pr[r][c * p_cs];
      a[r][0] += v0 * pv;
      a[r][1] += v1 * pv;
    }
  }
  for (int r = 0; r < MR; ++r) vstore(ar[r] + d0, a[r][0]), vstore(ar[r] + d0 + kV, a[r][1]);
}

// acc(rows, Dv) += p(rows, cols) v(cols, Dv), p(r, c) at p[r * p_rs + c * p_cs] (so a transposed
// tile needs no copy: its elements are broadcast one at a time anyway); Dv a multiple of kNr;
// row r of acc at acc + r * acc_rs. With row_cols, p(r, c) = 0 for c >= row_cols[r] (a causal
// tile on the diagonal): each block of rows stops at its rows' last nonzero column.
void pv_tile(const float* p, const float* v, float* acc, int64_t rows, int64_t cols, int64_t Dv, int64_t p_rs = kFBc,
             int64_t p_cs = 1, int64_t acc_rs = -1, const int64_t* row_cols = nullptr) {
  if (acc_rs < 0) acc_rs = Dv;
  for (int64_t r0 = 0; r0 < rows; r0 += kMr) {
    const float* pr[kMr];
    float* ar[kMr];
    for (int64_t r = 0; r < kMr; ++r) pr[r] = p + std::min(r0 + r, rows - 1) * p_rs, ar[r] = acc + std::min(r0 + r, rows - 1) * acc_rs;
    int64_t n = cols;
    if (row_cols) {
      n = 0;
      for (int64_t r = r0; r < std::min(rows, r0 + kMr); ++r) n = std::max(n, row_cols[r]);
    }
    for (int64_t d0 = 0; d0 < Dv; d0 += kNr) switch (std::min<int64_t>(kMr, rows - r0)) {
        case 1: pv_block<1>(pr, p_cs, v, ar, n, d0, Dv); break;
        case 2: pv_block<2>(pr, p_cs, v, ar, n, d0, Dv); break;
        case 3: pv_block<3>(pr, p_cs, v, ar, n, d0, Dv); break;
        case 4: pv_block<4>(pr, p_cs, v, ar, n, d0, Dv); break;
        case 5: pv_block<5>(pr, p_cs, v, ar, n, d0, Dv); break;
        default: pv_block<kMr>(pr, p_cs, v, ar, n, d0, Dv); break;
      }
  }
}

typedef int32_t ivec __attribute__((vector_size(cpu::simd::kVectorBytes)));

// Scores for a few rows (decode) straight from K's rows, written transposed: sT(c * ld + r) = q_r . K_c,
// each K row read once for all rows (at Lq = 1 a blocked kernel would waste most of its lanes).
// KC keys at a time, so ROWS x KC independent accumulators hide the add latency.
// Decode is a stream through K and V: rows this many keys ahead are prefetched, a few lines per
// step, so the loads find them in cache (the hardware prefetcher alone left ~1/3 of the read
// bandwidth unused here).
constexpr int64_t kPrefetchKeys = 32;
SINTER_INLINE void prefetch_row(const float* row, int64_t n) {
  for (int64_t x = 0; x < n; x += 64 / 4) __builtin_prefetch(row + x, 0, 3);
}

template <int ROWS, int KC>
SINTER_INLINE void scores_few_block(const float* q, const float* K, float* sT, int64_t c, int64_t D, int64_t ld) {
  for (int j = 0; j < KC; ++j) prefetch_row(K + (c + j + kPrefetchKeys) * D, D);
  fvec acc[ROWS][KC];
  for (int r = 0; r < ROWS; ++r)
    for (int j = 0; j < KC; ++j) acc[r][j] = fvec{};
  for (int64_t d = 0; d < D; d += kV) {
    fvec kv[KC];
    for (int j = 0; j < KC; ++j) kv[j] = vload(K + (c + j) * D + d);
    for (int r = 0; r < ROWS; ++r) {
      const fvec qv = vload(q + r * D + d);
      for (int j = 0; j < KC; ++j) acc[r][j] += qv * kv[j];
    }
  }
#if defined(__AVX__) && !defined(__AVX512F__)
  if constexpr (ROWS * KC == 8) {  // eight dot products reduced together: 3 rounds of pairwise adds
    const fvec* a = &acc[0][0];
    const fvec h0 = __builtin_ia32_haddps256(a[0], a[1]), h1 = __builtin_ia32_haddps256(a[2], a[3]);
    const fvec h2 = __builtin_ia32_haddps256(a[4], a[5]), h3 = __builtin_ia32_haddps256(a[6], a[7]);
    const fvec g0 = __builtin_ia32_haddps256(h0, h1), g1 = __builtin_ia32_haddps256(h2, h3);
    // g0 = [s0 s1 s2 s3 | s0' s1' s2' s3'] (halves of the 128-bit lanes), likewise g1 for s4..s7
    const fvec lo = __builtin_shuffle(g0, g1, (ivec){0, 1, 2, 3, 8, 9, 10, 11});
    const fvec hi = __builtin_shuffle(g0, g1, (ivec){4, 5, 6, 7, 12, 13, 14, 15});
    const fvec sum = lo + hi;  // sum[n] = dot product n = r * KC + j
    for (int n = 0; n < 8; ++n) sT[(c + n % KC) * ld + n / KC] = sum[n];
    return;
  }
#endif
  for (int r = 0; r < ROWS; ++r)
    for (int j = 0; j < KC; ++j) {
      float t = 0;
      for (int l = 0; l < kV; ++l) t += acc[r][j][l];
      sT[(c + j) * ld + r] = t;
    }
}
template <int ROWS> void scores_few(const float* q, const float* K, float* sT, int64_t cols, int64_t D, int64_t ld) {
  constexpr int KC = ROWS == 1 ? 8 : ROWS == 2 ? 4 : 2;
  int64_t c = 0;
  for (; c + KC <= cols; c += KC) scores_few_block<ROWS, KC>(q, K, sT, c, D, ld);
  for (; c < cols; ++c) scores_few_block<ROWS, 1>(q, K, sT, c, D, ld);
}
void scores_few_rows(const float* q, const float* K, float* sT, int64_t rows, int64_t cols, int64_t D, int64_t ld) {
  switch (rows) {
    case 1: return scores_few<1>(q, K, sT, cols, D, ld);
    case 2: return scores_few<2>(q, K, sT, cols, D, ld);
    case 3: return scores_few<3>(q, K, sT, cols, D, ld);
    default: return scores_few<4>(q, K, sT, cols, D, ld);
  }
}

// acc(rows, Dv) += sum over c of p(r, c) V(c, :) for a few rows (decode): V streamed row by row
// in order, four keys per pass over the (L1-resident) accumulator rows; p(r, c) at pT[c * ld + r].
template <int ROWS> void pv_few(const float* pT, int64_t ld, const float* V, float* acc, int64_t cols, int64_t Dv) {
  int64_t c = 0;
  for (; c + 4 <= cols; c += 4) {
    float p[4][ROWS];
    for (int j = 0; j < 4; ++j)
      for (int r = 0; r < ROWS; ++r) p[j][r] = pT[(c + j) * ld + r];
    const float* v = V + c * Dv;
    for (int j = 0; j < 4; ++j) prefetch_row(v + (j + kPrefetchKeys) * Dv, Dv);
    for (int64_t d = 0; d < Dv; d += kV) {
      const fvec v0 = vload(v + d), v1 = vload(v + Dv + d), v2 = vload(v + 2 * Dv + d), v3 = vload(v + 3 * Dv + d);
      for (int r = 0; r < ROWS; ++r) vstore(acc + r * Dv + d, vload(acc + r * Dv + d) + v0 * p[0][r] + v1 * p[1][r] + v2 * p[2][r] + v3 * p[3][r]);
    }
  }
  for (; c < cols; ++c)
    for (int64_t d = 0; d < Dv; d += kV) {
      const fvec v0 = vload(V + c * Dv + d);
      for (int r = 0; r < ROWS; ++r) vstore(acc + r * Dv + d, vload(acc + r * Dv + d) + v0 * pT[c * ld + r]);
    }
}
void pv_few_rows(const float* pT, int64_t ld, const float* V, float* acc, int64_t rows, int64_t cols, int64_t Dv) {
  switch (rows) {
    case 1: return pv_few<1>(pT, ld, V, acc, cols, Dv);
    case 2: return pv_few<2>(pT, ld, V, acc, cols, Dv);
    case 3: return pv_few<3>(pT, ld, V, acc, cols, Dv);
    default: return pv_few<4>(pT, ld, V, acc, cols, Dv);
  }
}

SINTER_INLINE fvec vexp_nonpos(fvec x) { return fn::exp_nonpos_vec<fvec, ivec>(x); }
SINTER_INLINE fvec vmax(fvec a, fvec b) { return a > b ? a : b; }

// The forward's per-thread buffers, grown to the head dims of the call.
struct ForwardScratch {
  std::vector<float> qt, qs, sT, acc, m, l, alpha, z;
  std::vector<int64_t> lim_of, first_of, row_keys, strip_keys;
  std::vector<const float*> mask_of;
  std::vector<uint64_t> element_of;
  void reserve(int64_t D, int64_t Dv) {
    auto at_least = [](auto& v, int64_t n) {
      if (int64_t(v.size()) < n) v.resize(size_t(n));
    };
    at_least(qt, D * kFBr), at_least(qs, 4 * D), at_least(sT, std::max(kFewBc * kV, kFBc * kFBr)), at_least(acc, kFBr * Dv);
    for (auto* v : {&m, &l, &alpha}) at_least(*v, kFBr);
    at_least(z, kFewBc);
    for (auto* v : {&lim_of, &first_of, &row_keys}) at_least(*v, kFBr);
    at_least(strip_keys, kFBr / kNr), at_least(mask_of, kFBr), at_least(element_of, kFBr);
  }
};

// Rows of a job are the query heads of one kv head stacked (head-major, then position): at
// decode (Lq = 1) the group's heads share every K/V tile read, which is what GQA saves.
// Scores are computed transposed, S^T = K Q^T, over Q^T transposed once per job (not K once per
// tile): K's rows are read in place, and the online softmax runs across query rows, a register of
// rows at a time, with no horizontal reductions. P^T then feeds O += P V read transposed.
void flash_forward_f32(const Geometry& g, const float* q, const float* k, const float* v, const float* mask, float* o,
                       float* lse) {
  static_assert(kFBr == kFBc && kFBr % kNr == 0, "S^T tiles are square, padded rows a whole block");
  const int64_t group = g.Hq / g.Hkv, D = g.D, Dv = g.Dv, R = group * g.Lq, tiles = (R + kFBr - 1) / kFBr;
  const float scale = float(g.scale), ninf = -std::numeric_limits<float>::infinity();
  parallel_dynamic(0, g.B * g.Hkv * tiles, [&](const auto& next) {
    // Each thread's scratch lives across calls: a decode step's attention is a few microseconds,
    // and allocating (and zeroing) ~50 KiB of it per call had cost half of that.
    thread_local ForwardScratch sc;
    sc.reserve(D, Dv);
    std::vector<float>&qt = sc.qt, &qs = sc.qs, &sT = sc.sT, &acc = sc.acc, &m = sc.m, &l = sc.l, &alpha = sc.alpha, &z = sc.z;
    std::vector<int64_t>&lim_of = sc.lim_of, &first_of = sc.first_of, &row_keys = sc.row_keys, &strip_keys = sc.strip_keys;
    std::vector<const float*>& mask_of = sc.mask_of;
    std::vector<uint64_t>& element_of = sc.element_of;
    for (int64_t job; (job = next()) >= 0;) {
      // A head's tiles last to first: under a causal mask the late ones see the most keys, so the
      // cheap ones come last and even the threads out.
      const int64_t t = tiles - 1 - job % tiles, bk = job / tiles, b = bk / g.Hkv, hk = bk % g.Hkv;
      const int64_t r0 = t * kFBr, rows = std::min(kFBr, R - r0), rows_r = (rows + kNr - 1) / kNr * kNr;
      const int64_t row_base = (b * g.Hq + hk * group) * g.Lq + r0;  // rows are contiguous in q, o and lse
      const float* Q = q + row_base * D;
      const float* K = k + (b * g.Hkv + hk) * g.k_hs;
      const float* V = v + (b * g.Hkv + hk) * g.v_hs;
      const bool few = rows <= 4;
      if (few) {
        for (int64_t i = 0; i < rows * D; ++i) qs[size_t(i)] = Q[i] * scale;
      } else {  // qt(D, kFBr) = scale Q^T, zero past the last row
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t d = 0; d < D; ++d) qt[size_t(d * kFBr + r)] = Q[r * D + d] * scale;
        for (int64_t d = 0; d < D; ++d)
          for (int64_t r = rows; r < rows_r; ++r) qt[size_t(d * kFBr + r)] = 0.0f;
      }
      std::fill(acc.begin(), acc.begin() + (few ? rows : kFBr) * Dv, 0.0f);  // the rows the P V kernels touch
      std::fill(m.begin(), m.end(), ninf);
      std::fill(l.begin(), l.end(), 0.0f);
      // Tiles before every row's first key or past every row's limit are fully masked.
      int64_t kend = 0, min_lim = g.Lkv, kbegin = g.Lkv, max_first = 0;
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t h = hk * group + (r0 + r) / g.Lq, i = (r0 + r) % g.Lq;
        lim_of[size_t(r)] = key_limit(g, i), first_of[size_t(r)] = key_first(g, i);
        mask_of[size_t(r)] = mask_row(g, mask, b, h, i), element_of[size_t(r)] = element_index(g, b, h, i, 0);
        kend = std::max(kend, lim_of[size_t(r)]), min_lim = std::min(min_lim, lim_of[size_t(r)]);
        kbegin = std::min(kbegin, first_of[size_t(r)]), max_first = std::max(max_first, first_of[size_t(r)]);
      }
      const int64_t bc = few ? kFewBc : kFBc, ld = few ? kV : kFBr;  // keys per tile; P^T's row stride
      for (int64_t j0 = kbegin / bc * bc; j0 < kend; j0 += bc) {
        const int64_t cols = std::min(bc, kend - j0);
        // A tile some row cannot see to its end (the causal diagonal): each row's last visible
        // key, and per block of query columns of S^T the most keys any of its rows sees.
        const bool cut = !few && j0 + cols > min_lim;
        if (cut) {
          std::fill(strip_keys.begin(), strip_keys.end(), 0);
          for (int64_t r = 0; r < rows; ++r) {
            row_keys[size_t(r)] = std::clamp<int64_t>(lim_of[size_t(r)] - j0, 0, cols);
            strip_keys[size_t(r / kNr)] = std::max(strip_keys[size_t(r / kNr)], row_keys[size_t(r)]);
          }
        }
        if (few && rows < kV)  // the softmax below reads whole registers of rows: padding lanes finite
          for (int64_t c = 0; c < cols; ++c) vstore(sT.data() + c * ld, fvec{});  // ld == kV; the rows are written next
        if (few) scores_few_rows(qs.data(), K + j0 * D, sT.data(), rows, cols, D, ld);
        else scores_tile(K + j0 * D, qt.data(), sT.data(), cols, rows_r, D, D, cut ? strip_keys.data() : nullptr);  // S^T = K_j (scale Q)^T
        // Keys outside a row's [first, lim) are -inf; then the explicit mask.
        if (!(j0 + cols <= min_lim && j0 >= max_first))
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t lim = std::clamp<int64_t>(lim_of[size_t(r)] - j0, 0, cols);
            const int64_t first = std::clamp<int64_t>(first_of[size_t(r)] - j0, 0, lim);
            for (int64_t c = 0; c < first; ++c) sT[size_t(c * ld + r)] = ninf;
            for (int64_t c = lim; c < cols; ++c) sT[size_t(c * ld + r)] = ninf;
          }
        if (g.has_mask)
          for (int64_t r = 0; r < rows; ++r) {
            const float* mr = mask_of[size_t(r)] + j0 * g.ms[3];
            for (int64_t c = 0; c < cols; ++c) sT[size_t(c * ld + r)] += mr[c * g.ms[3]];
          }
        // Online softmax, a register of rows at a time: new max, P = exp(S - max), rescale.
        for (int64_t rb = 0; rb < rows; rb += kV) {  // lanes past `rows` hold finite padding
          fvec mx = vload(m.data() + rb);
          for (int64_t c = 0; c < cols; ++c) mx = vmax(mx, vload(sT.data() + c * ld + rb));
          const fvec m_use = mx == ninf ? fvec{} : mx;  // nothing visible yet: p = 0, alpha = 0
          const fvec a = vexp_nonpos(vload(m.data() + rb) - m_use);
          fvec sum = {};
          for (int64_t c = 0; c < cols; ++c) {
            const fvec p = vexp_nonpos(vload(sT.data() + c * ld + rb) - m_use);
            vstore(sT.data() + c * ld + rb, p);
            sum += p;
          }
          vstore(l.data() + rb, vload(l.data() + rb) * a + sum);
          vstore(m.data() + rb, mx);
          vstore(alpha.data() + rb, a);
        }
        for (int64_t r = 0; r < rows; ++r) {
          if (alpha[size_t(r)] != 1.0f) {
            float* ar = acc.data() + r * Dv;
            const float a = alpha[size_t(r)];
            for (int64_t d = 0; d < Dv; ++d) ar[d] *= a;
          }
          if (g.dropout > 0) {  // the normaliser counted every key; the output takes only the kept ones
            dropout_multipliers(g, element_of[size_t(r)] + uint64_t(j0), cols, z.data());
            for (int64_t c = 0; c < cols; ++c) sT[size_t(c * ld + r)] *= z[size_t(c)];
          }
        }
        if (few) pv_few_rows(sT.data(), ld, V + j0 * Dv, acc.data(), rows, cols, Dv);
        else pv_tile(sT.data(), V + j0 * Dv, acc.data(), rows, cols, Dv, 1, ld, -1, cut ? row_keys.data() : nullptr);  // acc += P V, P from P^T
      }
      for (int64_t r = 0; r < rows; ++r) {
        float* orow = o + (row_base + r) * Dv;
        const float inv = l[size_t(r)] > 0 ? 1.0f / l[size_t(r)] : 0.0f;  // no visible key: 0, lse -inf
        for (int64_t d = 0; d < Dv; ++d) orow[d] = acc[size_t(r * Dv + d)] * inv;
        lse[row_base + r] = l[size_t(r)] > 0 ? m[size_t(r)] + std::log(l[size_t(r)]) : ninf;
      }
    }
  });
}

// The f32 backward on the same micro-kernels, FlashAttention-2 order: per (batch, kv head), for
// each K/V tile, for each query head of its group and each query tile, recompute S and P, then
// dV += P^T dO, dP = dO V^T, dS = P (dP - delta) scale, dQ += dS K, dK += dS^T Q.
void transpose_tile(const float* src, int64_t ld_src, float* dst, int64_t rows, int64_t cols) {
  // dst(cols, kFBc) = src(rows, cols)^T, zero-padded to kFBc columns
  for (int64_t c = 0; c < cols; ++c) {
    for (int64_t r = 0; r < rows; ++r) dst[c * kFBc + r] = src[r * ld_src + c];
    for (int64_t r = rows; r < kFBc; ++r) dst[c * kFBc + r] = 0.0f;
  }
}

void flash_backward_f32(const Geometry& g, const float* q, const float* k, const float* v, const float* o, const float* lse,
                        const float* dout, const float* dlse, const float* mask, float* dq, float* dk, float* dv) {
  const int64_t group = g.Hq / g.Hkv, D = g.D, Dv = g.Dv;
  const float scale = float(g.scale);
  parallel_dynamic(0, g.B * g.Hkv, [&](const auto& next) {
    std::vector<float> kt(static_cast<size_t>(D * kFBc)), vt(static_cast<size_t>(Dv * kFBc)), p(static_cast<size_t>(kFBr * kFBc)),
        dp(static_cast<size_t>(kFBr * kFBc)), qs(static_cast<size_t>(kFBr * D)),
        delta(static_cast<size_t>(group * g.Lq)), z(static_cast<size_t>(kFBc));
    for (int64_t job; (job = next()) >= 0;) {
      const int64_t b = job / g.Hkv, hk = job % g.Hkv;
      const float* K = k + (b * g.Hkv + hk) * g.Lkv * D;
      const float* V = v + (b * g.Hkv + hk) * g.Lkv * Dv;
      float* dK = dk + (b * g.Hkv + hk) * g.Lkv * D;
      float* dV = dv + (b * g.Hkv + hk) * g.Lkv * Dv;
      std::fill(dK, dK + g.Lkv * D, 0.0f);
      std::fill(dV, dV + g.Lkv * Dv, 0.0f);
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        // delta_i = rowsum(dO_i * O_i) - dLSE_i (dLSE_i / dS_ij = P_ij)
        const int64_t base = (b * g.Hq + h) * g.Lq;
        const float *O = o + base * Dv, *dO = dout + base * Dv;
        for (int64_t i = 0; i < g.Lq; ++i)
          delta[size_t((h - hk * group) * g.Lq + i)] =
              cpu::simd::lane_sum<float>(Dv, [&](int64_t d) { return dO[i * Dv + d] * O[i * Dv + d]; }) - dlse[base + i];
        std::fill(dq + base * D, dq + (base + g.Lq) * D, 0.0f);
      }
      for (int64_t j0 = 0; j0 < g.Lkv; j0 += kFBc) {
        const int64_t cols = std::min(kFBc, g.Lkv - j0), cols_r = (cols + kNr - 1) / kNr * kNr;
        transpose_tile(K + j0 * D, D, kt.data(), cols, D);  // kt(D, kFBc) = K_j^T
        transpose_tile(V + j0 * Dv, Dv, vt.data(), cols, Dv);
        // Query rows that see any key of this tile: i + offset >= j0 (causal), and with a window
        // i + offset + 1 - window < j0 + cols.
        const int64_t i_first = g.causal ? std::max<int64_t>(0, j0 - g.offset()) : 0;
        const int64_t i_end = g.window > 0 ? std::clamp<int64_t>(j0 + cols + g.window - 1 - g.offset(), 0, g.Lq) : g.Lq;
        for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
          const int64_t base = (b * g.Hq + h) * g.Lq;
          const float *Q = q + base * D, *dO = dout + base * Dv, *LSE = lse + base;
          const float* dl_h = delta.data() + (h - hk * group) * g.Lq;
          float* dQ = dq + base * D;
          for (int64_t i0 = i_first / kFBr * kFBr; i0 < i_end; i0 += kFBr) {
            const int64_t rows = std::min(kFBr, g.Lq - i0);
            for (int64_t x = 0; x < rows * D; ++x) qs[size_t(x)] = Q[i0 * D + x] * scale;
            scores_tile(qs.data(), kt.data(), p.data(), rows, cols_r, D);            // S
            scores_tile(dO + i0 * Dv, vt.data(), dp.data(), rows, cols_r, Dv);      // dP = dO V^T
            for (int64_t r = 0; r < rows; ++r) {
              float *pr = p.data() + r * kFBc, *dpr = dp.data() + r * kFBc;
              const float l = LSE[i0 + r], dl = dl_h[i0 + r];
              const int64_t lim = (std::isinf(l) || std::isnan(l)) ? 0
                                  : std::clamp<int64_t>(key_limit(g, i0 + r) - j0, 0, cols);
              const int64_t first = std::clamp<int64_t>(key_first(g, i0 + r) - j0, 0, lim);
              for (int64_t c = 0; c < first; ++c) pr[c] = dpr[c] = 0.0f;
              if (const float* mr = mask_row(g, mask, b, h, i0 + r))
                for (int64_t c = first; c < lim; ++c) pr[c] += mr[(j0 + c) * g.ms[3]];
              if (g.dropout > 0) {  // dP = dP' z; dV takes the kept P z
                dropout_multipliers(g, element_index(g, b, h, i0 + r, j0 + first), lim - first, z.data());
                for (int64_t c = first; c < lim; ++c) {
                  const float pc = fn::exp_(pr[c] - l), zc = z[size_t(c - first)];
                  dpr[c] = pc * (dpr[c] * zc - dl) * scale;
                  pr[c] = pc * zc;
                }
              } else {
                for (int64_t c = first; c < lim; ++c) {
                  pr[c] = fn::exp_(pr[c] - l);
                  dpr[c] = pr[c] * (dpr[c] - dl) * scale;  // dS
                }
              }
              for (int64_t c = lim; c < kFBc; ++c) pr[c] = dpr[c] = 0.0f;
            }
            // dV_j += P^T dO_i and dK_j += dS^T Q_i: the same kernel reading P and dS transposed.
            pv_tile(p.data(), dO + i0 * Dv, dV + j0 * Dv, cols, rows, Dv, 1, kFBc);
            pv_tile(dp.data(), Q + i0 * D, dK + j0 * D, cols, rows, D, 1, kFBc);
            pv_tile(dp.data(), K + j0 * D, dQ + i0 * D, rows, cols, D);  // dQ_i += dS K_j
          }
        }
      }
    }
  });
}

// Backward, parallel over (batch, key/value head) so dK/dV of a head are owned by one thread.
template <class T>
void flash_backward(const Geometry& g, const T* q, const T* k, const T* v, const T* o, const T* lse, const T* dout,
                    const T* dlse, const T* mask, T* dq, T* dk, T* dv) {
  const int64_t group = g.Hq / g.Hkv;
  parallel_dynamic(0, g.B * g.Hkv, [&](const auto& next) {
    std::vector<T> delta(static_cast<size_t>(g.Lq)), p(static_cast<size_t>(kBc)), ds(static_cast<size_t>(kBc)),
        z(static_cast<size_t>(kBc), T(1));
    for (int64_t job; (job = next()) >= 0;) {
      const int64_t b = job / g.Hkv, hk = job % g.Hkv;
      const T* K = k + (b * g.Hkv + hk) * g.Lkv * g.D;
      const T* V = v + (b * g.Hkv + hk) * g.Lkv * g.Dv;
      T* dK = dk + (b * g.Hkv + hk) * g.Lkv * g.D;
      T* dV = dv + (b * g.Hkv + hk) * g.Lkv * g.Dv;
      std::fill(dK, dK + g.Lkv * g.D, T(0));
      std::fill(dV, dV + g.Lkv * g.Dv, T(0));
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        const int64_t base = (b * g.Hq + h) * g.Lq;
        const T *Q = q + base * g.D, *O = o + base * g.Dv, *dO = dout + base * g.Dv, *LSE = lse + base;
        T* dQ = dq + base * g.D;
        std::fill(dQ, dQ + g.Lq * g.D, T(0));
        for (int64_t i = 0; i < g.Lq; ++i) {  // delta_i = rowsum(dO_i * O_i) - dLSE_i (dLSE_i / dS_ij = P_ij)
          T s = 0;
          for (int64_t d = 0; d < g.Dv; ++d) s += dO[i * g.Dv + d] * O[i * g.Dv + d];
          delta[size_t(i)] = s - dlse[base + i];
        }
        for (int64_t i = 0; i < g.Lq; ++i) {
          if (std::isinf(LSE[i]) || std::isnan(LSE[i])) continue;  // a row that saw no key
          const int64_t kend = key_limit(g, i), kfirst = key_first(g, i);
          const T *qi = Q + i * g.D, *doi = dO + i * g.Dv, *mr = mask_row(g, mask, b, h, i);
          T* dqi = dQ + i * g.D;
          for (int64_t j0 = kfirst; j0 < kend; j0 += kBc) {
            const int64_t cols = std::min(kBc, kend - j0);
            if (g.dropout > 0) dropout_multipliers(g, element_index(g, b, h, i, j0), cols, z.data());
            for (int64_t c = 0; c < cols; ++c) {  // recompute P and dP for this row and key tile
              const T *kc = K + (j0 + c) * g.D, *vc = V + (j0 + c) * g.Dv;
              T dot = 0, dpv = 0;
#pragma omp simd reduction(+ : dot)
              for (int64_t d = 0; d < g.D; ++d) dot += qi[d] * kc[d];
#pragma omp simd reduction(+ : dpv)
              for (int64_t d = 0; d < g.Dv; ++d) dpv += doi[d] * vc[d];
              const T pc = fn::exp_(dot * T(g.scale) + (mr ? mr[(j0 + c) * g.ms[3]] : T(0)) - LSE[i]);
              ds[size_t(c)] = pc * (dpv * z[size_t(c)] - delta[size_t(i)]) * T(g.scale);  // dS, scaled
              p[size_t(c)] = pc * z[size_t(c)];  // what reached the output: dV's weight
            }
            for (int64_t c = 0; c < cols; ++c) {
              const T pc = p[size_t(c)], dsc = ds[size_t(c)];
              const T *kc = K + (j0 + c) * g.D;
              T *dkc = dK + (j0 + c) * g.D, *dvc = dV + (j0 + c) * g.Dv;
#pragma omp simd
              for (int64_t d = 0; d < g.Dv; ++d) dvc[d] += pc * doi[d];
#pragma omp simd
              for (int64_t d = 0; d < g.D; ++d) {
                dqi[d] += dsc * kc[d];
                dkc[d] += dsc * qi[d];
              }
            }
          }
        }
      }
    }
  });
}

}  // namespace

bool flash_fast_path(DType dtype, int64_t D, int64_t Dv) {
  return (dtype == DType::f32 || dtype == DType::bf16) && D % kV == 0 && Dv % kNr == 0;
}

namespace {
std::vector<TensorMeta> metas(std::span<const Tensor> in, size_t n) {
  std::vector<TensorMeta> m;
  for (size_t i = 0; i < n; ++i) m.push_back({in[i].shape(), in[i].dtype(), {}});
  return m;
}

// k and v whose rows are contiguous and whose heads are evenly spaced (a KV cache's first Lkv
// positions) are read where they are; anything else is copied (and bf16 widened) to contiguous.
Tensor rows_in_place(const Tensor& t, DType ct, int64_t& head_stride) {
  const bool ok = t.dtype() == ct && t.stride(3) == 1 && (t.size(2) <= 1 || t.stride(2) == t.size(3)) &&
                  (t.size(0) <= 1 || t.stride(0) == t.size(1) * t.stride(1)) && t.stride(1) >= t.size(2) * t.size(3);
  if (ok) head_stride = t.stride(1);
  return ok ? t : contiguous_as(t, ct);
}

// Runs `body` with pointers of the compute type T (f64, or f32 also for bf16 tensors, widened).
template <class F> void with_compute_type(DType dt, F&& body) {
  if (dt == DType::f64) body.template operator()<double>();
  else body.template operator()<float>();
}
}  // namespace

void register_flash_ops() {
  OpDef f;
  f.name = "sdpa_flash";  // attrs: scale, causal[, window][, dropout_p, seed, counter]; outputs o, lse (B, Hq, Lq)
  f.num_inputs = -1;      // q, k, v[, mask]
  f.num_outputs = 2;
  f.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    SINTER_CHECK(in.size() == 3 || in.size() == 4, "[sdpa_flash] takes q, k, v and an optional mask, got ", in.size(),
                 " inputs");
    const Geometry g = geometry(in, a);
    check_mask(in, 3, g, "sdpa_flash");
    return std::vector<TensorMeta>{{{g.B, g.Hq, g.Lq, g.Dv}, in[0].dtype, in[0].device},
                                   {{g.B, g.Hq, g.Lq}, compute_dtype(in[0].dtype), in[0].device}};
  };
  f.cpu = [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
    Geometry g = geometry(metas(in, 3), a);
    const DType ct = compute_dtype(in[0].dtype());
    Tensor mask = in.size() > 3 ? mask_view(in[3], ct, g) : Tensor();
    with_compute_type(in[0].dtype(), [&]<class T>() {
      Tensor q = contiguous_as(in[0], ct), k = rows_in_place(in[1], ct, g.k_hs), v = rows_in_place(in[2], ct, g.v_hs);
      Tensor o = out[0].dtype() == ct ? out[0] : Tensor::empty(out[0].shape(), ct);
      const T* m = mask.defined() ? mask.data<T>() : nullptr;
      bool done = false;
      if constexpr (std::is_same_v<T, float>) {
        if (g.D % kV == 0 && g.Dv % kNr == 0) {  // the register-blocked kernel (D: vectors, Dv: pairs of them)
          flash_forward_f32(g, q.data<T>(), k.data<T>(), v.data<T>(), m, o.data<T>(), out[1].data<T>());
          done = true;
        }
      }
      if (!done) flash_forward<T>(g, q.data<T>(), k.data<T>(), v.data<T>(), m, o.data<T>(), out[1].data<T>());
      if (out[0].dtype() != ct) out[0].copy_(o);  // bf16: rounded once, at the end
    });
  };
  f.backward = [](BackwardCtx& c) {
    static const OpDef& bw = get_op("sdpa_flash_backward");
    std::vector<Tensor> in{c.inputs[0], c.inputs[1], c.inputs[2], c.outputs[0], c.outputs[1], c.grads[0], c.grads[1]};
    if (c.inputs.size() > 3) in.push_back(c.inputs[3]);
    auto g = call(bw, in, c.attrs);
    std::vector<Tensor> r{g[0], g[1], g[2]};
    if (c.inputs.size() > 3) r.push_back(Tensor());  // no gradient for the mask (sdpa routes a mask that wants one to math)
    return r;
  };
  f.save_outputs = 3;
  add_op(std::move(f));

  OpDef b;
  b.name = "sdpa_flash_backward";  // inputs q, k, v, o, lse, do, dlse[, mask] -> dq, dk, dv
  b.num_inputs = -1;
  b.num_outputs = 3;
  b.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    SINTER_CHECK(in.size() == 7 || in.size() == 8, "[sdpa_flash_backward] takes q, k, v, o, lse, do, dlse and an optional mask, got ",
                 in.size(), " inputs");
    const Geometry g = geometry(in.subspan(0, 3), a);
    const Shape o{g.B, g.Hq, g.Lq, g.Dv};
    const Shape rows{g.B, g.Hq, g.Lq};
    SINTER_CHECK_SHAPE(in[3].shape == o && in[5].shape == o && in[4].shape == rows && in[6].shape == rows,
                       "[sdpa_flash_backward] o", in[3].shape, ", lse", in[4].shape, ", do", in[5].shape, ", dlse",
                       in[6].shape, " do not match q", in[0].shape, " and v", in[2].shape);
    const DType ct = compute_dtype(in[0].dtype);
    for (size_t i = 3; i < 7; ++i) {
      const DType want = (i == 4 || i == 6) ? ct : in[0].dtype;  // lse and its gradient stay in the compute dtype
      SINTER_CHECK_DTYPE(in[i].dtype == want, "[sdpa_flash_backward] input ", i, " has dtype ", in[i].dtype, ", expected ", want);
    }
    check_mask(in, 7, g, "sdpa_flash_backward");
    return std::vector<TensorMeta>{in[0], in[1], in[2]};
  };
  b.cpu = [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
    Geometry g = geometry(metas(in, 3), a);
    const DType ct = compute_dtype(in[0].dtype());
    Tensor mask = in.size() > 7 ? mask_view(in[7], ct, g) : Tensor();
    with_compute_type(in[0].dtype(), [&]<class T>() {
      std::vector<Tensor> c;
      for (size_t i = 0; i < 7; ++i) c.push_back(contiguous_as(in[i], ct));
      std::vector<Tensor> grads;
      for (size_t i = 0; i < 3; ++i) grads.push_back(out[i].dtype() == ct ? out[i] : Tensor::empty(out[i].shape(), ct));
      const T* m = mask.defined() ? mask.data<T>() : nullptr;
      bool done = false;
      if constexpr (std::is_same_v<T, float>) {
        if (g.D % kNr == 0 && g.Dv % kNr == 0) {
          flash_backward_f32(g, c[0].data<T>(), c[1].data<T>(), c[2].data<T>(), c[3].data<T>(), c[4].data<T>(),
                             c[5].data<T>(), c[6].data<T>(), m, grads[0].data<T>(), grads[1].data<T>(), grads[2].data<T>());
          done = true;
        }
      }
      if (!done)
        flash_backward<T>(g, c[0].data<T>(), c[1].data<T>(), c[2].data<T>(), c[3].data<T>(), c[4].data<T>(), c[5].data<T>(),
                          c[6].data<T>(), m, grads[0].data<T>(), grads[1].data<T>(), grads[2].data<T>());
      for (size_t i = 0; i < 3; ++i)
        if (out[i].dtype() != ct) out[i].copy_(grads[i]);
    });
  };
  add_op(std::move(b));
}

}  // namespace detail
}  // namespace sinter

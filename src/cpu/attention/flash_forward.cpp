// FlashAttention-2 forward: the generic kernel (f64) and the f32 kernel on the register-blocked
// micro-kernels (flash_tiles.h), for any head dims.
#include "cpu/attention/flash_tiles.h"
#include "cpu/simd/transpose.h"
#include "core/parallel.h"

namespace sinter::detail {
namespace {

// Scores for a few rows (decode) straight from K's rows, row by row: s(r * rs + c) = q_r . K_c (the
// softmax then runs along each row's keys, a register of keys at a time), each K row read once
// for all rows (at Lq = 1 a blocked kernel would waste most of its lanes).
// KC keys at a time, so ROWS x KC independent accumulators hide the add latency.
// Decode is a stream through K and V: rows this many keys ahead are prefetched, a few lines per
// step, so the loads find them in cache (the hardware prefetcher alone left ~1/3 of the read
// bandwidth unused here).
constexpr int64_t kPrefetchKeys = 32;
template <class KT> SINTER_INLINE void prefetch_row(const KT* row, int64_t n) {
  for (int64_t x = 0; x < n; x += 64 / int64_t(sizeof(KT))) __builtin_prefetch(row + x, 0, 3);
}

#ifdef __AVX512F__
// Sixteen dot products' registers reduced together: lane n of the result = the sum of a[n]'s lanes.
// Four rounds, each adding a register's two halves of two sources interleaved (30 shuffles and 15
// adds, against 15 adds and 8 shuffles for each register alone); the sources go in as a[4k + j]
// at slot k + 4j, the order the rounds bring them out in.
SINTER_INLINE fvec reduce16(const fvec (&a)[16]) {
  fvec b[8], c[4], d[2];
  for (int i = 0; i < 8; ++i) {
    const fvec x = a[(2 * i) % 4 * 4 + (2 * i) / 4], y = a[(2 * i + 1) % 4 * 4 + (2 * i + 1) / 4];
    b[i] = __builtin_shufflevector(x, y, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           __builtin_shufflevector(x, y, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  }
  for (int i = 0; i < 4; ++i)
    c[i] = __builtin_shufflevector(b[2 * i], b[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           __builtin_shufflevector(b[2 * i], b[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  for (int i = 0; i < 2; ++i)
    d[i] = __builtin_shufflevector(c[2 * i], c[2 * i + 1], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29) +
           __builtin_shufflevector(c[2 * i], c[2 * i + 1], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
  return __builtin_shufflevector(d[0], d[1], 0, 2, 16, 18, 4, 6, 20, 22, 8, 10, 24, 26, 12, 14, 28, 30) +
         __builtin_shufflevector(d[0], d[1], 1, 3, 17, 19, 5, 7, 21, 23, 9, 11, 25, 27, 13, 15, 29, 31);
}
#endif

// q's rows are D rounded up to kV floats apart, zero past D; K's rows end at D (a tail is read masked).
// KT: K's and V's elements, f32 or bf16 (widened as they are loaded).
template <int ROWS, int KC, class KT>
SINTER_INLINE void scores_few_block(const float* q, const KT* K, float* s, int64_t c, int64_t D, int64_t rs, int64_t k_rs) {
  for (int j = 0; j < KC; ++j) prefetch_row(K + (c + j + kPrefetchKeys) * k_rs, D);
  const int64_t Dp = round_up(D, kV), whole = D / kV * kV;
  fvec acc[ROWS][KC];
  for (int r = 0; r < ROWS; ++r)
    for (int j = 0; j < KC; ++j) acc[r][j] = fvec{};
  auto step = [&](int64_t d, auto load) {
    fvec kv[KC];
    for (int j = 0; j < KC; ++j) kv[j] = load(K + (c + j) * k_rs + d);
    for (int r = 0; r < ROWS; ++r) {
      const fvec qv = vload(q + r * Dp + d);
      for (int j = 0; j < KC; ++j) acc[r][j] += qv * kv[j];
    }
  };
  for (int64_t d = 0; d < whole; d += kV) step(d, [](const KT* p) { return vload(p); });
  if (whole < D) step(whole, [&](const KT* p) { return vload_n(p, D - whole); });
#if defined(__AVX__) && !defined(__AVX512F__)
  if constexpr (ROWS * KC == 8) {  // eight dot products reduced together: 3 rounds of pairwise adds
    const fvec* a = &acc[0][0];
    const fvec h0 = __builtin_ia32_haddps256(a[0], a[1]), h1 = __builtin_ia32_haddps256(a[2], a[3]);
    const fvec h2 = __builtin_ia32_haddps256(a[4], a[5]), h3 = __builtin_ia32_haddps256(a[6], a[7]);
    const fvec g0 = __builtin_ia32_haddps256(h0, h1), g1 = __builtin_ia32_haddps256(h2, h3);
    // g0 = [s0 s1 s2 s3 | s0' s1' s2' s3'] (halves of the 128-bit lanes), likewise g1 for s4..s7
    const fvec lo = __builtin_shufflevector(g0, g1, 0, 1, 2, 3, 8, 9, 10, 11);
    const fvec hi = __builtin_shufflevector(g0, g1, 4, 5, 6, 7, 12, 13, 14, 15);
    const fvec sum = lo + hi;  // sum[n] = dot product n = r * KC + j
    for (int n = 0; n < 8; ++n) s[(n / KC) * rs + c + n % KC] = sum[n];
    return;
  }
#endif
#ifdef __AVX512F__
  if constexpr (ROWS * KC == 16) {  // lane n = dot product n = r * KC + j
    const fvec sum = reduce16(reinterpret_cast<const fvec(&)[16]>(acc));
    for (int r = 0; r < ROWS; ++r) std::memcpy(s + r * rs + c, &sum[r * KC], KC * sizeof(float));
    return;
  }
#endif
  for (int r = 0; r < ROWS; ++r)
    for (int j = 0; j < KC; ++j) {
      float t = 0;
      for (int l = 0; l < kV; ++l) t += acc[r][j][l];
      s[r * rs + c + j] = t;
    }
}
template <int ROWS, class KT>
void scores_few(const float* q, const KT* K, float* s, int64_t cols, int64_t D, int64_t rs, int64_t k_rs) {
#ifdef __AVX512F__
  constexpr int KC = ROWS == 1 ? 16 : ROWS == 2 ? 8 : 4;  // ROWS x KC = 16 sums reduced at once but at 3 rows
#else
  constexpr int KC = ROWS == 1 ? 8 : ROWS == 2 ? 4 : 2;
#endif
  int64_t c = 0;
  for (; c + KC <= cols; c += KC) scores_few_block<ROWS, KC>(q, K, s, c, D, rs, k_rs);
  for (; c < cols; ++c) scores_few_block<ROWS, 1>(q, K, s, c, D, rs, k_rs);
}
// Row c of K at K + c * k_rs.
template <class KT>
void scores_few_rows(const float* q, const KT* K, float* s, int64_t rows, int64_t cols, int64_t D, int64_t rs, int64_t k_rs) {
  switch (rows) {
    case 1: return scores_few<1>(q, K, s, cols, D, rs, k_rs);
    case 2: return scores_few<2>(q, K, s, cols, D, rs, k_rs);
    case 3: return scores_few<3>(q, K, s, cols, D, rs, k_rs);
    default: return scores_few<4>(q, K, s, cols, D, rs, k_rs);
  }
}

// acc(rows, Dv) += sum over c of p(r, c) V(c, :) for a few rows (decode): V streamed row by row
// in order, four keys per pass over the (L1-resident) accumulator rows; p(r, c) at p[r * rs + c],
// row c of V at V + c * v_rs. acc's rows are Dv rounded up to kV floats apart; a tail of V's rows
// is read masked.
template <int ROWS, class KT> void pv_few(const float* ps, int64_t rs, const KT* V, float* acc, int64_t cols, int64_t Dv, int64_t v_rs) {
  const int64_t Dp = round_up(Dv, kV), whole = Dv / kV * kV, tail = Dv - whole;
  // acc's rows += four keys' rows of V (at v, v_rs apart) over [d, d + kV), weighted by p
  auto four = [&](const KT* v, const float (*p)[ROWS], int64_t d, auto load) {
    const fvec v0 = load(v + d), v1 = load(v + v_rs + d), v2 = load(v + 2 * v_rs + d), v3 = load(v + 3 * v_rs + d);
    for (int r = 0; r < ROWS; ++r) vstore(acc + r * Dp + d, vload(acc + r * Dp + d) + v0 * p[0][r] + v1 * p[1][r] + v2 * p[2][r] + v3 * p[3][r]);
  };
  auto whole_load = [](const KT* x) { return vload(x); };
  auto tail_load = [tail](const KT* x) { return vload_n(x, tail); };
  int64_t c = 0;
  for (; c + 4 <= cols; c += 4) {
    float p[4][ROWS];
    for (int j = 0; j < 4; ++j)
      for (int r = 0; r < ROWS; ++r) p[j][r] = ps[r * rs + c + j];
    const KT* v = V + c * v_rs;
    for (int j = 0; j < 4; ++j) prefetch_row(v + (j + kPrefetchKeys) * v_rs, Dv);
    for (int64_t d = 0; d < whole; d += kV) four(v, p, d, whole_load);
    if (tail) four(v, p, whole, tail_load);
  }
  for (; c < cols; ++c)
    for (int64_t d = 0; d < Dp; d += kV) {
      const fvec v0 = d < whole ? vload(V + c * v_rs + d) : vload_n(V + c * v_rs + d, tail);
      for (int r = 0; r < ROWS; ++r) vstore(acc + r * Dp + d, vload(acc + r * Dp + d) + v0 * ps[r * rs + c]);
    }
}
template <class KT>
void pv_few_rows(const float* ps, int64_t rs, const KT* V, float* acc, int64_t rows, int64_t cols, int64_t Dv, int64_t v_rs) {
  switch (rows) {
    case 1: return pv_few<1>(ps, rs, V, acc, cols, Dv, v_rs);
    case 2: return pv_few<2>(ps, rs, V, acc, cols, Dv, v_rs);
    case 3: return pv_few<3>(ps, rs, V, acc, cols, Dv, v_rs);
    default: return pv_few<4>(ps, rs, V, acc, cols, Dv, v_rs);
  }
}

// One row's online softmax over its keys, laid out contiguously (decode): the new running max m
// (-inf while nothing is visible), p = 2^(s - max) in place, l = l alpha + sum p, a register of
// keys at a time.
void softmax_row(float* s, int64_t cols, float& m, float& l, float& alpha) {
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  const int64_t whole = cols / kV * kV;
  fvec mx = fvec{} + m;
  for (int64_t c = 0; c < whole; c += kV) mx = vmax(mx, vload(s + c));
  float row_max = mx[0];
  for (int l = 1; l < kV; ++l) row_max = std::max(row_max, mx[l]);
  for (int64_t c = whole; c < cols; ++c) row_max = std::max(row_max, s[c]);
  const float m_use = row_max == ninf ? 0.0f : row_max;  // nothing visible yet: p = 0, alpha = 0
  alpha = vexp2_nonpos(fvec{} + (m - m_use))[0];
  fvec sum = {};
  for (int64_t c = 0; c < whole; c += kV) {
    const fvec p = vexp2_nonpos(vload(s + c) - m_use);
    vstore(s + c, p);
    sum += p;
  }
  if (whole < cols) {  // the last keys, the lanes past them -inf (p = 0)
    fvec t = fvec{} + ninf;
    std::memcpy(&t, s + whole, size_t(cols - whole) * sizeof(float));
    const fvec p = vexp2_nonpos(t - m_use);
    std::memcpy(s + whole, &p, size_t(cols - whole) * sizeof(float));
    sum += p;
  }
  float total = 0;
  for (int k = 0; k < kV; ++k) total += sum[k];
  l = l * alpha + total;
  m = row_max;
}

}  // namespace

template <class T>
void flash_forward(const Geometry& g, const T* q, const T* k, const T* v, const T* mask, T* o, T* lse) {
  const int64_t q_tiles = (g.Lq + kBr - 1) / kBr, group = g.Hq / g.Hkv;
  parallel_dynamic(0, g.B * g.Hq * q_tiles, [&](const auto& next) {
    std::vector<T> s(static_cast<size_t>(kBr * kBc)), acc(static_cast<size_t>(kBr * g.Dv)), m(static_cast<size_t>(kBr)),
        l(static_cast<size_t>(kBr)), kt(static_cast<size_t>(g.D * kBc)), z(static_cast<size_t>(kBc));
    for (int64_t job; (job = next()) >= 0;) {
      const int64_t qt = q_tiles - 1 - job % q_tiles, bh = job / q_tiles, b = bh / g.Hq, h = bh % g.Hq, hk = h / group;  // late (costly) tiles first
      const int64_t i0 = qt * kBr, rows = std::min(kBr, g.Lq - i0);
      const T* Q = g.lq.at(q, b, h, i0);
      const T* K = g.lk.at(k, b, hk, 0);
      const T* V = g.lv.at(v, b, hk, 0);
      std::fill(acc.begin(), acc.end(), T(0));
      std::fill(m.begin(), m.end(), -std::numeric_limits<T>::infinity());
      std::fill(l.begin(), l.end(), T(0));
      const int64_t kend = key_limit(g, i0 + rows - 1);  // tiles past the last row's limit are fully masked
      for (int64_t j0 = 0; j0 < kend; j0 += kBc) {
        const int64_t cols = std::min(kBc, kend - j0);
        // K tile transposed to (D, cols): scores then vectorize across keys instead of reducing over D.
        for (int64_t c = 0; c < cols; ++c)
          for (int64_t d = 0; d < g.D; ++d) kt[size_t(d * kBc + c)] = K[(j0 + c) * g.lk.r + d];
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t lim = key_limit(g, i0 + r) - j0, first = key_first(g, i0 + r) - j0;
          const T* qr = Q + r * g.lq.r;
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
            const T* vc = V + (j0 + c) * g.lv.r;
#pragma omp simd
            for (int64_t d = 0; d < g.Dv; ++d) ar[d] += p * vc[d];
          }
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        T* orow = g.lo.at(o, b, h, i0 + r);
        const T inv = l[size_t(r)] > 0 ? T(1) / l[size_t(r)] : T(0);  // no visible key: 0, lse -inf
        for (int64_t d = 0; d < g.Dv; ++d) orow[d] = acc[size_t(r * g.Dv + d)] * inv;
        lse[(b * g.Hq + h) * g.Lq + i0 + r] = l[size_t(r)] > 0 ? m[size_t(r)] + std::log(l[size_t(r)]) : -std::numeric_limits<T>::infinity();
      }
    }
  });
}


template void flash_forward<double>(const Geometry&, const double*, const double*, const double*, const double*, double*,
                                    double*);

// qt(D, kFBr) = scale (rows of Q)^T, zero from `rows` to rows_r: 16 x 16 blocks transposed in
// registers, qt written a row at a time (writing down its columns, 256 bytes apart, touched a line
// per float: at D = 256 and 37 rows, two thirds of a job).
void transpose_scaled(const float* const* q, int64_t rows, int64_t rows_r, int64_t D, float scale, float* qt) {
#if defined(__AVX512F__)
  const __m512 s = _mm512_set1_ps(scale);
  for (int64_t r0 = 0; r0 < rows_r; r0 += 16)
    for (int64_t d0 = 0; d0 < D; d0 += 16) {
      const int64_t nd = std::min<int64_t>(16, D - d0);
      const __mmask16 k = __mmask16((1u << nd) - 1);
      __m512i t[16];
      for (int i = 0; i < 16; ++i) t[i] = r0 + i < rows ? _mm512_castps_si512(_mm512_maskz_loadu_ps(k, q[r0 + i] + d0)) : _mm512_setzero_si512();
      cpu::simd::transpose16(t);
      for (int64_t i = 0; i < nd; ++i) _mm512_storeu_ps(qt + (d0 + i) * kFBr + r0, _mm512_mul_ps(_mm512_castsi512_ps(t[i]), s));
    }
#else
  for (int64_t d = 0; d < D; ++d) {
    float* qd = qt + d * kFBr;
    for (int64_t r = 0; r < rows; ++r) qd[r] = q[r][d] * scale;
    for (int64_t r = rows; r < rows_r; ++r) qd[r] = 0.0f;
  }
#endif
}

// The forward's per-thread buffers, grown to the head dims of the call.
struct ForwardScratch {
  std::vector<float> qt, qs, sT, acc, m, l, alpha, z;
  std::vector<int64_t> lim_of, first_of, row_keys, strip_keys;
  std::vector<const float*> mask_of;
  std::vector<uint64_t> element_of;
  void reserve(int64_t D, int64_t Dv) {  // padded head dims: D and Dv rounded up
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
template <class KT>
void flash_forward_f32(const Geometry& g, const float* q, const KT* k, const KT* v, const float* mask, float* o, float* lse) {
  static_assert(kFBr == kFBc && kFBr % kNr == 0, "S^T tiles are square, padded rows a whole block");
  const int64_t group = g.Hq / g.Hkv, D = g.D, Dv = g.Dv, R = group * g.Lq, tiles = (R + kFBr - 1) / kFBr;
  // Any head dims: q's rows in scratch zero-padded to Dq (the decode kernel reads whole registers),
  // the accumulators' to Da (the P V kernels' blocks); K's and V's tails are read masked.
  const int64_t Dq = round_up(D, kV), Da = round_up(Dv, kNr), Dd = round_up(Dv, kV);  // Dd: the decode kernel's acc rows
  // Scores in log2 units (q scaled by scale log2(e)): the softmax takes 2^t (vexp2_nonpos), the
  // mask is scaled to match, and lse goes back to natural units.
  const float scale = float(g.scale * double(kLog2e)), ninf = -std::numeric_limits<float>::infinity();
  if constexpr (!std::is_same_v<KT, float>)
    SINTER_CHECK(R <= 4, "[internal] sdpa: bf16 K and V are read in place only by the few-row kernels, not for ", R, " rows a job");
  parallel_dynamic(0, g.B * g.Hkv * tiles, [&](const auto& next) {
    // Each thread's scratch lives across calls: a decode step's attention is a few microseconds,
    // and allocating (and zeroing) ~50 KiB of it per call had cost half of that.
    thread_local ForwardScratch sc;
    sc.reserve(Dq, Da);
    std::vector<float>&qt = sc.qt, &qs = sc.qs, &sT = sc.sT, &acc = sc.acc, &m = sc.m, &l = sc.l, &alpha = sc.alpha, &z = sc.z;
    std::vector<int64_t>&lim_of = sc.lim_of, &first_of = sc.first_of, &row_keys = sc.row_keys, &strip_keys = sc.strip_keys;
    std::vector<const float*>& mask_of = sc.mask_of;
    std::vector<uint64_t>& element_of = sc.element_of;
    for (int64_t job; (job = next()) >= 0;) {
      // A head's tiles last to first: under a causal mask the late ones see the most keys, so the
      // cheap ones come last and even the threads out.
      const int64_t t = tiles - 1 - job % tiles, bk = job / tiles, b = bk / g.Hkv, hk = bk % g.Hkv;
      const int64_t r0 = t * kFBr, rows = std::min(kFBr, R - r0), rows_r = (rows + kNr - 1) / kNr * kNr;
      const int64_t row_base = (b * g.Hq + hk * group) * g.Lq + r0;  // the job's rows are contiguous in lse
      // Row r of the job: query head hk * group + (r0 + r) / Lq, position (r0 + r) % Lq.
      auto q_row = [&](int64_t r) { return g.lq.at(q, b, hk * group + (r0 + r) / g.Lq, (r0 + r) % g.Lq); };
      const KT* K = g.lk.at(k, b, hk, 0);
      const KT* V = g.lv.at(v, b, hk, 0);
      const int64_t k_rs = g.lk.r, v_rs = g.lv.r;
      const bool few = rows <= 4;
      const int64_t acc_rs = few ? Dd : Da;  // the accumulators' rows, as the P V kernel of the job lays them
      if (few) {
        for (int64_t r = 0; r < rows; ++r) {
          const float* Qr = q_row(r);
          for (int64_t d = 0; d < D; ++d) qs[size_t(r * Dq + d)] = Qr[d] * scale;
          for (int64_t d = D; d < Dq; ++d) qs[size_t(r * Dq + d)] = 0.0f;
        }
      } else {  // qt(D, kFBr) = scale Q^T, zero past the last row
        const float* Qr[kFBr];
        for (int64_t r = 0; r < rows; ++r) Qr[r] = q_row(r);
        transpose_scaled(Qr, rows, rows_r, D, scale, qt.data());
      }
      std::fill(acc.begin(), acc.begin() + (few ? rows : kFBr) * Da, 0.0f);  // the rows the P V kernels touch
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
      // Keys per tile; where score (r, c) lies: S^T (c * kFBr + r) for tiles, row by row
      // (r * kFewBc + c) for a few rows.
      const int64_t bc = few ? kFewBc : kFBc, ld = kFBr, cs = few ? 1 : ld, rs = few ? kFewBc : 1;
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
        if (few) scores_few_rows(qs.data(), K + j0 * k_rs, sT.data(), rows, cols, D, rs, k_rs);
        else if constexpr (std::is_same_v<KT, float>) scores_tile(K + j0 * k_rs, qt.data(), sT.data(), cols, rows_r, D, k_rs, cut ? strip_keys.data() : nullptr);  // S^T = K_j (scale Q)^T
        // Keys outside a row's [first, lim) are -inf; then the explicit mask.
        if (!(j0 + cols <= min_lim && j0 >= max_first))
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t lim = std::clamp<int64_t>(lim_of[size_t(r)] - j0, 0, cols);
            const int64_t first = std::clamp<int64_t>(first_of[size_t(r)] - j0, 0, lim);
            for (int64_t c = 0; c < first; ++c) sT[size_t(c * cs + r * rs)] = ninf;
            for (int64_t c = lim; c < cols; ++c) sT[size_t(c * cs + r * rs)] = ninf;
          }
        if (g.has_mask)
          for (int64_t r = 0; r < rows; ++r) {
            const float* mr = mask_of[size_t(r)] + j0 * g.ms[3];
            for (int64_t c = 0; c < cols; ++c) sT[size_t(c * cs + r * rs)] += mr[c * g.ms[3]] * kLog2e;
          }
        // Online softmax: new max, P = exp(S - max), rescale; a few rows along each row's keys, a
        // tile's a register of rows at a time, the max as four independent chains (one chain waits
        // out vmaxps's latency per key). The scratch through plain pointers, as the thread_local
        // behind them is otherwise looked up again per block.
        float *const st = sT.data(), *const mp = m.data(), *const lp = l.data(), *const ap = alpha.data();
        if (few)
          for (int64_t r = 0; r < rows; ++r) softmax_row(st + r * rs, cols, mp[r], lp[r], ap[r]);
        for (int64_t rb = 0; !few && rb < rows; rb += kV) {  // lanes past `rows` hold finite padding
          fvec mx = vload(mp + rb), mx1 = mx, mx2 = mx, mx3 = mx;
          int64_t c = 0;
          for (; c + 4 <= cols; c += 4) {
            const float* sc4 = st + c * ld + rb;
            mx = vmax(mx, vload(sc4)), mx1 = vmax(mx1, vload(sc4 + ld));
            mx2 = vmax(mx2, vload(sc4 + 2 * ld)), mx3 = vmax(mx3, vload(sc4 + 3 * ld));
          }
          for (; c < cols; ++c) mx = vmax(mx, vload(st + c * ld + rb));
          mx = vmax(vmax(mx, mx1), vmax(mx2, mx3));
          const fvec m_use = mx == ninf ? fvec{} : mx;  // nothing visible yet: p = 0, alpha = 0
          const fvec a = vexp2_nonpos(vload(mp + rb) - m_use);
          fvec sum = {};
          for (c = 0; c < cols; ++c) {
            const fvec p = vexp2_nonpos(vload(st + c * ld + rb) - m_use);
            vstore(st + c * ld + rb, p);
            sum += p;
          }
          vstore(lp + rb, vload(lp + rb) * a + sum);
          vstore(mp + rb, mx);
          vstore(ap + rb, a);
        }
        for (int64_t r = 0; r < rows; ++r) {
          if (alpha[size_t(r)] != 1.0f) {
            float* ar = acc.data() + r * acc_rs;
            const float a = alpha[size_t(r)];
            for (int64_t d = 0; d < Dv; ++d) ar[d] *= a;
          }
          if (g.dropout > 0) {  // the normaliser counted every key; the output takes only the kept ones
            dropout_multipliers(g, element_of[size_t(r)] + uint64_t(j0), cols, z.data());
            for (int64_t c = 0; c < cols; ++c) sT[size_t(c * cs + r * rs)] *= z[size_t(c)];
          }
        }
        if (few) pv_few_rows(sT.data(), rs, V + j0 * v_rs, acc.data(), rows, cols, Dv, v_rs);
        else if constexpr (std::is_same_v<KT, float>) pv_tile(sT.data(), V + j0 * v_rs, acc.data(), rows, cols, Da, 1, ld, Da, cut ? row_keys.data() : nullptr, v_rs, nullptr, Dv);  // acc += P V, P from P^T
      }
      for (int64_t r = 0; r < rows; ++r) {
        float* orow = g.lo.at(o, b, hk * group + (r0 + r) / g.Lq, (r0 + r) % g.Lq);
        const float inv = l[size_t(r)] > 0 ? 1.0f / l[size_t(r)] : 0.0f;  // no visible key: 0, lse -inf
        for (int64_t d = 0; d < Dv; ++d) orow[d] = acc[size_t(r * acc_rs + d)] * inv;
        lse[row_base + r] = l[size_t(r)] > 0 ? m[size_t(r)] * kLn2 + std::log(l[size_t(r)]) : ninf;
      }
    }
  });
}

template void flash_forward_f32<float>(const Geometry&, const float*, const float*, const float*, const float*, float*, float*);
template void flash_forward_f32<bf16>(const Geometry&, const float*, const bf16*, const bf16*, const float*, float*, float*);

}  // namespace sinter::detail

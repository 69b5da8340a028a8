// FlashAttention-2 backward: the f32 kernel on the register-blocked micro-kernels (head dims
// multiples of kNr; sdpa_cpu.cpp pads others) and the generic kernel (f64).
#include "cpu/attention/flash_tiles.h"
#include "core/parallel.h"

namespace sinter::detail {
namespace {
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

}  // namespace

void flash_backward_f32(const Geometry& g, const float* q, const float* k, const float* v, const float* o, const float* lse,
                        const float* dout, const float* dlse, const float* mask, float* dq, float* dk, float* dv) {
  const int64_t group = g.Hq / g.Hkv, D = g.D, Dv = g.Dv;
  // Scores recomputed in log2 units, as the forward makes them (q scaled by scale log2(e), lse and
  // the mask by log2(e)); dS takes the natural scale.
  const float scale = float(g.scale), q_scale = float(g.scale * double(kLog2e));
  parallel_dynamic(0, g.B * g.Hkv, [&](const auto& next) {
    std::vector<float> kt(static_cast<size_t>(D * kFBc)), vt(static_cast<size_t>(Dv * kFBc)), p(static_cast<size_t>(kFBr * kFBc)),
        dp(static_cast<size_t>(kFBr * kFBc)), qs(static_cast<size_t>(kFBr * D)),
        delta(static_cast<size_t>(group * g.Lq)), z(static_cast<size_t>(kFBc));
    std::vector<int64_t> lim_of(static_cast<size_t>(kFBr)), first_of(static_cast<size_t>(kFBr)), query_first(static_cast<size_t>(kFBc));
    for (int64_t job; (job = next()) >= 0;) {
      const int64_t b = job / g.Hkv, hk = job % g.Hkv;
      // Every operand's rows where they lie (g's layouts); lse and dlse contiguous.
      const int64_t k_rs = g.lk.r, v_rs = g.lv.r, dk_rs = g.ldk.r, dv_rs = g.ldv.r, q_rs = g.lq.r, do_rs = g.ldo.r, dq_rs = g.ldq.r;
      const float* K = g.lk.at(k, b, hk, 0);
      const float* V = g.lv.at(v, b, hk, 0);
      float* dK = g.ldk.at(dk, b, hk, 0);
      float* dV = g.ldv.at(dv, b, hk, 0);
      for (int64_t j = 0; j < g.Lkv; ++j) {
        std::fill(dK + j * dk_rs, dK + j * dk_rs + D, 0.0f);
        std::fill(dV + j * dv_rs, dV + j * dv_rs + Dv, 0.0f);
      }
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        // delta_i = rowsum(dO_i * O_i) - dLSE_i (dLSE_i / dS_ij = P_ij)
        const int64_t base = (b * g.Hq + h) * g.Lq;
        for (int64_t i = 0; i < g.Lq; ++i) {
          const float *O = g.lo.at(o, b, h, i), *dO = g.ldo.at(dout, b, h, i);
          delta[size_t((h - hk * group) * g.Lq + i)] =
              cpu::simd::lane_sum<float>(Dv, [&](int64_t d) { return dO[d] * O[d]; }) - dlse[base + i];
          float* dQ = g.ldq.at(dq, b, h, i);
          std::fill(dQ, dQ + D, 0.0f);
        }
      }
      for (int64_t j0 = 0; j0 < g.Lkv; j0 += kFBc) {
        const int64_t cols = std::min(kFBc, g.Lkv - j0), cols_r = (cols + kNr - 1) / kNr * kNr;
        transpose_tile(K + j0 * k_rs, k_rs, kt.data(), cols, D);  // kt(D, kFBc) = K_j^T
        transpose_tile(V + j0 * v_rs, v_rs, vt.data(), cols, Dv);
        // Query rows that see any key of this tile: i + offset >= j0 (causal), and with a window
        // i + offset + 1 - window < j0 + cols.
        const int64_t i_first = g.causal ? std::max<int64_t>(0, j0 - g.offset()) : 0;
        const int64_t i_end = g.window > 0 ? std::clamp<int64_t>(j0 + cols + g.window - 1 - g.offset(), 0, g.Lq) : g.Lq;
        for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
          const int64_t base = (b * g.Hq + h) * g.Lq;
          const float *Q = g.lq.at(q, b, h, 0), *dO = g.ldo.at(dout, b, h, 0), *LSE = lse + base;
          const float* dl_h = delta.data() + (h - hk * group) * g.Lq;
          float* dQ = g.ldq.at(dq, b, h, 0);
          for (int64_t i0 = i_first / kFBr * kFBr; i0 < i_end; i0 += kFBr) {
            const int64_t rows = std::min(kFBr, g.Lq - i0);
            for (int64_t r = 0; r < rows; ++r)
              for (int64_t d = 0; d < D; ++d) qs[size_t(r * D + d)] = Q[(i0 + r) * q_rs + d] * q_scale;
            // Row r sees keys [first_of[r], lim_of[r]) of the tile. On the causal diagonal the
            // tile GEMMs skip what no row sees: S and dP a row block's columns past its last key,
            // dQ the same, dV and dK (P and dS read transposed) a key block's rows before the
            // first query that sees it (query_first).
            bool partial = false;
            for (int64_t r = 0; r < rows; ++r) {
              const float l = LSE[i0 + r];
              lim_of[size_t(r)] = (std::isinf(l) || std::isnan(l)) ? 0 : std::clamp<int64_t>(key_limit(g, i0 + r) - j0, 0, cols);
              first_of[size_t(r)] = std::clamp<int64_t>(key_first(g, i0 + r) - j0, 0, lim_of[size_t(r)]);
              partial = partial || lim_of[size_t(r)] < cols;
            }
            if (partial) {
              int64_t seen = 0;
              for (int64_t r = 0; r < rows; ++r)
                for (; seen < lim_of[size_t(r)]; ++seen) query_first[size_t(seen)] = r;
              for (; seen < cols; ++seen) query_first[size_t(seen)] = rows;
            }
            const int64_t* row_lim = partial ? lim_of.data() : nullptr;
            const int64_t* key_first_query = partial ? query_first.data() : nullptr;
            scores_tile(qs.data(), kt.data(), p.data(), rows, cols_r, D, -1, nullptr, row_lim);                  // S
            scores_tile(dO + i0 * do_rs, vt.data(), dp.data(), rows, cols_r, Dv, do_rs, nullptr, row_lim);  // dP = dO V^T
            for (int64_t r = 0; r < rows; ++r) {
              float *pr = p.data() + r * kFBc, *dpr = dp.data() + r * kFBc;
              const float l = LSE[i0 + r] * kLog2e, dl = dl_h[i0 + r];
              const int64_t lim = lim_of[size_t(r)], first = first_of[size_t(r)];
              for (int64_t c = 0; c < first; ++c) pr[c] = dpr[c] = 0.0f;
              if (const float* mr = mask_row(g, mask, b, h, i0 + r))
                for (int64_t c = first; c < lim; ++c) pr[c] += mr[(j0 + c) * g.ms[3]] * kLog2e;
              if (g.dropout > 0) {  // dP = dP' z; dV takes the kept P z
                dropout_multipliers(g, element_index(g, b, h, i0 + r, j0 + first), lim - first, z.data());
                for (int64_t c = first; c < lim; ++c) {
                  const float pc = std::exp2(pr[c] - l), zc = z[size_t(c - first)];
                  dpr[c] = pc * (dpr[c] * zc - dl) * scale;
                  pr[c] = pc * zc;
                }
              } else {
                // P = 2^(S - LSE) <= 1 (log2 units) and dS, a register at a time (the compiler's own
                // vectorization of this loop stays at 256 bits on AVX-512).
                const fvec lv = fvec{} + l, dlv = fvec{} + dl, sv = fvec{} + scale;
                // Whole registers up to the row's end (past lim is cleared below): a scalar tail
                // costs more on the diagonal tiles, where most rows end mid-register.
                int64_t c = first;
                for (; c < lim && c + kV <= kFBc; c += kV) {
                  const fvec pc = vexp2_nonpos(vload(pr + c) - lv);
                  vstore(pr + c, pc);
                  vstore(dpr + c, pc * (vload(dpr + c) - dlv) * sv);  // dS
                }
                for (; c < lim; ++c) {
                  pr[c] = std::exp2(pr[c] - l);
                  dpr[c] = pr[c] * (dpr[c] - dl) * scale;
                }
              }
              for (int64_t c = lim; c < kFBc; ++c) pr[c] = dpr[c] = 0.0f;
            }
            // dV_j += P^T dO_i and dK_j += dS^T Q_i: the same kernel reading P and dS transposed.
            pv_tile(p.data(), dO + i0 * do_rs, dV + j0 * dv_rs, cols, rows, Dv, 1, kFBc, dv_rs, nullptr, do_rs, key_first_query);
            pv_tile(dp.data(), Q + i0 * q_rs, dK + j0 * dk_rs, cols, rows, D, 1, kFBc, dk_rs, nullptr, q_rs, key_first_query);
            pv_tile(dp.data(), K + j0 * k_rs, dQ + i0 * dq_rs, rows, cols, D, kFBc, 1, dq_rs, row_lim, k_rs);  // dQ_i += dS K_j
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
      const int64_t k_rs = g.lk.r, v_rs = g.lv.r, dk_rs = g.ldk.r, dv_rs = g.ldv.r;
      const T* K = g.lk.at(k, b, hk, 0);
      const T* V = g.lv.at(v, b, hk, 0);
      T* dK = g.ldk.at(dk, b, hk, 0);
      T* dV = g.ldv.at(dv, b, hk, 0);
      for (int64_t j = 0; j < g.Lkv; ++j) {
        std::fill(dK + j * dk_rs, dK + j * dk_rs + g.D, T(0));
        std::fill(dV + j * dv_rs, dV + j * dv_rs + g.Dv, T(0));
      }
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        const int64_t base = (b * g.Hq + h) * g.Lq;
        const T *Q = g.lq.at(q, b, h, 0), *O = g.lo.at(o, b, h, 0), *dO = g.ldo.at(dout, b, h, 0), *LSE = lse + base;
        const int64_t q_rs = g.lq.r, o_rs = g.lo.r, do_rs = g.ldo.r, dq_rs = g.ldq.r;
        T* dQ = g.ldq.at(dq, b, h, 0);
        for (int64_t i = 0; i < g.Lq; ++i) {  // delta_i = rowsum(dO_i * O_i) - dLSE_i (dLSE_i / dS_ij = P_ij)
          std::fill(dQ + i * dq_rs, dQ + i * dq_rs + g.D, T(0));
          T s = 0;
          for (int64_t d = 0; d < g.Dv; ++d) s += dO[i * do_rs + d] * O[i * o_rs + d];
          delta[size_t(i)] = s - dlse[base + i];
        }
        for (int64_t i = 0; i < g.Lq; ++i) {
          if (std::isinf(LSE[i]) || std::isnan(LSE[i])) continue;  // a row that saw no key
          const int64_t kend = key_limit(g, i), kfirst = key_first(g, i);
          const T *qi = Q + i * q_rs, *doi = dO + i * do_rs, *mr = mask_row(g, mask, b, h, i);
          T* dqi = dQ + i * dq_rs;
          for (int64_t j0 = kfirst; j0 < kend; j0 += kBc) {
            const int64_t cols = std::min(kBc, kend - j0);
            if (g.dropout > 0) dropout_multipliers(g, element_index(g, b, h, i, j0), cols, z.data());
            for (int64_t c = 0; c < cols; ++c) {  // recompute P and dP for this row and key tile
              const T *kc = K + (j0 + c) * k_rs, *vc = V + (j0 + c) * v_rs;
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
              const T *kc = K + (j0 + c) * k_rs;
              T *dkc = dK + (j0 + c) * dk_rs, *dvc = dV + (j0 + c) * dv_rs;
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


template void flash_backward<double>(const Geometry&, const double*, const double*, const double*, const double*,
                                     const double*, const double*, const double*, const double*, double*, double*, double*);

}  // namespace sinter::detail

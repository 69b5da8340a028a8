#include <cmath>
#include <cstring>
#include <vector>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "cpu/cpu.h"
#include "cpu/simd/lanes.h"
#include "ops/scalar_fns.h"
#include "sinter/random.h"

namespace sinter::cpu {
namespace {
template <class T> constexpr bool floating_v = std::is_floating_point_v<compute_t<T>>;
int64_t grain_rows(int64_t d) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(d, 1)); }
}  // namespace

namespace {
// Mean (0 for rms_norm) and 1 / sqrt(var + eps) of rows [r, r + K), each summed in lane_sum's
// order (generated code's norms sum in it too); for f32 and bf16 the K rows at once
// (simd::lane_sums), f16 and f64 row by row.
template <int K, class T, class C>
SINTER_INLINE void norm_stats(bool layer, const T* px, int64_t r, int64_t D, C eps, C (&m)[4], C (&rstd)[4]) {
  const T* row[K];
  for (int k = 0; k < K; ++k) row[k] = px + (r + k) * D;
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16>) {
    using simd::f32reg, simd::load_f32;
    float s[K];
    if (layer) {
      simd::lane_sums<K>(D, [&](int k, int64_t i) { return load_f32(row[k] + i); }, [&](int k, int64_t i) { return float(row[k][i]); }, s);
      for (int k = 0; k < K; ++k) m[k] = s[k] / float(D);
      simd::lane_sums<K>(
          D, [&](int k, int64_t i) { const f32reg d = load_f32(row[k] + i) - m[k]; return d * d; },
          [&](int k, int64_t i) { const float d = float(row[k][i]) - m[k]; return d * d; }, s);
    } else {
      simd::lane_sums<K>(
          D, [&](int k, int64_t i) { const f32reg v = load_f32(row[k] + i); return v * v; },
          [&](int k, int64_t i) { return float(row[k][i]) * float(row[k][i]); }, s);
    }
    for (int k = 0; k < K; ++k) {
      if (!layer) m[k] = 0.0f;
      rstd[k] = 1.0f / std::sqrt(s[k] / float(D) + eps);
    }
  } else {
    for (int k = 0; k < K; ++k) {
      const T* x = row[k];
      m[k] = layer ? simd::lane_sum<C>(D, [&](int64_t i) { return C(x[i]); }) / C(D) : C(0);
      const C var = layer ? simd::lane_sum<C>(D, [&](int64_t i) { const C d = C(x[i]) - m[k]; return d * d; })
                          : simd::lane_sum<C>(D, [&](int64_t i) { return C(x[i]) * C(x[i]); });
      rstd[k] = C(1) / std::sqrt(var / C(D) + eps);
    }
  }
}

// f(r, m, rstd) for each row in [lo, hi), their statistics four rows at a time.
template <class T, class C, class F>
SINTER_INLINE void for_rows_with_stats(bool layer, const T* px, int64_t lo, int64_t hi, int64_t D, C eps, F&& f) {
  C m[4], rstd[4];
  for (int64_t r = lo; r < hi;) {
    const int k = hi - r >= 4 ? 4 : 1;
    if (k == 4) norm_stats<4>(layer, px, r, D, eps, m, rstd);
    else norm_stats<1>(layer, px, r, D, eps, m, rstd);
    for (int j = 0; j < k; ++j, ++r) f(r, m[j], rstd[j]);
  }
}
}  // namespace

void layer_norm_rows(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const Tensor& out) {
  SINTER_KERNEL_ENTRY();
  const int64_t rows = x.size(0), D = x.size(1);
  visit_dtype(x.dtype(), [&]<class T>() {
    if constexpr (floating_v<T>) {
      using C = compute_t<T>;
      const T *px = x.data<T>(), *pw = w.data<T>(), *pb = b.defined() ? b.data<T>() : nullptr;
      T* po = out.data<T>();
      parallel_for(0, rows, grain_rows(D), [&](int64_t lo, int64_t hi) {
        for_rows_with_stats(true, px, lo, hi, D, C(eps), [&](int64_t r, C m, C rstd) {
          const T* row = px + r * D;
          T* orow = po + r * D;
          if (pb)
            for (int64_t i = 0; i < D; ++i) orow[i] = T((C(row[i]) - m) * rstd * C(pw[i]) + C(pb[i]));
          else
            for (int64_t i = 0; i < D; ++i) orow[i] = T((C(row[i]) - m) * rstd * C(pw[i]));
        });
      });
    }
  });
}

void rms_norm_rows(const Tensor& x, const Tensor& w, double eps, const Tensor& out) {
  SINTER_KERNEL_ENTRY();
  const int64_t rows = x.size(0), D = x.size(1);
  visit_dtype(x.dtype(), [&]<class T>() {
    if constexpr (floating_v<T>) {
      using C = compute_t<T>;
      const T *px = x.data<T>(), *pw = w.data<T>();
      T* po = out.data<T>();
      parallel_for(0, rows, grain_rows(D), [&](int64_t lo, int64_t hi) {
        for_rows_with_stats(false, px, lo, hi, D, C(eps), [&](int64_t r, C, C inv) {
          const T* row = px + r * D;
          T* orow = po + r * D;
          for (int64_t i = 0; i < D; ++i) orow[i] = T(C(row[i]) * inv * C(pw[i]));
        });
      });
    }
  });
}

namespace {
// One row of norm_backward_rows, given its mean and rstd (the forward's, four rows at a time):
// dx, and the row's terms added into dw, db. Written as lane loops over restrict pointers so that
// each pass vectorizes; xh and gh are recomputed in the last pass instead of kept.
template <class C, class T>
SINTER_INLINE void norm_backward_row(bool layer, const T* __restrict x, const T* __restrict g, const T* __restrict w, C m,
                                     C rstd, int64_t D, T* __restrict dx, C* __restrict dw, C* __restrict db) {
  constexpr int L = simd::kLanes;
  C sg[L] = {}, sgx[L] = {};
  int64_t i = 0;
  for (; i + L <= D; i += L)
    for (int l = 0; l < L; ++l) {
      const C xh = (C(x[i + l]) - m) * rstd, gi = C(g[i + l]), gh = gi * C(w[i + l]);
      sg[l] += gh, sgx[l] += gh * xh;
      dw[i + l] += gi * xh, db[i + l] += gi;
    }
  for (int l = 0; i < D; ++i, ++l) {
    const C xh = (C(x[i]) - m) * rstd, gi = C(g[i]), gh = gi * C(w[i]);
    sg[l] += gh, sgx[l] += gh * xh;
    dw[i] += gi * xh, db[i] += gi;
  }
  C mg = 0, mgx = 0;
  for (int l = 0; l < L; ++l) mg += sg[l], mgx += sgx[l];
  mg = layer ? mg / C(D) : C(0), mgx /= C(D);
  for (i = 0; i < D; ++i) {
    const C xh = (C(x[i]) - m) * rstd, gh = C(g[i]) * C(w[i]);
    dx[i] = T(rstd * (gh - mg - xh * mgx));
  }
}
}  // namespace

void norm_backward_rows(bool layer, const Tensor& g, const Tensor& x, const Tensor& w, double eps, const Tensor& dx,
                        const Tensor& dw, const Tensor& db) {
  SINTER_KERNEL_ENTRY();
  // xh = (x - mean) rstd (rms_norm: mean = 0), gh = g w:
  //   dx = rstd (gh - mean(gh) - xh mean(gh xh))   (rms_norm: without the mean(gh) term)
  //   dw = sum over rows of g xh,  db = sum over rows of g
  const int64_t rows = x.size(0), D = x.size(1);
  visit_dtype(x.dtype(), [&]<class T>() {
    if constexpr (floating_v<T>) {
      using C = compute_t<T>;
      const T *px = x.data<T>(), *pg = g.data<T>(), *pw = w.data<T>();
      T* pdx = dx.data<T>();
      // dw, db: per-chunk partial sums in C, added in chunk order (deterministic for any thread count).
      const int64_t grain = grain_rows(D), chunks = (rows + grain - 1) / grain;
      std::vector<C> part(size_t(chunks * 2 * D), C(0));
      parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c) {
          C* pdw = part.data() + c * 2 * D;
          for_rows_with_stats(layer, px, c * grain, std::min(rows, (c + 1) * grain), D, C(eps), [&](int64_t r, C m, C rstd) {
            norm_backward_row<C>(layer, px + r * D, pg + r * D, pw, m, rstd, D, pdx + r * D, pdw, pdw + D);
          });
        }
      });
      T *pw_out = dw.data<T>(), *pb_out = db.defined() ? db.data<T>() : nullptr;
      for (int64_t i = 0; i < D; ++i) {
        C sw = 0, sb = 0;
        for (int64_t c = 0; c < chunks; ++c) sw += part[size_t(c * 2 * D + i)], sb += part[size_t(c * 2 * D + D + i)];
        pw_out[i] = T(sw);
        if (pb_out) pb_out[i] = T(sb);
      }
    }
  });
}

void rotary_rows(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& out) {
  SINTER_KERNEL_ENTRY();
  const int64_t rows = x.size(0), T_ = x.size(1), D = x.size(2), H = D / 2;
  visit_dtype(x.dtype(), [&]<class T>() {
    if constexpr (floating_v<T>) {
      using C = compute_t<T>;
      const T *px = x.data<T>(), *pc = cos.data<T>(), *ps = sin.data<T>();
      T* po = out.data<T>();
      parallel_for(0, rows * T_, grain_rows(D), [&](int64_t lo, int64_t hi) {
        for (int64_t rt = lo; rt < hi; ++rt) {
          const int64_t t = rt % T_;
          const T* xr = px + rt * D;
          T* orow = po + rt * D;
          for (int64_t i = 0; i < H; ++i) {
            const C c = C(pc[t * H + i]), s = C(ps[t * H + i]), a = C(xr[i]), b = C(xr[i + H]);
            orow[i] = T(a * c - b * s);
            orow[i + H] = T(b * c + a * s);
          }
        }
      });
    }
  });
}

void embedding_rows(const Tensor& weight, const Tensor& idx, const Tensor& out) {
  SINTER_KERNEL_ENTRY();
  const int64_t n = idx.numel(), D = weight.size(1);
  const int64_t* pi = idx.data<int64_t>();
  const char* pw = static_cast<const char*>(weight.data_ptr());
  char* po = static_cast<char*>(out.data_ptr());
  const int64_t row_bytes = D * weight.element_size();
  parallel_for(0, n, grain_rows(D), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) std::memcpy(po + r * row_bytes, pw + pi[r] * row_bytes, size_t(row_bytes));
  });
}

void embedding_backward_rows(const Tensor& g, const Tensor& idx, const Tensor& dw) {
  SINTER_KERNEL_ENTRY();
  // Each thread owns a range of vocabulary rows and scans all tokens: no atomics, and the sum for
  // each row is taken in token order whatever the thread count.
  const int64_t n = idx.numel(), V = dw.size(0), D = dw.size(1);
  const int64_t* pi = idx.data<int64_t>();
  visit_dtype(g.dtype(), [&]<class T>() {
    if constexpr (floating_v<T>) {
      using C = compute_t<T>;
      const T* pg = g.data<T>();
      T* pw = dw.data<T>();
      parallel_for(0, V, std::max<int64_t>(1, V / 64), [&](int64_t lo, int64_t hi) {
        // f32 and f64 sum in dw itself (one pass over it, which a vocabulary's gradient is worth);
        // bf16 and f16 in an f32 copy of the range.
        constexpr bool in_place = std::is_same_v<T, C>;
        std::vector<C> wide(in_place ? 0 : size_t((hi - lo) * D), C(0));
        C* acc = in_place ? reinterpret_cast<C*>(pw + lo * D) : wide.data();
        if constexpr (in_place) std::memset(acc, 0, size_t((hi - lo) * D) * sizeof(C));
        for (int64_t t = 0; t < n; ++t) {
          const int64_t v = pi[t];
          if (v < lo || v >= hi) continue;
          C* a = acc + (v - lo) * D;
          const T* grow = pg + t * D;
          for (int64_t i = 0; i < D; ++i) a[i] += C(grow[i]);
        }
        if constexpr (!in_place)
          for (int64_t i = 0; i < (hi - lo) * D; ++i) pw[lo * D + i] = T(acc[i]);
      });
    }
  });
}

namespace {
// Per row: log-sum-exp and the sum of the logits (for label smoothing).
template <class T, class C> SINTER_INLINE void row_lse(const T* row, int64_t n, C& lse, C& total) {
  const C m = simd::row_max<C>(row, n);
  const C mm = std::isinf(m) ? C(0) : m;
  const C s = simd::lane_sum<C>(n, [&](int64_t i) { return fn::exp_(C(row[i]) - mm); });
  total = simd::lane_sum<C>(n, [&](int64_t i) { return C(row[i]); });
  lse = mm + std::log(s);
}
}  // namespace

void cross_entropy_rows(const Tensor& logits, const Tensor& target, int64_t ignore_index, double smoothing,
                        const Tensor& out) {
  SINTER_KERNEL_ENTRY();
  const int64_t rows = logits.size(0), C = logits.size(1);
  const int64_t* pt = target.data<int64_t>();
  visit_dtype(logits.dtype(), [&]<class T>() {
    if constexpr (floating_v<T>) {
      using A = compute_t<T>;
      const T* px = logits.data<T>();
      std::vector<double> loss(size_t(rows), 0.0);
      parallel_for(0, rows, grain_rows(C), [&](int64_t lo, int64_t hi) {
        for (int64_t r = lo; r < hi; ++r) {
          if (pt[r] == ignore_index) continue;
          const T* row = px + r * C;
          A lse, total;
          row_lse<T, A>(row, C, lse, total);
          loss[size_t(r)] = double(lse) - (1.0 - smoothing) * double(A(row[pt[r]])) - smoothing * double(total) / double(C);
        }
      });
      double sum = 0;
      int64_t count = 0;
      for (int64_t r = 0; r < rows; ++r)
        if (pt[r] != ignore_index) { sum += loss[size_t(r)]; ++count; }
      *out.data<T>() = T(compute_t<T>(sum / double(count)));  // no target counted: 0/0 = nan, as PyTorch
    }
  });
}

void cross_entropy_backward_rows(const Tensor& logits, const Tensor& target, int64_t ignore_index, double smoothing,
                                 double g, const Tensor& dx) {
  SINTER_KERNEL_ENTRY();
  // d mean_loss / d logits = (softmax - target distribution) * g / (rows counted); ignored rows 0.
  const int64_t rows = logits.size(0), C = logits.size(1);
  const int64_t* pt = target.data<int64_t>();
  int64_t count = 0;
  for (int64_t r = 0; r < rows; ++r) count += pt[r] != ignore_index;
  visit_dtype(logits.dtype(), [&]<class T>() {
    if constexpr (floating_v<T>) {
      using A = compute_t<T>;
      const T* px = logits.data<T>();
      T* pd = dx.data<T>();
      const A scale = A(g / double(count)), off = A(smoothing / double(C)), on = A(1.0 - smoothing);
      parallel_for(0, rows, grain_rows(C), [&](int64_t lo, int64_t hi) {
        for (int64_t r = lo; r < hi; ++r) {
          const T* row = px + r * C;
          T* drow = pd + r * C;
          if (pt[r] == ignore_index) {
            for (int64_t i = 0; i < C; ++i) drow[i] = T(0);
            continue;
          }
          A lse, total;
          row_lse<T, A>(row, C, lse, total);
          for (int64_t i = 0; i < C; ++i) drow[i] = T((fn::exp_(A(row[i]) - lse) - off) * scale);
          drow[pt[r]] = T(A(drow[pt[r]]) - on * scale);
        }
      });
    }
  });
}

void dropout(const Tensor& x, double p, uint64_t seed, uint64_t counter, const Tensor& out) {
  SINTER_KERNEL_ENTRY();
  const int64_t n = x.numel();
  visit_dtype(x.dtype(), [&]<class T>() {
    if constexpr (floating_v<T>) {
      using C = compute_t<T>;
      const T* px = x.data<T>();
      T* po = out.data<T>();
      const C scale = p < 1.0 ? C(1.0 / (1.0 - p)) : C(0);
      const float fp = float(p);
      parallel_for(0, (n + 3) / 4, 4096, [&](int64_t lo, int64_t hi) {
        for (int64_t b = lo; b < hi; ++b) {
          uint32_t r[4];
          philox(seed, counter + uint64_t(b), r);
          for (int64_t k = 0; k < 4 && b * 4 + k < n; ++k) {
            const float u = float(r[k] >> 8) * (1.0f / 16777216.0f);
            po[b * 4 + k] = u >= fp ? T(C(px[b * 4 + k]) * scale) : T(C(0));
          }
        }
      });
    }
  });
}

}  // namespace sinter::cpu

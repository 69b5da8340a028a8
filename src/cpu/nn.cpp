#include <cmath>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "cpu/cpu.h"
#include "ops/scalar_fns.h"
#include "sinter/random.h"

namespace sinter::cpu {
namespace {
template <class T> constexpr bool floating_v = std::is_floating_point_v<compute_t<T>>;
int64_t grain_rows(int64_t d) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(d, 1)); }
}  // namespace

void layer_norm_rows(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const Tensor& out) {
  const int64_t rows = x.size(0), D = x.size(1);
  visit_dtype(x.dtype(), [&]<class T>() {
    if constexpr (floating_v<T>) {
      using C = compute_t<T>;
      const T *px = x.data<T>(), *pw = w.data<T>(), *pb = b.defined() ? b.data<T>() : nullptr;
      T* po = out.data<T>();
      parallel_for(0, rows, grain_rows(D), [&](int64_t lo, int64_t hi) {
        for (int64_t r = lo; r < hi; ++r) {
          const T* row = px + r * D;
          double mean = 0, var = 0;
          for (int64_t i = 0; i < D; ++i) mean += double(C(row[i]));
          mean /= double(D);
          for (int64_t i = 0; i < D; ++i) { const double d = double(C(row[i])) - mean; var += d * d; }
          const C rstd = C(1.0 / std::sqrt(var / double(D) + eps)), m = C(mean);
          for (int64_t i = 0; i < D; ++i)
            po[r * D + i] = T((C(row[i]) - m) * rstd * C(pw[i]) + (pb ? C(pb[i]) : C(0)));
        }
      });
    }
  });
}

void rms_norm_rows(const Tensor& x, const Tensor& w, double eps, const Tensor& out) {
  const int64_t rows = x.size(0), D = x.size(1);
  visit_dtype(x.dtype(), [&]<class T>() {
    if constexpr (floating_v<T>) {
      using C = compute_t<T>;
      const T *px = x.data<T>(), *pw = w.data<T>();
      T* po = out.data<T>();
      parallel_for(0, rows, grain_rows(D), [&](int64_t lo, int64_t hi) {
        for (int64_t r = lo; r < hi; ++r) {
          const T* row = px + r * D;
          double ss = 0;
          for (int64_t i = 0; i < D; ++i) ss += double(C(row[i])) * double(C(row[i]));
          const C inv = C(1.0 / std::sqrt(ss / double(D) + eps));
          for (int64_t i = 0; i < D; ++i) po[r * D + i] = T(C(row[i]) * inv * C(pw[i]));
        }
      });
    }
  });
}

void rotary_rows(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& out) {
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
  const int64_t n = idx.numel(), D = weight.size(1);
  const int64_t* pi = idx.data<int64_t>();
  const char* pw = static_cast<const char*>(weight.data_ptr());
  char* po = static_cast<char*>(out.data_ptr());
  const int64_t row_bytes = D * weight.element_size();
  parallel_for(0, n, grain_rows(D), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) std::memcpy(po + r * row_bytes, pw + pi[r] * row_bytes, size_t(row_bytes));
  });
}

void cross_entropy_rows(const Tensor& logits, const Tensor& target, int64_t ignore_index, double smoothing,
                        const Tensor& out) {
  const int64_t rows = logits.size(0), C = logits.size(1);
  const int64_t* pt = target.data<int64_t>();
  visit_dtype(logits.dtype(), [&]<class T>() {
    if constexpr (floating_v<T>) {
      const T* px = logits.data<T>();
      std::vector<double> loss(size_t(rows), 0.0);
      parallel_for(0, rows, grain_rows(C), [&](int64_t lo, int64_t hi) {
        for (int64_t r = lo; r < hi; ++r) {
          if (pt[r] == ignore_index) continue;
          const T* row = px + r * C;
          double m = -INFINITY, s = 0, total = 0;
          for (int64_t i = 0; i < C; ++i) m = std::max(m, double(compute_t<T>(row[i])));
          for (int64_t i = 0; i < C; ++i) {
            const double v = double(compute_t<T>(row[i]));
            s += std::exp(v - m);
            total += v;
          }
          const double lse = m + std::log(s);
          loss[size_t(r)] = lse - (1.0 - smoothing) * double(compute_t<T>(row[pt[r]])) - smoothing * total / double(C);
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

void dropout(const Tensor& x, double p, uint64_t seed, uint64_t counter, const Tensor& out) {
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

// Row reductions over a contiguous (outer, inner) layout: ops move the reduced dims last first.
#include <cmath>
#include <limits>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "cpu/cpu.h"
#include "cpu/simd/lanes.h"
#include "ops/scalar_fns.h"

namespace sinter::cpu {
namespace {

template <class T> using acc_t = std::conditional_t<std::is_floating_point_v<compute_t<T>>, double, int64_t>;

template <class T> bool is_nan(T v) {
  if constexpr (std::is_floating_point_v<compute_t<T>>) return std::isnan(compute_t<T>(v));
  else return false;
}

int64_t row_grain(int64_t inner) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(inner, 1)); }

}  // namespace

void reduce_rows(ReduceOp op, const Tensor& x, const Tensor& out) {
  SINTER_KERNEL_ENTRY();
  const int64_t outer = x.size(0), inner = x.size(1);
  visit_dtype(x.dtype(), [&]<class T>() {
    visit_dtype(out.dtype(), [&]<class O>() {
      const T* px = x.data<T>();
      O* po = out.data<O>();
      parallel_for(0, outer, row_grain(inner), [&](int64_t lo, int64_t hi) {
        for (int64_t r = lo; r < hi; ++r) {
          const T* row = px + r * inner;
          using A = acc_t<T>;
          if (op == ReduceOp::Sum || op == ReduceOp::Prod) {
            A acc = op == ReduceOp::Sum ? A(0) : A(1);
            if (op == ReduceOp::Sum) {
              for (int64_t i = 0; i < inner; ++i) acc += A(compute_t<T>(row[i]));
            } else {
              for (int64_t i = 0; i < inner; ++i) acc *= A(compute_t<T>(row[i]));
            }
            po[r] = convert<O>(acc);
          } else if (op == ReduceOp::LogSumExp) {
            double m = -std::numeric_limits<double>::infinity();
            for (int64_t i = 0; i < inner; ++i) m = std::max(m, double(compute_t<T>(row[i])));
            double s = 0;
            if (std::isinf(m)) {
              po[r] = convert<O>(m);
              continue;
            }
            for (int64_t i = 0; i < inner; ++i) s += std::exp(double(compute_t<T>(row[i])) - m);
            po[r] = convert<O>(m + std::log(s));
          } else {  // Max / Min: NaN wins
            compute_t<T> best = compute_t<T>(row[0]);
            for (int64_t i = 1; i < inner && !is_nan(best); ++i) {
              const compute_t<T> v = compute_t<T>(row[i]);
              if (is_nan(v) || (op == ReduceOp::Max ? v > best : v < best)) best = v;
            }
            po[r] = convert<O>(best);
          }
        }
      });
    });
  });
}

// out(C) = the column sums of x(R, C). Threads take blocks of 256 columns; with fewer blocks
// than twice the threads (a bias gradient: 2048 tokens x 128-512 columns is one or two blocks) they
// split the rows too, in fixed chunks of 256 whose partial sums are added in chunk order, so the
// result does not depend on the thread count.
void sum_cols(const Tensor& x, const Tensor& out) {
  SINTER_KERNEL_ENTRY();
  const int64_t R = x.size(0), C = x.size(1);
  constexpr int64_t kBlock = 256, kRows = 256;
  const int64_t blocks = (C + kBlock - 1) / kBlock;
  const int64_t chunks = blocks >= 2 * num_threads() || R < 2 * kRows ? 1 : (R + kRows - 1) / kRows;
  visit_dtype(x.dtype(), [&]<class T>() {
    visit_dtype(out.dtype(), [&]<class O>() {
      using A = acc_t<T>;
      const T* px = x.data<T>();
      O* po = out.data<O>();
      std::vector<A> part(size_t(chunks > 1 ? chunks * C : 0));
      const int64_t grain = chunks > 1 ? 1 : std::max<int64_t>(1, 8192 / std::max<int64_t>(R, 1));
      parallel_for(0, blocks * chunks, grain, [&](int64_t lo, int64_t hi) {
        A acc[kBlock];
        for (int64_t t = lo; t < hi; ++t) {
          const int64_t b = t % blocks, chunk = t / blocks, c0 = b * kBlock, n = std::min(kBlock, C - c0);
          const int64_t r0 = chunks > 1 ? chunk * kRows : 0, r1 = chunks > 1 ? std::min(R, r0 + kRows) : R;
          for (int64_t j = 0; j < n; ++j) acc[j] = 0;
          for (int64_t r = r0; r < r1; ++r) {
            const T* row = px + r * C + c0;
#pragma omp simd
            for (int64_t j = 0; j < n; ++j) acc[j] += A(compute_t<T>(row[j]));
          }
          if (chunks > 1) std::copy(acc, acc + n, part.begin() + chunk * C + c0);
          else for (int64_t j = 0; j < n; ++j) po[c0 + j] = convert<O>(acc[j]);
        }
      });
      for (int64_t c = 0; chunks > 1 && c < C; ++c) {
        A s = 0;
        for (int64_t k = 0; k < chunks; ++k) s += part[size_t(k * C + c)];
        po[c] = convert<O>(s);
      }
    });
  });
}

void var_rows(const Tensor& x, int64_t correction, const Tensor& out) {
  SINTER_KERNEL_ENTRY();
  const int64_t outer = x.size(0), inner = x.size(1);
  visit_dtype(x.dtype(), [&]<class T>() {
    const T* px = x.data<T>();
    T* po = out.data<T>();
    parallel_for(0, outer, row_grain(inner), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const T* row = px + r * inner;
        double mean = 0;
        for (int64_t i = 0; i < inner; ++i) mean += double(compute_t<T>(row[i]));
        mean /= double(inner);
        double ss = 0;
        for (int64_t i = 0; i < inner; ++i) {
          const double d = double(compute_t<T>(row[i])) - mean;
          ss += d * d;
        }
        po[r] = convert<T>(ss / double(std::max<int64_t>(inner - correction, 0)));
      }
    });
  });
}

void arg_reduce_rows(bool is_max, const Tensor& x, const Tensor& values, const Tensor& indices) {
  SINTER_KERNEL_ENTRY();
  const int64_t outer = x.size(0), inner = x.size(1);
  visit_dtype(x.dtype(), [&]<class T>() {
    const T* px = x.data<T>();
    T* pv = values.defined() ? values.data<T>() : nullptr;
    int64_t* pi = indices.data<int64_t>();
    parallel_for(0, outer, row_grain(inner), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const T* row = px + r * inner;
        int64_t best_i = 0;
        compute_t<T> best = compute_t<T>(row[0]);
        for (int64_t i = 1; i < inner && !is_nan(best); ++i) {
          const compute_t<T> v = compute_t<T>(row[i]);
          if (is_nan(v) || (is_max ? v > best : v < best)) { best = v; best_i = i; }
        }
        if (pv) pv[r] = row[best_i];
        pi[r] = best_i;
      }
    });
  });
}

namespace {
// Softmax of row[first, n) into orow[first, n), zeros elsewhere in orow[0, inner); b is scratch of
// inner values. Nothing visible (n = first), or a row of -inf: 0/0 = NaN, as PyTorch's softmax;
// `safe`: zeros instead, as PyTorch's _safe_softmax (SDPA's fully masked rows).
template <class T, class C>
SINTER_INLINE void softmax_row(const T* row, T* orow, int64_t first, int64_t n, int64_t inner, C* b, bool stream, bool safe) {
  for (int64_t i = 0; i < first; ++i) orow[i] = T(0);
  for (int64_t i = n; i < inner; ++i) orow[i] = T(0);
  const C empty = safe ? C(0) : std::numeric_limits<C>::quiet_NaN();
  if (n == first) {
    for (int64_t i = 0; i < inner; ++i) orow[i] = T(empty);
    return;
  }
  row += first, orow += first, n -= first;
  C m = simd::row_max<C>(row, n);
  if (std::isinf(m) && m < 0) {
    for (int64_t i = 0; i < n; ++i) orow[i] = T(empty);
    return;
  }
  for (int64_t i = 0; i < n; ++i) b[i] = fn::exp_nonpos_(C(row[i]) - m);
  const C inv = C(1) / simd::sum_of(b, n);
  if constexpr (std::is_same_v<T, float>) {
    if (stream && n == inner) {
      simd::scale_stream(b, inv, orow, n);
      return;
    }
  }
  for (int64_t i = 0; i < n; ++i) orow[i] = T(b[i] * inv);
}
}  // namespace

void softmax_rows(const Tensor& x, const Tensor& out, bool log) {
  SINTER_KERNEL_ENTRY();
  const int64_t outer = x.size(0), inner = x.size(1);
  if (!log) return causal_softmax_rows(x, out, 1, inner - 1, 0, false);  // every column visible
  visit_dtype(x.dtype(), [&]<class T>() {
    if constexpr (std::is_floating_point_v<compute_t<T>>) {
      using C = compute_t<T>;
      const T* px = x.data<T>();
      T* po = out.data<T>();
      parallel_for(0, outer, row_grain(inner), [&](int64_t lo, int64_t hi) {
        for (int64_t r = lo; r < hi; ++r) {
          const T* row = px + r * inner;
          T* orow = po + r * inner;
          C m = simd::row_max<C>(row, inner);
          if (std::isinf(m) && m < 0) m = 0;  // a fully masked row: exp(-inf - 0) = 0, sum 0 -> nan, as PyTorch
          const C ls = std::log(simd::lane_sum<C>(inner, [&](int64_t i) { return fn::exp_nonpos_(C(row[i]) - m); }));
          for (int64_t i = 0; i < inner; ++i) orow[i] = T(C(row[i]) - m - ls);
        }
      });
    } else {
      SINTER_THROW(DTypeError, "[softmax] needs a floating tensor, got ", x.dtype());
    }
  });
}

void causal_softmax_rows(const Tensor& x, const Tensor& out, int64_t rows_per_matrix, int64_t offset, int64_t window,
                         bool safe) {
  SINTER_KERNEL_ENTRY();
  const int64_t outer = x.size(0), inner = x.size(1);
  // An output larger than the last-level cache is written around it (no read-for-ownership):
  // nothing will find it in cache anyway.
  const bool stream = out.numel() * out.element_size() >= (int64_t(32) << 20) && inner % 8 == 0 &&
                      reinterpret_cast<uintptr_t>(out.data_ptr()) % 32 == 0;
  visit_dtype(x.dtype(), [&]<class T>() {
    if constexpr (std::is_floating_point_v<compute_t<T>>) {
      using C = compute_t<T>;
      const T* px = x.data<T>();
      T* po = out.data<T>();
      parallel_for(0, outer, row_grain(inner), [&](int64_t lo, int64_t hi) {
        std::vector<C> buf(static_cast<size_t>(inner));
        for (int64_t r = lo; r < hi; ++r) {
          // Row i of its matrix sees columns i + offset - window < j <= i + offset; the rest is 0
          // (and costs no exp).
          const int64_t n = std::clamp<int64_t>(r % rows_per_matrix + offset + 1, 0, inner);
          softmax_row(px + r * inner, po + r * inner, window > 0 ? std::max<int64_t>(n - window, 0) : 0, n, inner, buf.data(),
                      stream, safe);
        }
        simd::stream_fence();
      });
    } else {
      SINTER_THROW(DTypeError, "[softmax] needs a floating tensor, got ", x.dtype());
    }
  });
}

void softmax_backward_rows(const Tensor& g, const Tensor& y, const Tensor& dx, bool log) {
  SINTER_KERNEL_ENTRY();
  // softmax: dx = y (g - sum(g y));  log_softmax: dx = g - exp(y) sum(g)
  const int64_t outer = y.size(0), inner = y.size(1);
  visit_dtype(y.dtype(), [&]<class T>() {
    if constexpr (std::is_floating_point_v<compute_t<T>>) {
      using C = compute_t<T>;
      const T *pg = g.data<T>(), *py = y.data<T>();
      T* pd = dx.data<T>();
      parallel_for(0, outer, row_grain(inner), [&](int64_t lo, int64_t hi) {
        for (int64_t r = lo; r < hi; ++r) {
          const T *grow = pg + r * inner, *yrow = py + r * inner;
          T* drow = pd + r * inner;
          if (log) {
            const C s = simd::lane_sum<C>(inner, [&](int64_t i) { return C(grow[i]); });
            for (int64_t i = 0; i < inner; ++i) drow[i] = T(C(grow[i]) - fn::exp_(C(yrow[i])) * s);
          } else {
            const C s = simd::lane_sum<C>(inner, [&](int64_t i) { return C(grow[i]) * C(yrow[i]); });
            for (int64_t i = 0; i < inner; ++i) drow[i] = T(C(yrow[i]) * (C(grow[i]) - s));
          }
        }
      });
    }
  });
}

void cumsum_rows(const Tensor& x, const Tensor& out) {
  SINTER_KERNEL_ENTRY();
  const int64_t outer = x.size(0), inner = x.size(1);
  visit_dtype(x.dtype(), [&]<class T>() {
    visit_dtype(out.dtype(), [&]<class O>() {
      const T* px = x.data<T>();
      O* po = out.data<O>();
      parallel_for(0, outer, row_grain(inner), [&](int64_t lo, int64_t hi) {
        for (int64_t r = lo; r < hi; ++r) {
          acc_t<T> acc = 0;
          for (int64_t i = 0; i < inner; ++i) {
            acc += acc_t<T>(compute_t<T>(px[r * inner + i]));
            po[r * inner + i] = convert<O>(acc);
          }
        }
      });
    });
  });
}

}  // namespace sinter::cpu

// Reductions, softmax and cumsum over contiguous layouts: rows (outer, inner) with the reduced dim
// last, or (P, R, C) reduced over R where it lies (column sums, softmax down columns).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

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

// A row longer than kChunk is reduced in chunks of kChunk, in parallel, the chunks' results then
// combined in order: a split fixed by the shape, so a result does not depend on the thread count.
constexpr int64_t kChunk = 16384;

// Sum or product of p[0, n): floats, doubles and bf16 in registers of doubles (simd::sum_f64,
// simd::fold_f64), the rest in simd::kLanes independent partial results of A.
template <class A, class T> A chunk_reduce(ReduceOp op, const T* p, int64_t n) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, bf16>) {
    return op == ReduceOp::Sum ? simd::sum_f64(p, n) : simd::fold_f64<true>(p, n);
  }
  if (op == ReduceOp::Sum) return simd::lane_sum<A>(n, [&](int64_t i) { return A(compute_t<T>(p[i])); });
  A acc[simd::kLanes];
  std::fill(acc, acc + simd::kLanes, A(1));
  int64_t i = 0;
  for (; i + simd::kLanes <= n; i += simd::kLanes)
    for (int l = 0; l < simd::kLanes; ++l) acc[l] *= A(compute_t<T>(p[i + l]));
  for (int l = 0; i < n; ++i, ++l) acc[l] *= A(compute_t<T>(p[i]));
  A s = 1;
  for (int l = 0; l < simd::kLanes; ++l) s *= acc[l];
  return s;
}

// log(sum(exp(row))) shifted by the row's max, as cross_entropy's: float rows (f32, bf16, f16) in
// float registers through the vectorized exp, f64 rows in double. An infinite max is the result
// unless a NaN is in the row.
template <class T> double logsumexp_row(const T* row, int64_t n) {
  using C = std::conditional_t<std::is_floating_point_v<compute_t<T>>, compute_t<T>, double>;
  if constexpr (!std::is_floating_point_v<compute_t<T>>) {  // integers: as a row of doubles
    std::vector<double> d(row, row + n);
    return logsumexp_row(d.data(), n);
  }
  const C m = simd::row_max<C>(row, n);
  if (std::isinf(m)) return std::any_of(row, row + n, [](T v) { return is_nan(v); }) ? NAN : double(m);
  const C s = simd::lane_sum<C>(n, [&](int64_t i) { return fn::exp_nonpos_(C(row[i]) - m); });
  return double(m) + std::log(double(s));
}

// The first maximum (minimum) of p[0, n) and its index; a NaN wins, the first one.
template <bool is_max, class T> std::pair<compute_t<T>, int64_t> chunk_arg(const T* p, int64_t n) {
  using C = compute_t<T>;
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    bool nan = false;
    const auto best = simd::arg_extreme<is_max>(p, n, nan);
    if (!nan) return {best.first, best.second};
    const int64_t i = std::find_if(p, p + n, [](C v) { return v != v; }) - p;
    return {p[i], i};
  } else if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
    // in float blocks (exact), the first extreme of each kept unless a later one is beyond it
    constexpr int64_t kBlock = 1024;
    float buf[kBlock];
    std::pair<float, int64_t> best{0.0f, -1};
    for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
      const int64_t m = std::min(kBlock, n - b0);
      for (int64_t i = 0; i < m; ++i) buf[i] = float(p[b0 + i]);
      const auto q = chunk_arg<is_max>(buf, m);
      if (best.second < 0 || is_nan(q.first) || (is_max ? q.first > best.first : q.first < best.first)) best = {q.first, q.second + b0};
      if (is_nan(best.first)) break;
    }
    return best;
  } else {
    int64_t best_i = 0;
    C best = C(p[0]);
    for (int64_t i = 1; i < n && !is_nan(best); ++i) {
      const C v = C(p[i]);
      if (is_nan(v) || (is_max ? v > best : v < best)) best = v, best_i = i;
    }
    return {best, best_i};
  }
}

}  // namespace

void reduce_rows(ReduceOp op, const Tensor& x, const Tensor& out) {
  SINTER_KERNEL_ENTRY();
  const int64_t outer = x.size(0), inner = x.size(1), chunks = std::max<int64_t>(1, (inner + kChunk - 1) / kChunk);
  visit_dtype(x.dtype(), [&]<class T>() {
    visit_dtype(out.dtype(), [&]<class O>() {
      using A = acc_t<T>;
      const T* px = x.data<T>();
      O* po = out.data<O>();
      if (op == ReduceOp::LogSumExp) {
        parallel_for(0, outer, row_grain(inner), [&](int64_t lo, int64_t hi) {
          for (int64_t r = lo; r < hi; ++r) po[r] = convert<O>(logsumexp_row(px + r * inner, inner));
        });
        return;
      }
      std::vector<A> part(size_t(chunks > 1 ? outer * chunks : 0));
      parallel_for(0, outer * chunks, row_grain(std::min(inner, kChunk)), [&](int64_t lo, int64_t hi) {
        for (int64_t t = lo; t < hi; ++t) {
          const int64_t r = t / chunks, c0 = (t % chunks) * kChunk;
          const A v = chunk_reduce<A>(op, px + r * inner + c0, std::min(kChunk, inner - c0));
          if (chunks > 1) part[size_t(t)] = v;
          else po[r] = convert<O>(v);
        }
      });
      for (int64_t r = 0; chunks > 1 && r < outer; ++r) {
        A acc = part[size_t(r * chunks)];
        for (int64_t c = 1; c < chunks; ++c) acc = op == ReduceOp::Sum ? acc + part[size_t(r * chunks + c)] : acc * part[size_t(r * chunks + c)];
        po[r] = convert<O>(acc);
      }
    });
  });
}

// out(P, C) = the sums over R of a contiguous (P, R, C) x. Threads take blocks of 256 columns of
// one p, and rows in chunks of 256 (past 512 rows), whose partial sums are added in chunk order;
// float and bf16 rows go eight at a time in f32 (one double add per column and eight rows):
// a bias gradient (2048 tokens x 128-512 columns, one or two blocks) splits across threads, and the
// order of the adds is fixed by the shape, not the thread count.
void sum_cols(const Tensor& x, const Tensor& out) {
  SINTER_KERNEL_ENTRY();
  const int64_t P = x.size(0), R = x.size(1), C = x.size(2);
  constexpr int64_t kBlock = 256, kRows = 256;
  const int64_t blocks = (C + kBlock - 1) / kBlock, chunks = R < 2 * kRows ? 1 : (R + kRows - 1) / kRows;
  visit_dtype(x.dtype(), [&]<class T>() {
    visit_dtype(out.dtype(), [&]<class O>() {
      using A = acc_t<T>;
      const T* px = x.data<T>();
      O* po = out.data<O>();
      std::vector<A> part(size_t(chunks > 1 ? P * chunks * C : 0));
      const int64_t grain = std::max<int64_t>(1, 32768 / ((chunks > 1 ? kRows : R) * std::min(C, kBlock)));
      parallel_for(0, P * blocks * chunks, grain, [&](int64_t lo, int64_t hi) {
        A acc[kBlock];
        for (int64_t t = lo; t < hi; ++t) {
          const int64_t b = t % blocks, chunk = t / blocks % chunks, p = t / blocks / chunks;
          const int64_t c0 = b * kBlock, n = std::min(kBlock, C - c0), r0 = chunk * kRows, r1 = chunks > 1 ? std::min(R, r0 + kRows) : R;
          for (int64_t j = 0; j < n; ++j) acc[j] = 0;
          int64_t r = r0;
          if constexpr (std::is_same_v<compute_t<T>, float>) {  // eight rows in f32, then into double
            for (; r + 8 <= r1; r += 8) {
              const T* q = px + (p * R + r) * C + c0;
#pragma omp simd
              for (int64_t j = 0; j < n; ++j) {
                const float lo = (float(q[j]) + float(q[j + C])) + (float(q[j + 2 * C]) + float(q[j + 3 * C]));
                const float hi = (float(q[j + 4 * C]) + float(q[j + 5 * C])) + (float(q[j + 6 * C]) + float(q[j + 7 * C]));
                acc[j] += double(lo + hi);
              }
            }
          }
          for (; r < r1; ++r) {
            const T* row = px + (p * R + r) * C + c0;
#pragma omp simd
            for (int64_t j = 0; j < n; ++j) acc[j] += A(compute_t<T>(row[j]));
          }
          if (chunks > 1) std::copy(acc, acc + n, part.begin() + (p * chunks + chunk) * C + c0);
          else for (int64_t j = 0; j < n; ++j) po[p * C + c0 + j] = convert<O>(acc[j]);
        }
      });
      for (int64_t pc = 0; chunks > 1 && pc < P * C; ++pc) {
        const int64_t p = pc / C, c = pc % C;
        A s = 0;
        for (int64_t k = 0; k < chunks; ++k) s += part[size_t((p * chunks + k) * C + c)];
        po[pc] = convert<O>(s);
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
  const int64_t outer = x.size(0), inner = x.size(1), chunks = std::max<int64_t>(1, (inner + kChunk - 1) / kChunk);
  visit_dtype(x.dtype(), [&]<class T>() {
    using C = compute_t<T>;
    const T* px = x.data<T>();
    T* pv = values.defined() ? values.data<T>() : nullptr;
    int64_t* pi = indices.data<int64_t>();
    std::vector<std::pair<C, int64_t>> part(size_t(outer * chunks));
    parallel_for(0, outer * chunks, row_grain(std::min(inner, kChunk)), [&](int64_t lo, int64_t hi) {
      for (int64_t t = lo; t < hi; ++t) {
        const int64_t c0 = (t % chunks) * kChunk, n = std::min(kChunk, inner - c0);
        const T* p = px + (t / chunks) * inner + c0;
        auto best = is_max ? chunk_arg<true>(p, n) : chunk_arg<false>(p, n);
        part[size_t(t)] = {best.first, best.second + c0};
      }
    });
    for (int64_t r = 0; r < outer; ++r) {  // the chunks in order: the first extreme, or the first NaN
      auto best = part[size_t(r * chunks)];
      for (int64_t c = 1; c < chunks && !is_nan(best.first); ++c) {
        const auto& q = part[size_t(r * chunks + c)];
        if (is_nan(q.first) || (is_max ? q.first > best.first : q.first < best.first)) best = q;
      }
      if (pv) pv[r] = px[r * inner + best.second];
      pi[r] = best.second;
    }
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
        constexpr bool half = !std::is_same_v<T, C>;  // bf16, f16: rows widened and narrowed in loops of their own
        std::vector<C> buf(static_cast<size_t>(half ? 3 * inner : inner));
        for (int64_t r = lo; r < hi; ++r) {
          // Row i of its matrix sees columns i + offset - window < j <= i + offset; the rest is 0
          // (and costs no exp).
          const int64_t n = std::clamp<int64_t>(r % rows_per_matrix + offset + 1, 0, inner);
          const int64_t first = window > 0 ? std::max<int64_t>(n - window, 0) : 0;
          if constexpr (half) {
            C *row = buf.data() + inner, *orow = row + inner;
            for (int64_t i = 0; i < inner; ++i) row[i] = C(px[r * inner + i]);
            softmax_row(row, orow, first, n, inner, buf.data(), false, safe);
            for (int64_t i = 0; i < inner; ++i) po[r * inner + i] = T(orow[i]);
          } else {
            softmax_row(px + r * inner, po + r * inner, first, n, inner, buf.data(), stream, safe);
          }
        }
        simd::stream_fence();
      });
    } else {
      SINTER_THROW(DTypeError, "[softmax] needs a floating tensor, got ", x.dtype());
    }
  });
}

// Softmax (or log-softmax) over R of a contiguous f32 (P, R, C): per p and block of 16 columns
// (one cache line a row), three passes down the rows: the max, the exps and their sum (exps kept
// in out), the scaling. A softmax over a leading or middle dim without the two transposing copies
// of rows_last; the formulas are softmax_row's.
void softmax_cols(const Tensor& x, const Tensor& out, bool log) {
  SINTER_KERNEL_ENTRY();
  constexpr int64_t W = simd::kLanes;
  const int64_t P = x.size(0), R = x.size(1), C = x.size(2), blocks = (C + W - 1) / W;
  const float* px = x.data<float>();
  float* po = out.data<float>();
  parallel_for(0, P * blocks, std::max<int64_t>(1, 8192 / std::max<int64_t>(R * W, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t c0 = t % blocks * W, n = std::min(W, C - c0);
      const float* xb = px + t / blocks * R * C + c0;
      float* ob = po + t / blocks * R * C + c0;
      float m[W], s[W] = {};
      for (int64_t j = 0; j < W; ++j) m[j] = -std::numeric_limits<float>::infinity();
      if (n == W) {
        simd::f32x16 mv = simd::load16(m);
        for (int64_t r = 0; r < R; ++r) {
          const simd::f32x16 v = simd::load16(xb + r * C);
          mv = v > mv ? v : mv;  // NaNs skipped here; they surface in the exps
        }
        std::memcpy(m, &mv, sizeof m);
      } else {
        for (int64_t r = 0; r < R; ++r)
          for (int64_t j = 0; j < n; ++j) m[j] = xb[r * C + j] > m[j] ? xb[r * C + j] : m[j];
      }
      if (log)
        for (int64_t j = 0; j < n; ++j) m[j] = std::isinf(m[j]) && m[j] < 0 ? 0.0f : m[j];
      for (int64_t r = 0; r < R; ++r)
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) {
          const float e = fn::exp_nonpos_(xb[r * C + j] - m[j]);
          s[j] += e;
          if (!log) ob[r * C + j] = e;
        }
      if (log) {
        for (int64_t j = 0; j < n; ++j) s[j] = m[j] + std::log(s[j]);
        for (int64_t r = 0; r < R; ++r)
#pragma omp simd
          for (int64_t j = 0; j < n; ++j) ob[r * C + j] = xb[r * C + j] - s[j];
      } else {
        for (int64_t j = 0; j < n; ++j) s[j] = 1.0f / s[j];
        for (int64_t r = 0; r < R; ++r)
#pragma omp simd
          for (int64_t j = 0; j < n; ++j) ob[r * C + j] *= s[j];
      }
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

namespace {
// Running sums of two rows of floats or doubles in double, one register of W doubles at a time: a
// prefix sum inside the register (log2 W shifted adds), plus the carry of the elements before. Each
// row's carry is a chain of one add per register; the two rows' chains are independent.
constexpr int kW = simd::kVectorBytes / 8;
typedef double dvec __attribute__((vector_size(simd::kVectorBytes)));

template <class T> SINTER_INLINE dvec load_f64(const T* p) {
  typedef T tvec __attribute__((vector_size(kW * sizeof(T))));
  tvec v;
  std::memcpy(&v, p, sizeof v);
  return __builtin_convertvector(v, dvec);
}
template <class T> SINTER_INLINE void store_from_f64(T* p, dvec v) {
  typedef T tvec __attribute__((vector_size(kW * sizeof(T))));
  const tvec t = __builtin_convertvector(v, tvec);
  std::memcpy(p, &t, sizeof t);
}
SINTER_INLINE dvec prefix(dvec v) {
  const dvec z = {};
#if defined(__AVX512F__)
  v += __builtin_shufflevector(z, v, 0, 8, 9, 10, 11, 12, 13, 14);
  v += __builtin_shufflevector(z, v, 0, 1, 8, 9, 10, 11, 12, 13);
  v += __builtin_shufflevector(z, v, 0, 1, 2, 3, 8, 9, 10, 11);
#else
  v += __builtin_shufflevector(z, v, 0, 4, 5, 6);
  v += __builtin_shufflevector(z, v, 0, 1, 4, 5);
#endif
  return v;
}
SINTER_INLINE dvec last_lane(dvec v) {
#if defined(__AVX512F__)
  return __builtin_shufflevector(v, v, 7, 7, 7, 7, 7, 7, 7, 7);
#else
  return __builtin_shufflevector(v, v, 3, 3, 3, 3);
#endif
}
template <class T> void cumsum_two_rows(const T* x0, const T* x1, T* o0, T* o1, int64_t n) {
  dvec c0 = {}, c1 = {};
  int64_t i = 0;
  for (; i + kW <= n; i += kW) {
    const dvec p0 = prefix(load_f64(x0 + i)), p1 = prefix(load_f64(x1 + i));
    store_from_f64(o0 + i, p0 + c0), store_from_f64(o1 + i, p1 + c1);
    c0 += last_lane(p0), c1 += last_lane(p1);
  }
  double a0 = c0[0], a1 = c1[0];
  for (; i < n; ++i) o0[i] = T(a0 += double(x0[i])), o1[i] = T(a1 += double(x1[i]));
}
}  // namespace

void cumsum_rows(const Tensor& x, const Tensor& out) {
  SINTER_KERNEL_ENTRY();
  const int64_t outer = x.size(0), inner = x.size(1);
  visit_dtype(x.dtype(), [&]<class T>() {
    visit_dtype(out.dtype(), [&]<class O>() {
      using A = acc_t<T>;
      const T* px = x.data<T>();
      O* po = out.data<O>();
      constexpr int64_t K = 2;  // rows a task runs together
      parallel_for(0, (outer + K - 1) / K, std::max<int64_t>(1, row_grain(inner) / K), [&](int64_t lo, int64_t hi) {
        for (int64_t g = lo; g < hi; ++g) {
          const int64_t r0 = g * K, k = std::min(K, outer - r0);
          if constexpr (std::is_same_v<T, O> && (std::is_same_v<T, float> || std::is_same_v<T, double>)) {
            if (k == K) {
              cumsum_two_rows(px + r0 * inner, px + (r0 + 1) * inner, po + r0 * inner, po + (r0 + 1) * inner, inner);
              continue;
            }
          }
          for (int64_t r = r0; r < r0 + k; ++r) {
            A acc = 0;
            for (int64_t i = 0; i < inner; ++i) {
              acc += A(compute_t<T>(px[r * inner + i]));
              po[r * inner + i] = convert<O>(acc);
            }
          }
        }
      });
    });
  });
}

}  // namespace sinter::cpu

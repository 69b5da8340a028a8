// CPU kernels of the indexing ops (src/ops/index.cpp). Indices are range-checked before any read.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "cpu/cpu.h"
#include "ops/common.h"
#include "sinter/random.h"

namespace sinter::cpu {
namespace {

using detail::raw_reshape_contiguous;
using detail::raw_slice;
using detail::raw_view;
using detail::wrap_dim;

Tensor as_i64(const Tensor& t) { return contiguous_as(t, DType::i64); }

// A 0-d tensor holding v in dtype dt.
Tensor scalar_of(double v, DType dt) {
  Tensor t = Tensor::empty({}, dt);
  fill(t, v);
  return t;
}

void index_select_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const int64_t dim = wrap_dim("index_select", a.i("dim"), in[0].dim());
  Tensor idx = as_i64(in[1]);
  check_index_range("index_select", idx, in[0].size(dim));
  const int64_t* p = idx.data<int64_t>();
  if (!in[0].is_contiguous() || !out[0].is_contiguous()) {
    for (int64_t i = 0; i < idx.numel(); ++i) copy(raw_slice(in[0], dim, p[i], p[i] + 1), raw_slice(out[0], dim, i, i + 1));
    return;
  }
  // x as (P, R, C) around dim, out as (P, I, C): a copy of C elements per (p, i), in parallel
  const Around s = around(in[0], dim, dim);  // plain locals: clang 14 lambdas cannot capture structured bindings
  const int64_t P = s.before, R = s.within, I = idx.numel(), bytes = s.after * in[0].element_size();
  const char* px = static_cast<const char*>(in[0].data_ptr());
  char* po = static_cast<char*>(out[0].data_ptr());
  parallel_for(0, P * I, std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(bytes, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) std::memcpy(po + t * bytes, px + (t / I * R + p[t % I]) * bytes, size_t(bytes));
  });
}

// f(out/src position of element j of row r, x or out offset of that element) for every element of
// idx, row by row (its last dim), rows in parallel where `parallel`: the offset of idx's position in
// t (strided) with dim's coordinate replaced by the index.
template <class F> void for_each_indexed(const Tensor& idx, const Tensor& t, int64_t dim, bool parallel, F&& f) {
  const int64_t nd = idx.dim(), L = nd ? idx.size(-1) : 1, rows = L ? idx.numel() / L : 0;
  const int64_t* pi = idx.data<int64_t>();
  const int64_t sd = nd ? t.stride(dim) : 0, sl = nd ? t.stride(nd - 1) : 0;
  auto run = [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      int64_t rem = r, base = t.offset();
      for (int64_t d = nd - 2; d >= 0; --d) {
        const int64_t i = rem % idx.size(d);
        rem /= idx.size(d);
        if (d != dim) base += i * t.stride(d);
      }
      const int64_t* ip = pi + r * L;
      if (nd == 0) f(0, base);
      else if (dim == nd - 1) for (int64_t j = 0; j < L; ++j) f(r * L + j, base + ip[j] * sd);
      else for (int64_t j = 0; j < L; ++j) f(r * L + j, base + j * sl + ip[j] * sd);
    }
  };
  if (parallel) parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(L, 1)), run);
  else run(0, rows);
}

// Whether idx and x agree on every dim but the last (so idx's row r indexes x's row r).
bool same_rows(const Tensor& idx, const Tensor& x) {
  for (int64_t d = 0; d + 1 < x.dim(); ++d)
    if (idx.size(d) != x.size(d)) return false;
  return true;
}

// out row r = x row r (of C elements) at idx row r's positions, each row's indices checked before
// its reads (in the threads: a serial pass over every index first cost a tenth of the op); a bad
// one raises check_index_range's error once the loop is done.
template <class T> void gather_rows(const T* px, const Tensor& idx, int64_t C, T* po) {
  const int64_t L = idx.size(-1), rows = L ? idx.numel() / L : 0;
  const int64_t* pi = idx.data<int64_t>();
  std::atomic<bool> bad{false};
  parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(L, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const int64_t* ip = pi + r * L;
      uint64_t out_of_range = 0;
#pragma omp simd reduction(| : out_of_range)
      for (int64_t j = 0; j < L; ++j) out_of_range |= uint64_t(ip[j]) >= uint64_t(C);
      if (out_of_range) {
        bad.store(true, std::memory_order_relaxed);
        continue;
      }
      const T* xr = px + r * C;
      T* o = po + r * L;
      for (int64_t j = 0; j < L; ++j) o[j] = xr[ip[j]];
    }
  });
  if (bad.load()) check_index_range("gather", idx, C);
}

void gather_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const Tensor& x = in[0];
  const int64_t dim = wrap_dim("gather", a.i("dim"), x.dim());
  Tensor idx = as_i64(in[1]);
  const bool rows = x.dim() && dim == x.dim() - 1 && x.is_contiguous() && same_rows(idx, x);
  if (!rows) check_index_range("gather", idx, x.dim() ? x.size(dim) : 1);
  visit_dtype(x.dtype(), [&]<class T>() {
    const T* px = static_cast<const T*>(x.storage()->data);
    T* po = out[0].data<T>();
    if (rows) return gather_rows(px + x.offset(), idx, x.size(-1), po);
    for_each_indexed(idx, x, dim, true, [&](int64_t at, int64_t off) { po[at] = px[off]; });
  });
}

// Rows of idx write distinct rows of out only where dim is the last: there they run in parallel,
// elsewhere in order (each destination's adds in idx's order either way).
void scatter_add_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const Tensor& x = in[0];
  const int64_t dim = wrap_dim("scatter_add", a.i("dim"), x.dim());
  Tensor idx = as_i64(in[1]);
  check_index_range("scatter_add", idx, x.dim() ? x.size(dim) : 1);
  copy(x, out[0]);
  Tensor src = contiguous_as(in[2], x.dtype());
  visit_dtype(x.dtype(), [&]<class T>() {
    T* po = static_cast<T*>(out[0].storage()->data);
    const T* ps = src.data<T>();
    for_each_indexed(idx, out[0], dim, x.dim() > 0 && dim == x.dim() - 1, [&](int64_t at, int64_t off) {
      T& dst = po[off];
      if constexpr (std::is_same_v<T, bool>) dst = dst || ps[at];
      else dst = T(compute_t<T>(dst) + compute_t<T>(ps[at]));
    });
  });
}

void masked_fill_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  where(in[1], scalar_of(a.f("value"), in[0].dtype()), in[0], out[0]);
}

void triangle_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const Tensor& x = in[0];
  const int64_t R = x.size(-2), C = x.size(-1), diag = a.i("diagonal");
  const bool upper = a.b("upper");
  if (x.is_contiguous() && out[0].is_contiguous()) {  // each row: its kept run copied, the rest zeroed (all bits 0)
    const int64_t es = x.element_size(), rows = x.numel() / std::max<int64_t>(C, 1);
    const char* px = static_cast<const char*>(x.data_ptr());
    char* po = static_cast<char*>(out[0].data_ptr());
    parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(C, 1)), [&](int64_t lo, int64_t hi) {
      for (int64_t q = lo; q < hi; ++q) {
        const int64_t r = q % R, b = std::clamp<int64_t>(upper ? r + diag : r + diag + 1, 0, C);  // columns [0, b) vs [b, C)
        const int64_t k0 = upper ? b : 0, k1 = upper ? C : b, z0 = upper ? 0 : b, z1 = upper ? b : C;
        char* o = po + q * C * es;
        std::memcpy(o + k0 * es, px + (q * C + k0) * es, size_t((k1 - k0) * es));
        std::memset(o + z0 * es, 0, size_t((z1 - z0) * es));
      }
    });
    return;
  }
  Tensor keep = Tensor::empty({R, C}, DType::boolean);
  bool* pk = keep.data<bool>();
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) pk[r * C + c] = upper ? (c - r >= diag) : (c - r <= diag);
  where(keep, x, scalar_of(0.0, x.dtype()), out[0]);
}

// The best k (>= 1) of row[0, n), none NaN, best first, ties to the earlier index: one pass
// keeping them in a heap whose top is the worst, so most elements cost one comparison.
template <class T> void top_k_plain(const T* row, int64_t n, int64_t k, bool largest, T* values, int64_t* indices) {
  using P = std::pair<compute_t<T>, int64_t>;
  auto better = [&](const P& a, const P& b) { return a.first != b.first ? (largest ? a.first > b.first : a.first < b.first) : a.second < b.second; };
  std::vector<P> heap;
  for (int64_t i = 0; i < k; ++i) heap.push_back({compute_t<T>(row[i]), i});
  std::make_heap(heap.begin(), heap.end(), better);
  compute_t<T> worst = heap.front().first;
  for (int64_t i = k; i < n; ++i) {
    const compute_t<T> v = compute_t<T>(row[i]);
    if (largest ? v > worst : v < worst) {  // a tie keeps the earlier
      std::pop_heap(heap.begin(), heap.end(), better);
      heap.back() = {v, i};
      std::push_heap(heap.begin(), heap.end(), better);
      worst = heap.front().first;
    }
  }
  std::sort_heap(heap.begin(), heap.end(), better);
  for (int64_t j = 0; j < k; ++j) values[j] = row[heap[size_t(j)].second], indices[j] = heap[size_t(j)].second;
}

void topk_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const Tensor& x = in[0];
  const int64_t dim = x.dim() ? wrap_dim("topk", a.i("dim"), x.dim()) : 0;
  const int64_t k = a.i("k");
  const bool largest = a.b("largest");
  Tensor x2 = rows_last(x, x.dim() ? std::vector<int64_t>{dim} : std::vector<int64_t>{});
  const int64_t rows = x2.size(0), n = x2.size(1);
  Tensor vals = Tensor::empty({rows, k}, x.dtype()), idx = Tensor::empty({rows, k}, DType::i64);
  visit_dtype(x.dtype(), [&]<class T>() {
    const T* px = x2.data<T>();
    T* pv = vals.data<T>();
    int64_t* pi = idx.data<int64_t>();
    parallel_for(0, rows, 1, [&](int64_t lo, int64_t hi) {
      std::vector<int64_t> order;  // the NaN-aware sort's
      for (int64_t r = lo; r < hi; ++r) {
        const T* row = px + r * n;
        bool nan = false;
        if constexpr (!std::is_integral_v<compute_t<T>>)
          for (int64_t i = 0; i < n; ++i) nan |= compute_t<T>(row[i]) != compute_t<T>(row[i]);
        if (!nan && k > 0) {
          top_k_plain(row, n, k, largest, pv + r * k, pi + r * k);
          continue;
        }
        order.resize(size_t(n));
        std::iota(order.begin(), order.end(), 0);
        auto better = [&](int64_t i, int64_t j) {
          const double a_ = double(compute_t<T>(row[i])), b_ = double(compute_t<T>(row[j]));
          if (std::isnan(a_) || std::isnan(b_)) return std::isnan(a_) && !std::isnan(b_) ? largest : (!std::isnan(a_) && std::isnan(b_) ? !largest : i < j);
          if (a_ != b_) return largest ? a_ > b_ : a_ < b_;
          return i < j;
        };
        std::partial_sort(order.begin(), order.begin() + k, order.end(), better);
        for (int64_t j = 0; j < k; ++j) { pv[r * k + j] = row[order[size_t(j)]]; pi[r * k + j] = order[size_t(j)]; }
      }
    });
  });
  // Back from (rows, k) to the output layout (dim in place).
  Shape ps, vst, ist;
  for (int64_t i = 0; i < x.dim(); ++i)
    if (i != dim) { ps.push_back(x.size(i)); vst.push_back(out[0].stride(i)); ist.push_back(out[1].stride(i)); }
  if (x.dim()) { ps.push_back(k); vst.push_back(out[0].stride(dim)); ist.push_back(out[1].stride(dim)); }
  copy(raw_reshape_contiguous(vals, ps), raw_view(out[0], ps, vst, out[0].offset()));
  copy(raw_reshape_contiguous(idx, ps), raw_view(out[1], ps, ist, out[1].offset()));
}

void one_hot_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const int64_t C = a.i("num_classes");
  Tensor idx = as_i64(in[0]);
  check_index_range("one_hot", idx, C);
  fill(out[0], 0.0);
  const int64_t* pi = idx.data<int64_t>();
  int64_t* po = out[0].data<int64_t>();
  for (int64_t i = 0; i < idx.numel(); ++i) po[i * C + pi[i]] = 1;
}

void multinomial_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  Tensor p = contiguous_as(in[0], DType::f64);
  const int64_t P = p.size(-1), R = p.numel() / std::max<int64_t>(P, 1), n = a.i("num_samples");
  const bool repl = a.b("replacement");
  const double* pp = p.data<double>();
  for (int64_t r = 0; r < R; ++r) {
    double total = 0;
    int64_t positive = 0;
    for (int64_t i = 0; i < P; ++i) {
      const double v = pp[r * P + i];
      SINTER_CHECK(std::isfinite(v) && v >= 0, "[multinomial] probability ", v, " at row ", r, " index ", i,
                   " is negative or not finite");
      total += v;
      positive += v > 0;
    }
    SINTER_CHECK(total > 0, "[multinomial] row ", r, " has no positive probability");
    SINTER_CHECK(repl || positive >= n, "[multinomial] row ", r, " has ", positive,
                 " non-zero probabilities, too few for ", n, " samples without replacement");
  }
  const uint64_t seed = uint64_t(a.i("seed")), counter = uint64_t(a.i("counter"));
  int64_t* po = out[0].data<int64_t>();
  parallel_for(0, R, 1, [&](int64_t lo, int64_t hi) {
    std::vector<double> w(static_cast<size_t>(P));
    for (int64_t r = lo; r < hi; ++r) {
      std::copy(pp + r * P, pp + (r + 1) * P, w.begin());
      for (int64_t s = 0; s < n; ++s) {
        double total = 0;
        for (double v : w) total += v;
        const double u = double(philox_uniform(seed, counter, uint64_t(r * n + s))) * total;
        double acc = 0;
        int64_t pick = -1;
        for (int64_t i = 0; i < P; ++i) {  // inverse CDF, skipping empty categories
          if (w[size_t(i)] <= 0) continue;
          acc += w[size_t(i)];
          pick = i;
          if (u < acc) break;
        }
        po[r * n + s] = pick;
        if (!repl) w[size_t(pick)] = 0;
      }
    }
  });
}

}  // namespace

void register_index_kernels() {
  detail::add_kernels(DeviceType::cpu, {{"index_select", index_select_kernel}, {"gather", gather_kernel},
                                        {"scatter_add", scatter_add_kernel}, {"masked_fill", masked_fill_kernel},
                                        {"triangle", triangle_kernel}, {"topk", topk_kernel},
                                        {"one_hot", one_hot_kernel}, {"multinomial", multinomial_kernel}});
}

}  // namespace sinter::cpu

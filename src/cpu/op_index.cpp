// CPU kernels of the indexing ops (src/ops/index.cpp). Indices are range-checked before any read.
#include <algorithm>
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

// Calls f(linear position, multi-index) over a shape in row-major order.
template <class F> void for_each_index(const Shape& shape, F&& f) {
  const int64_t n = shape.numel();
  std::vector<int64_t> idx(shape.size(), 0);
  for (int64_t lin = 0; lin < n; ++lin) {
    f(lin, idx);
    for (size_t d = shape.size(); d-- > 0;) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

int64_t offset_of(const Tensor& t, const std::vector<int64_t>& idx, int64_t dim, int64_t at) {
  int64_t off = t.offset();
  for (size_t d = 0; d < idx.size(); ++d) off += (int64_t(d) == dim ? at : idx[d]) * t.strides()[d];
  return off;
}

void index_select_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const int64_t dim = wrap_dim("index_select", a.i("dim"), in[0].dim());
  Tensor idx = as_i64(in[1]);
  check_index_range("index_select", idx, in[0].size(dim));
  const int64_t* p = idx.data<int64_t>();
  for (int64_t i = 0; i < idx.numel(); ++i)
    copy(raw_slice(in[0], dim, p[i], p[i] + 1), raw_slice(out[0], dim, i, i + 1));
}

void gather_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const Tensor& x = in[0];
  const int64_t dim = wrap_dim("gather", a.i("dim"), x.dim());
  Tensor idx = as_i64(in[1]);
  check_index_range("gather", idx, x.dim() ? x.size(dim) : 1);
  const int64_t* pi = idx.data<int64_t>();
  const int64_t es = x.element_size();
  const char* px = static_cast<const char*>(x.storage()->data);
  char* po = static_cast<char*>(out[0].data_ptr());
  for_each_index(idx.shape(), [&](int64_t lin, const std::vector<int64_t>& at) {
    std::memcpy(po + lin * es, px + offset_of(x, at, dim, pi[lin]) * es, size_t(es));
  });
}

void scatter_add_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const Tensor& x = in[0];
  const int64_t dim = wrap_dim("scatter_add", a.i("dim"), x.dim());
  Tensor idx = as_i64(in[1]);
  check_index_range("scatter_add", idx, x.dim() ? x.size(dim) : 1);
  copy(x, out[0]);
  Tensor src = contiguous_as(in[2], x.dtype());
  const int64_t* pi = idx.data<int64_t>();
  visit_dtype(x.dtype(), [&]<class T>() {
    T* po = static_cast<T*>(out[0].storage()->data);
    const T* ps = src.data<T>();
    for_each_index(idx.shape(), [&](int64_t lin, const std::vector<int64_t>& at) {
      T& dst = po[offset_of(out[0], at, dim, pi[lin])];
      if constexpr (std::is_same_v<T, bool>) dst = dst || ps[lin];
      else dst = T(compute_t<T>(dst) + compute_t<T>(ps[lin]));
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
  Tensor keep = Tensor::empty({R, C}, DType::boolean);
  bool* pk = keep.data<bool>();
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) pk[r * C + c] = upper ? (c - r >= diag) : (c - r <= diag);
  where(keep, x, scalar_of(0.0, x.dtype()), out[0]);
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
      std::vector<int64_t> order(static_cast<size_t>(n));
      for (int64_t r = lo; r < hi; ++r) {
        const T* row = px + r * n;
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

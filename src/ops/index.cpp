// Indexing ops: index_select, gather, scatter_add, masked_fill, triu/tril, topk, one_hot, multinomial.
// Indices are range-checked before any kernel runs, so a bad index is an IndexError, never a crash.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "cpu/cpu.h"
#include "ops/common.h"
#include "sinter/random.h"

namespace sinter {
namespace detail {

void check_index_range(const std::string& op, const Tensor& idx, int64_t n) {
  const int64_t* p = idx.data<int64_t>();
  for (int64_t i = 0; i < idx.numel(); ++i)
    SINTER_CHECK_INDEX(p[i] >= 0 && p[i] < n, "[", op, "] index ", p[i], " at position ", i, " out of range for size ", n);
}

namespace {

Tensor as_i64(const Tensor& t) { return contiguous_as(t, DType::i64); }

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

void check_gather_shapes(const std::string& op, const Shape& x, const Shape& index, int64_t dim) {
  SINTER_CHECK_SHAPE(x.size() == index.size(), "[", op, "] index", index, " must have as many dims as input", x);
  for (size_t d = 0; d < x.size(); ++d)
    SINTER_CHECK_SHAPE(int64_t(d) == dim || index[d] <= x[d], "[", op, "] index", index, " is larger than input", x,
                       " in dim ", d);
}

}  // namespace

void register_index_ops() {
  OpDef is;
  is.name = "index_select";  // inputs: x, index (1-D); attr dim
  is.num_inputs = 2;
  is.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    check_integer("index_select", in[1], "index");
    SINTER_CHECK_SHAPE(in[1].shape.size() <= 1, "[index_select] index must be 1-D, got ", in[1].shape);
    SINTER_CHECK_SHAPE(!in[0].shape.empty(), "[index_select] input must have at least 1 dim");
    const int64_t dim = wrap_dim("index_select", a.i("dim"), int64_t(in[0].shape.size()));
    Shape out = in[0].shape;
    out[size_t(dim)] = in[1].shape.numel();
    return std::vector<TensorMeta>{{out, in[0].dtype, in[0].device}};
  };
  is.cpu = [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
    const int64_t dim = wrap_dim("index_select", a.i("dim"), in[0].dim());
    Tensor idx = as_i64(in[1]);
    check_index_range("index_select", idx, in[0].size(dim));
    const int64_t* p = idx.data<int64_t>();
    for (int64_t i = 0; i < idx.numel(); ++i)
      cpu::copy(raw_slice(in[0], dim, p[i], p[i] + 1), raw_slice(out[0], dim, i, i + 1));
  };
  is.backward = [](BackwardCtx& c) {
    const Shape& xs = c.input_meta[0].shape;
    const int64_t dim = wrap_dim("index_select", c.attrs.i("dim"), int64_t(xs.size()));
    const Tensor& g = c.grads[0];
    Shape ishape(xs.size(), 1);
    ishape[size_t(dim)] = g.size(dim);
    Tensor idx = c.inputs[1].to(DType::i64).reshape(ishape).expand(g.shape());
    return std::vector<Tensor>{scatter_add(zeros(xs, g.dtype()), dim, idx, g), Tensor()};
  };
  is.save_inputs = 2;
  add_op(std::move(is));

  OpDef ga;
  ga.name = "gather";  // inputs: x, index (same ndim); out[i][j] = x[index[i][j]][j] for dim 0
  ga.num_inputs = 2;
  ga.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    check_integer("gather", in[1], "index");
    const int64_t dim = wrap_dim("gather", a.i("dim"), int64_t(in[0].shape.size()));
    check_gather_shapes("gather", in[0].shape, in[1].shape, dim);
    return std::vector<TensorMeta>{{in[1].shape, in[0].dtype, in[0].device}};
  };
  ga.cpu = [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
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
  };
  ga.backward = [](BackwardCtx& c) {
    const int64_t dim = c.attrs.i("dim");
    return std::vector<Tensor>{scatter_add(zeros(c.input_meta[0].shape, c.grads[0].dtype()), dim, c.inputs[1], c.grads[0]),
                               Tensor()};
  };
  ga.save_inputs = 2;
  add_op(std::move(ga));

  OpDef sa;
  sa.name = "scatter_add";  // inputs: x, index, src (index and src share a shape)
  sa.num_inputs = 3;
  sa.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    check_integer("scatter_add", in[1], "index");
    const int64_t dim = wrap_dim("scatter_add", a.i("dim"), int64_t(in[0].shape.size()));
    SINTER_CHECK_SHAPE(in[1].shape == in[2].shape, "[scatter_add] index", in[1].shape, " and src", in[2].shape,
                       " must have the same shape");
    check_gather_shapes("scatter_add", in[0].shape, in[1].shape, dim);
    SINTER_CHECK_DTYPE(in[0].dtype == in[2].dtype, "[scatter_add] src dtype ", in[2].dtype, " differs from input dtype ",
                       in[0].dtype);
    return std::vector<TensorMeta>{in[0]};
  };
  sa.cpu = [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
    const Tensor& x = in[0];
    const int64_t dim = wrap_dim("scatter_add", a.i("dim"), x.dim());
    Tensor idx = as_i64(in[1]);
    check_index_range("scatter_add", idx, x.dim() ? x.size(dim) : 1);
    cpu::copy(x, out[0]);
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
  };
  sa.backward = [](BackwardCtx& c) {
    const int64_t dim = c.attrs.i("dim");
    return std::vector<Tensor>{c.grads[0], Tensor(), c.needs_grad[2] ? gather(c.grads[0], dim, c.inputs[1]) : Tensor()};
  };
  sa.save_inputs = 2;
  add_op(std::move(sa));

  OpDef mf;
  mf.name = "masked_fill";  // inputs: x, mask (bool, broadcasts to x); attr value
  mf.num_inputs = 2;
  mf.infer = [](std::span<const TensorMeta> in, const Attrs&) {
    SINTER_CHECK_DTYPE(in[1].dtype == DType::boolean, "[masked_fill] mask must be bool, got ", in[1].dtype);
    const Shape s = broadcast_shapes("masked_fill", in[0].shape, in[1].shape);
    SINTER_CHECK_SHAPE(s == in[0].shape, "[masked_fill] mask", in[1].shape, " does not broadcast to input", in[0].shape);
    return std::vector<TensorMeta>{in[0]};
  };
  mf.cpu = [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
    cpu::where(in[1], scalar_tensor(a.f("value"), in[0].dtype()), in[0], out[0]);
  };
  mf.backward = [](BackwardCtx& c) {
    return std::vector<Tensor>{where(c.inputs[1], zeros({}, c.grads[0].dtype()), c.grads[0]), Tensor()};
  };
  mf.save_inputs = 2;
  mf.fusable = true;
  add_op(std::move(mf));

  OpDef tr;
  tr.name = "triangle";  // triu (upper=true) / tril over the last two dims; attr diagonal
  tr.infer = [](std::span<const TensorMeta> in, const Attrs&) {
    SINTER_CHECK_SHAPE(in[0].shape.size() >= 2, "[triangle] triu/tril need at least 2 dims, got ", in[0].shape);
    return std::vector<TensorMeta>{in[0]};
  };
  tr.cpu = [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
    const Tensor& x = in[0];
    const int64_t R = x.size(-2), C = x.size(-1), diag = a.i("diagonal");
    const bool upper = a.b("upper");
    Tensor keep = Tensor::empty({R, C}, DType::boolean);
    bool* pk = keep.data<bool>();
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) pk[r * C + c] = upper ? (c - r >= diag) : (c - r <= diag);
    cpu::where(keep, x, scalar_tensor(0.0, x.dtype()), out[0]);
  };
  tr.backward = [](BackwardCtx& c) { return std::vector<Tensor>{call1(c.op, {c.grads[0]}, c.attrs)}; };
  tr.save_inputs = 0;
  add_op(std::move(tr));

  OpDef tk;
  tk.name = "topk";  // attrs k, dim, largest; outputs values, indices (sorted, ties by lower index)
  tk.num_outputs = 2;
  tk.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    const int64_t nd = int64_t(in[0].shape.size());
    const int64_t dim = wrap_dim("topk", a.i("dim"), nd);
    const int64_t n = nd ? in[0].shape[size_t(dim)] : 1, k = a.i("k");
    SINTER_CHECK_INDEX(k >= 0 && k <= n, "[topk] k = ", k, " out of range for size ", n, " of a ", in[0].shape, " tensor");
    SINTER_CHECK_DTYPE(in[0].dtype != DType::boolean, "[topk] bool tensors are not supported");
    Shape s = in[0].shape;
    if (nd) s[size_t(dim)] = k;
    return std::vector<TensorMeta>{{s, in[0].dtype, in[0].device}, {s, DType::i64, in[0].device}};
  };
  tk.cpu = [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
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
    cpu::copy(raw_reshape_contiguous(vals, ps), raw_view(out[0], ps, vst, out[0].offset()));
    cpu::copy(raw_reshape_contiguous(idx, ps), raw_view(out[1], ps, ist, out[1].offset()));
  };
  tk.backward = [](BackwardCtx& c) {
    const Shape& xs = c.input_meta[0].shape;
    if (xs.empty()) return std::vector<Tensor>{c.grads[0]};
    const int64_t dim = c.attrs.i("dim");
    return std::vector<Tensor>{scatter_add(zeros(xs, c.grads[0].dtype()), dim, c.outputs[1], c.grads[0])};
  };
  tk.save_inputs = 0;
  tk.save_outputs = 2;
  add_op(std::move(tk));

  OpDef oh;
  oh.name = "one_hot";  // attr num_classes; int64 output (..., C)
  oh.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    check_integer("one_hot", in[0], "indices");
    SINTER_CHECK(a.i("num_classes") > 0, "[one_hot] num_classes must be positive, got ", a.i("num_classes"));
    Shape s = in[0].shape;
    s.push_back(a.i("num_classes"));
    return std::vector<TensorMeta>{{s, DType::i64, in[0].device}};
  };
  oh.cpu = [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
    const int64_t C = a.i("num_classes");
    Tensor idx = as_i64(in[0]);
    check_index_range("one_hot", idx, C);
    cpu::fill(out[0], 0.0);
    const int64_t* pi = idx.data<int64_t>();
    int64_t* po = out[0].data<int64_t>();
    for (int64_t i = 0; i < idx.numel(); ++i) po[i * C + pi[i]] = 1;
  };
  add_op(std::move(oh));

  OpDef mn;
  mn.name = "multinomial";  // probs (P) or (R, P); attrs num_samples, replacement, seed, counter
  mn.random = true;
  mn.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    check_float("multinomial", in[0], "probs");
    const Shape& s = in[0].shape;
    SINTER_CHECK_SHAPE(s.size() == 1 || s.size() == 2, "[multinomial] probs must be (P) or (R, P), got ", s);
    const int64_t n = a.i("num_samples"), P = s.back();
    SINTER_CHECK(n > 0, "[multinomial] num_samples must be positive, got ", n);
    SINTER_CHECK(a.b("replacement") || n <= P, "[multinomial] cannot draw ", n, " samples without replacement from ", P,
                 " categories");
    Shape out = s;
    out.back() = n;
    return std::vector<TensorMeta>{{out, DType::i64, in[0].device}};
  };
  mn.cpu = [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
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
  };
  add_op(std::move(mn));
}

}  // namespace detail

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  static const OpDef& op = get_op("index_select");
  return call1(op, {x, index}, {{"dim", dim}});
}
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  static const OpDef& op = get_op("gather");
  return call1(op, {x, index}, {{"dim", dim}});
}
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  static const OpDef& op = get_op("scatter_add");
  return call1(op, {x, index, src}, {{"dim", dim}});
}
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  static const OpDef& op = get_op("masked_fill");
  return call1(op, {x, mask}, {{"value", value}});
}
Tensor triu(const Tensor& x, int64_t diagonal) {
  static const OpDef& op = get_op("triangle");
  return call1(op, {x}, {{"diagonal", diagonal}, {"upper", true}});
}
Tensor tril(const Tensor& x, int64_t diagonal) {
  static const OpDef& op = get_op("triangle");
  return call1(op, {x}, {{"diagonal", diagonal}, {"upper", false}});
}
ValuesIndices topk(const Tensor& x, int64_t k, int64_t dim, bool largest) {
  static const OpDef& op = get_op("topk");
  auto r = call(op, {x}, {{"k", k}, {"dim", dim}, {"largest", largest}});
  return {r[0], r[1]};
}
Tensor one_hot(const Tensor& indices, int64_t num_classes) {
  static const OpDef& op = get_op("one_hot");
  return call1(op, {indices}, {{"num_classes", num_classes}});
}
Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement) {
  static const OpDef& op = get_op("multinomial");
  const int64_t rows = probs.dim() == 2 ? probs.size(0) : 1;
  Generator& g = default_generator();
  const uint64_t counter = g.reserve(uint64_t((rows * num_samples + 3) / 4));
  return call1(op, {probs},
               {{"num_samples", num_samples}, {"replacement", replacement}, {"seed", int64_t(g.seed)},
                {"counter", int64_t(counter)}});
}

}  // namespace sinter

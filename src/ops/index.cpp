// Indexing ops: index_select, gather, scatter_add, masked_fill, triu/tril, topk, one_hot, multinomial.
// Kernels (src/cpu/op_index.cpp) range-check indices before they read, so a bad index is an
// IndexError, never a crash.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "ops/common.h"
#include "sinter/random.h"

namespace sinter {
namespace detail {

namespace {

void check_gather_shapes(const std::string& op, const Shape& x, const Shape& index, int64_t dim) {
  SINTER_CHECK_SHAPE(x.size() == index.size(), "[", op, "] index", index, " must have as many dims as input", x);
  for (size_t d = 0; d < x.size(); ++d)
    SINTER_CHECK_SHAPE(int64_t(d) == dim || index[d] <= x[d], "[", op, "] index", index, " is larger than input", x,
                       " in dim ", d);
}

}  // namespace

namespace {

void define_index_select() {
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
  is.backward = [](BackwardCtx& c) {
    const Shape& xs = c.input_meta[0].shape;
    const int64_t dim = wrap_dim("index_select", c.attrs.i("dim"), int64_t(xs.size()));
    const Tensor& g = c.grads[0];
    Shape ishape(xs.size(), 1);
    ishape[size_t(dim)] = g.size(dim);
    Tensor idx = c.inputs[1].to(DType::i64).reshape(ishape).expand(g.shape());
    return std::vector<Tensor>{scatter_add(zeros(xs, g.dtype(), g.device()), dim, idx, g), Tensor()};
  };
  is.save_inputs = 2;
  add_op(std::move(is));
}

void define_gather() {
  OpDef ga;
  ga.name = "gather";  // inputs: x, index (same ndim); out[i][j] = x[index[i][j]][j] for dim 0
  ga.num_inputs = 2;
  ga.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    check_integer("gather", in[1], "index");
    const int64_t dim = wrap_dim("gather", a.i("dim"), int64_t(in[0].shape.size()));
    check_gather_shapes("gather", in[0].shape, in[1].shape, dim);
    return std::vector<TensorMeta>{{in[1].shape, in[0].dtype, in[0].device}};
  };
  ga.backward = [](BackwardCtx& c) {
    const int64_t dim = c.attrs.i("dim");
    return std::vector<Tensor>{scatter_add(zeros(c.input_meta[0].shape, c.grads[0].dtype(), c.grads[0].device()), dim, c.inputs[1], c.grads[0]),
                               Tensor()};
  };
  ga.save_inputs = 2;
  add_op(std::move(ga));
}

void define_scatter_add() {
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
  sa.backward = [](BackwardCtx& c) {
    const int64_t dim = c.attrs.i("dim");
    return std::vector<Tensor>{c.grads[0], Tensor(), c.needs_grad[2] ? gather(c.grads[0], dim, c.inputs[1]) : Tensor()};
  };
  sa.save_inputs = 2;
  add_op(std::move(sa));
}

void define_masked_fill() {
  OpDef mf;
  mf.name = "masked_fill";  // inputs: x, mask (bool, broadcasts to x); attr value
  mf.num_inputs = 2;
  mf.infer = [](std::span<const TensorMeta> in, const Attrs&) {
    SINTER_CHECK_DTYPE(in[1].dtype == DType::boolean, "[masked_fill] mask must be bool, got ", in[1].dtype);
    const Shape s = broadcast_shapes("masked_fill", in[0].shape, in[1].shape);
    SINTER_CHECK_SHAPE(s == in[0].shape, "[masked_fill] mask", in[1].shape, " does not broadcast to input", in[0].shape);
    return std::vector<TensorMeta>{in[0]};
  };
  mf.backward = [](BackwardCtx& c) {
    return std::vector<Tensor>{where(c.inputs[1], zeros({}, c.grads[0].dtype()), c.grads[0]), Tensor()};
  };
  mf.save_inputs = 2;
  mf.fusable = true;
  mf.spelling.form = Spelling::Form::fill;
  add_op(std::move(mf));
}

void define_triangle() {
  OpDef tr;
  tr.name = "triangle";  // triu (upper=true) / tril over the last two dims; attr diagonal
  tr.infer = [](std::span<const TensorMeta> in, const Attrs&) {
    SINTER_CHECK_SHAPE(in[0].shape.size() >= 2, "[triangle] triu/tril need at least 2 dims, got ", in[0].shape);
    return std::vector<TensorMeta>{in[0]};
  };
  tr.backward = [](BackwardCtx& c) { return std::vector<Tensor>{call1(c.op, {c.grads[0]}, c.attrs)}; };
  tr.save_inputs = 0;
  add_op(std::move(tr));
}

void define_topk() {
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
  tk.backward = [](BackwardCtx& c) {
    const Shape& xs = c.input_meta[0].shape;
    if (xs.empty()) return std::vector<Tensor>{c.grads[0]};
    const int64_t dim = c.attrs.i("dim");
    return std::vector<Tensor>{scatter_add(zeros(xs, c.grads[0].dtype(), c.grads[0].device()), dim, c.outputs[1], c.grads[0])};
  };
  tk.save_inputs = 0;
  tk.save_outputs = 2;
  add_op(std::move(tk));
}

void define_one_hot() {
  OpDef oh;
  oh.name = "one_hot";  // attr num_classes; int64 output (..., C)
  oh.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    check_integer("one_hot", in[0], "indices");
    SINTER_CHECK(a.i("num_classes") > 0, "[one_hot] num_classes must be positive, got ", a.i("num_classes"));
    Shape s = in[0].shape;
    s.push_back(a.i("num_classes"));
    return std::vector<TensorMeta>{{s, DType::i64, in[0].device}};
  };
  add_op(std::move(oh));
}

void define_multinomial() {
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
  add_op(std::move(mn));
}

}  // namespace

void register_index_ops() {
  define_index_select();
  define_gather();
  define_scatter_add();
  define_masked_fill();
  define_triangle();
  define_topk();
  define_one_hot();
  define_multinomial();
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

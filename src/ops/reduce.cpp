// Reductions, softmax and cumsum; backward broadcasts the gradient back over the reduced dims.
// CPU kernels: src/cpu/op_reduce.cpp.
#include <cmath>

#include "ops/common.h"
#include "sinter/autograd.h"

namespace sinter {
namespace detail {
namespace {

DType sum_dtype(DType t) { return is_floating(t) ? t : DType::i64; }

InferFn reduce_infer(std::string name, bool float_only, bool integer_to_i64) {
  return [name, float_only, integer_to_i64](std::span<const TensorMeta> in, const Attrs& a) {
    if (float_only) check_float(name, in[0]);
    const auto dims = reduce_dims(name, a.ints("dims"), int64_t(in[0].shape.size()));
    const DType dt = integer_to_i64 ? sum_dtype(in[0].dtype) : in[0].dtype;
    return std::vector<TensorMeta>{{reduced_shape(in[0].shape, dims, a.b("keepdim")), dt, in[0].device}};
  };
}

std::vector<int64_t> dims_of(const BackwardCtx& c) {
  return reduce_dims(c.op.name, c.attrs.ints("dims"), int64_t(c.input_meta[0].shape.size()));
}
// g (or the output) shaped to broadcast against the input.
Tensor spread(const BackwardCtx& c, const Tensor& g) {
  return unsqueeze_dims(g, dims_of(c), int64_t(c.input_meta[0].shape.size()), c.attrs.b("keepdim"));
}
int64_t reduced_count(const Shape& shape, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= shape[size_t(d)];
  return n;
}

void define_reduce(const char* name, bool float_only, bool to_i64, BackwardFn bw, uint32_t save_in, uint32_t save_out) {
  OpDef d;
  d.name = name;
  d.infer = reduce_infer(name, float_only, to_i64);
  d.backward = std::move(bw);
  d.save_inputs = save_in;
  d.save_outputs = save_out;
  add_op(std::move(d));
}

void define_arg_reduce(const char* name, bool with_values) {
  OpDef d;
  d.name = name;
  d.num_outputs = with_values ? 2 : 1;
  d.infer = [name = std::string(name), with_values](std::span<const TensorMeta> in, const Attrs& a) {
    const int64_t nd = int64_t(in[0].shape.size());
    const int64_t dim = wrap_dim(name, a.i("dim"), nd);
    SINTER_CHECK_SHAPE(nd == 0 || in[0].shape[size_t(dim)] > 0, "[", name, "] cannot reduce an empty dimension ", dim,
                       " of a ", in[0].shape, " tensor");
    SINTER_CHECK_DTYPE(in[0].dtype != DType::boolean || with_values, "[", name, "] bool tensors are not supported");
    const Shape s = reduced_shape(in[0].shape, nd ? std::vector<int64_t>{dim} : std::vector<int64_t>{}, a.b("keepdim"));
    std::vector<TensorMeta> out;
    if (with_values) out.push_back({s, in[0].dtype, in[0].device});
    out.push_back({s, DType::i64, in[0].device});
    return out;
  };
  if (with_values) {
    d.backward = [](BackwardCtx& c) {
      const Shape& in_shape = c.input_meta[0].shape;
      if (in_shape.empty()) return std::vector<Tensor>{c.grads[0]};
      const int64_t dim = wrap_dim(c.op.name, c.attrs.i("dim"), int64_t(in_shape.size()));
      const bool keep = c.attrs.b("keepdim");
      Tensor g = keep ? c.grads[0] : c.grads[0].unsqueeze(dim);
      Tensor idx = keep ? c.outputs[1] : c.outputs[1].unsqueeze(dim);
      return std::vector<Tensor>{scatter_add(zeros(in_shape, g.dtype(), g.device()), dim, idx, g)};
    };
    d.save_inputs = 0;
    d.save_outputs = 2;
  }
  add_op(std::move(d));
}

void define_softmax(const char* name, bool log) {
  OpDef d;
  d.name = name;
  d.infer = [name = std::string(name)](std::span<const TensorMeta> in, const Attrs& a) {
    check_float(name, in[0]);
    wrap_dim(name, a.i("dim"), int64_t(in[0].shape.size()));
    return std::vector<TensorMeta>{in[0]};
  };
  d.backward = [log](BackwardCtx& c) {
    const int64_t dim = c.attrs.i("dim");
    const Tensor &y = c.outputs[0], &g = c.grads[0];
    // (one lambda serves both ops, so one static each)
    static const OpDef &fused_softmax = get_op("softmax_backward"), &fused_log = get_op("log_softmax_backward");
    const OpDef& fused = log ? fused_log : fused_softmax;
    if (!grad_enabled() && y.dim() > 0 && wrap_dim("softmax", dim, y.dim()) == y.dim() - 1)
      return std::vector<Tensor>{call1(fused, {g, y})};
    if (log) return std::vector<Tensor>{g - exp(y) * sum(g, {dim}, true)};
    return std::vector<Tensor>{y * (g - sum(g * y, {dim}, true))};
  };
  d.save_inputs = 0;
  d.save_outputs = 1;
  add_op(std::move(d));

  // Its backward over the last dim in one pass (used when create_graph is off; no backward itself).
  OpDef b;
  b.name = std::string(name) + "_backward";  // inputs: g, y (the forward's output)
  b.num_inputs = 2;
  b.infer = [name = b.name](std::span<const TensorMeta> in, const Attrs&) {
    check_float(name, in[1]);
    SINTER_CHECK_SHAPE(in[0].shape == in[1].shape && in[0].dtype == in[1].dtype && !in[1].shape.empty(), "[", name,
                       "] gradient", in[0].shape, " ", in[0].dtype, " does not match output", in[1].shape, " ", in[1].dtype);
    return std::vector<TensorMeta>{in[1]};
  };
  add_op(std::move(b));
}

}  // namespace

namespace {

void define_var() {
  OpDef v;
  v.name = "var";
  v.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    check_float("var", in[0]);
    SINTER_CHECK(a.i("correction") >= 0, "[var] correction must be non-negative, got ", a.i("correction"));
    const auto dims = reduce_dims("var", a.ints("dims"), int64_t(in[0].shape.size()));
    return std::vector<TensorMeta>{{reduced_shape(in[0].shape, dims, a.b("keepdim")), in[0].dtype, in[0].device}};
  };
  v.backward = [](BackwardCtx& c) {
    const Tensor& x = c.inputs[0];
    const auto dims = dims_of(c);
    const double n = double(reduced_count(x.shape(), dims));
    Tensor centered = x - mean(x, c.attrs.ints("dims"), true);
    return std::vector<Tensor>{spread(c, c.grads[0]) * centered * (2.0 / (n - double(c.attrs.i("correction"))))};
  };
  add_op(std::move(v));
}

void define_causal_softmax() {
  OpDef ck;
  ck.name = "causal_softmax";  // x (..., Lq, Lkv); attrs offset, window (0: none): row i sees i + offset - window < j <= i + offset;
                               // a row that sees nothing (or only -inf) is 0, as PyTorch's _safe_softmax
  ck.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    check_float("causal_softmax", in[0]);
    SINTER_CHECK_SHAPE(in[0].shape.size() >= 2, "[causal_softmax] needs (..., Lq, Lkv), got ", in[0].shape);
    SINTER_CHECK(!a.has("window") || a.i("window") >= 0, "[causal_softmax] window must be >= 0, got ", a.i("window"));
    return std::vector<TensorMeta>{in[0]};
  };
  ck.backward = [](BackwardCtx& c) {  // softmax's: the masked outputs are 0, so their gradient is too
    const Tensor &y = c.outputs[0], &g = c.grads[0];
    static const OpDef& fused = get_op("softmax_backward");
    if (!grad_enabled()) return std::vector<Tensor>{call1(fused, {g, y})};
    return std::vector<Tensor>{y * (g - sum(g * y, {-1}, true))};
  };
  ck.save_inputs = 0;
  ck.save_outputs = 1;
  add_op(std::move(ck));
}

void define_sum_squares() {
  OpDef ss;
  ss.name = "sum_squares";  // any number of floating tensors -> f64 0-d
  ss.num_inputs = -1;
  ss.infer = [](std::span<const TensorMeta> in, const Attrs&) {
    for (size_t i = 0; i < in.size(); ++i) check_float("sum_squares", in[i], "every input");
    return std::vector<TensorMeta>{{{}, DType::f64, in[0].device}};
  };
  ss.backward = [](BackwardCtx& c) {
    std::vector<Tensor> g(c.inputs.size());
    for (size_t i = 0; i < g.size(); ++i)
      if (c.needs_grad[i]) g[i] = c.inputs[i] * (c.grads[0] * 2.0).to(c.inputs[i].dtype());
    return g;
  };
  add_op(std::move(ss));
}

void define_cumsum() {
  OpDef cs;
  cs.name = "cumsum";
  cs.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    wrap_dim("cumsum", a.i("dim"), int64_t(in[0].shape.size()));
    return std::vector<TensorMeta>{{in[0].shape, sum_dtype(in[0].dtype), in[0].device}};
  };
  cs.backward = [](BackwardCtx& c) {
    // Suffix sums: total - prefix + g.
    const int64_t dim = c.attrs.i("dim");
    const Tensor& g = c.grads[0];
    return std::vector<Tensor>{sum(g, {dim}, true) - cumsum(g, dim) + g};
  };
  cs.save_inputs = 0;
  add_op(std::move(cs));
}

}  // namespace

void register_reduce_ops() {
  define_reduce("sum", false, true,
      [](BackwardCtx& c) { return std::vector<Tensor>{spread(c, c.grads[0]).expand(c.input_meta[0].shape)}; }, 0, 0);

  define_reduce("mean", true, false,
      [](BackwardCtx& c) {
        const double n = double(reduced_count(c.input_meta[0].shape, dims_of(c)));
        return std::vector<Tensor>{(spread(c, c.grads[0]) / n).expand(c.input_meta[0].shape)};
      }, 0, 0);

  define_reduce("prod", false, true,
      [](BackwardCtx& c) {
        // d prod / d x_i = product of the others; exact with zeros (one zero: only it gets a gradient).
        const Tensor& x = c.inputs[0];
        const Shape& dims = c.attrs.ints("dims");
        Tensor is_zero = eq(x, zeros({}, x.dtype()));
        Tensor x_safe = where(is_zero, ones({}, x.dtype()), x);
        Tensor nonzero_prod = prod(x_safe, dims, true);
        Tensor zero_count = sum(cast(is_zero, DType::i64), dims, true);
        Tensor no_zero = eq(zero_count, zeros({}, DType::i64)), one_zero = eq(zero_count, ones({}, DType::i64));
        Tensor z = zeros({}, x.dtype());
        Tensor others = where(no_zero, nonzero_prod / x_safe, where(is_zero, where(one_zero, nonzero_prod, z), z));
        return std::vector<Tensor>{spread(c, c.grads[0]) * others};
      }, 1, 0);
  define_var();
  define_reduce("logsumexp", true, false,
      [](BackwardCtx& c) {
        return std::vector<Tensor>{spread(c, c.grads[0]) * exp(c.inputs[0] - spread(c, c.outputs[0]))};
      }, 1, 1);

  define_arg_reduce("max_dim", true);
  define_arg_reduce("min_dim", true);
  define_arg_reduce("argmax", false);
  define_arg_reduce("argmin", false);
  define_softmax("softmax", false);
  define_softmax("log_softmax", true);
  define_causal_softmax();
  define_sum_squares();
  define_cumsum();
}

}  // namespace detail

namespace {
Tensor reduce_call(const char* name, const Tensor& x, const Shape& dims, bool keepdim) {
  return call1(get_op(name), {x}, {{"dims", dims}, {"keepdim", keepdim}});
}
}  // namespace

Tensor sum(const Tensor& x, const Shape& dims, bool keepdim) {
  static const OpDef& op = get_op("sum");
  return call1(op, {x}, {{"dims", dims}, {"keepdim", keepdim}});
}
Tensor mean(const Tensor& x, const Shape& dims, bool keepdim) {
  static const OpDef& op = get_op("mean");
  return call1(op, {x}, {{"dims", dims}, {"keepdim", keepdim}});
}
Tensor prod(const Tensor& x, const Shape& dims, bool keepdim) { return reduce_call("prod", x, dims, keepdim); }
Tensor logsumexp(const Tensor& x, const Shape& dims, bool keepdim) { return reduce_call("logsumexp", x, dims, keepdim); }
Tensor var(const Tensor& x, const Shape& dims, int64_t correction, bool keepdim) {
  static const OpDef& op = get_op("var");
  return call1(op, {x}, {{"dims", dims}, {"correction", correction}, {"keepdim", keepdim}});
}
Tensor stddev(const Tensor& x, const Shape& dims, int64_t correction, bool keepdim) {
  return sqrt(var(x, dims, correction, keepdim));
}

ValuesIndices max(const Tensor& x, int64_t dim, bool keepdim) {
  static const OpDef& op = get_op("max_dim");
  auto r = call(op, {x}, {{"dim", dim}, {"keepdim", keepdim}});
  return {r[0], r[1]};
}
ValuesIndices min(const Tensor& x, int64_t dim, bool keepdim) {
  static const OpDef& op = get_op("min_dim");
  auto r = call(op, {x}, {{"dim", dim}, {"keepdim", keepdim}});
  return {r[0], r[1]};
}
Tensor max(const Tensor& x) {
  SINTER_CHECK_SHAPE(x.numel() > 0, "[max] empty tensor of shape ", x.shape(), " has no maximum");
  return max(x.reshape({-1}), 0).values;
}
Tensor min(const Tensor& x) {
  SINTER_CHECK_SHAPE(x.numel() > 0, "[min] empty tensor of shape ", x.shape(), " has no minimum");
  return min(x.reshape({-1}), 0).values;
}
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  static const OpDef& op = get_op("argmax");
  return call1(op, {x}, {{"dim", dim}, {"keepdim", keepdim}});
}
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim) {
  static const OpDef& op = get_op("argmin");
  return call1(op, {x}, {{"dim", dim}, {"keepdim", keepdim}});
}
Tensor softmax(const Tensor& x, int64_t dim) {
  static const OpDef& op = get_op("softmax");
  return call1(op, {x}, {{"dim", dim}});
}
Tensor causal_softmax(const Tensor& x, int64_t offset, int64_t window) {
  static const OpDef& op = get_op("causal_softmax");
  return window > 0 ? call1(op, {x}, {{"offset", offset}, {"window", window}}) : call1(op, {x}, {{"offset", offset}});
}
Tensor log_softmax(const Tensor& x, int64_t dim) {
  static const OpDef& op = get_op("log_softmax");
  return call1(op, {x}, {{"dim", dim}});
}
Tensor sum_squares(const std::vector<Tensor>& xs) {
  static const OpDef& op = get_op("sum_squares");
  return call1(op, xs);
}
Tensor cumsum(const Tensor& x, int64_t dim) {
  static const OpDef& op = get_op("cumsum");
  return call1(op, {x}, {{"dim", dim}});
}

}  // namespace sinter

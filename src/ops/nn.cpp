// Neural-network ops: embedding, norms, rotary embedding, cross-entropy, dropout. Forward kernels
// are fused (src/cpu/nn.cpp, registered by src/cpu/op_nn.cpp); backward is written with public ops.
#include <cmath>

#include "ops/common.h"
#include "sinter/autograd.h"
#include "sinter/random.h"

namespace sinter {
namespace detail {
namespace {

void check_norm(const std::string& op, std::span<const TensorMeta> in) {
  check_float(op, in[0]);
  SINTER_CHECK_SHAPE(!in[0].shape.empty(), "[", op, "] input must have at least 1 dim");
  for (size_t i = 1; i < in.size(); ++i) {
    SINTER_CHECK_SHAPE(in[i].shape == Shape{in[0].shape.back()}, "[", op, "] parameter ", i, " has shape ", in[i].shape,
                       ", want (", in[0].shape.back(), ") for input ", in[0].shape);
    SINTER_CHECK_DTYPE(in[i].dtype == in[0].dtype, "[", op, "] parameter ", i, " has dtype ", in[i].dtype, ", input has ",
                       in[0].dtype);
  }
}

void check_ce_inputs(const std::string& op, std::span<const TensorMeta> in, const Attrs& a) {
  const Shape &x = in[0].shape, &t = in[1].shape;
  check_float(op, in[0], "logits");
  check_integer(op, in[1], "target");
  SINTER_CHECK_SHAPE(!x.empty() && Shape(x.begin(), x.end() - 1) == t, "[", op, "] logits", x, " and target", t,
                     " do not match (want logits (..., C), target (...))");
  const double ls = a.f("label_smoothing");
  SINTER_CHECK(ls >= 0 && ls <= 1, "[", op, "] label_smoothing must be in [0, 1], got ", ls);
}

}  // namespace

namespace {

void define_embedding() {
  OpDef em;
  em.name = "embedding";  // inputs: weight (V, D), indices (...) -> (..., D)
  em.num_inputs = 2;
  em.infer = [](std::span<const TensorMeta> in, const Attrs&) {
    SINTER_CHECK_SHAPE(in[0].shape.size() == 2, "[embedding] weight must be (V, D), got ", in[0].shape);
    check_integer("embedding", in[1], "indices");
    Shape out = in[1].shape;
    out.push_back(in[0].shape[1]);
    return std::vector<TensorMeta>{{out, in[0].dtype, in[0].device}};
  };
  em.backward = [](BackwardCtx& c) {
    const Shape& ws = c.input_meta[0].shape;
    static const OpDef& fused = get_op("embedding_backward");
    if (!grad_enabled())  // not recording the backward itself: one pass, no scatter of expanded indices
      return std::vector<Tensor>{call1(fused, {c.grads[0], c.inputs[1]}, {{"num_weights", ws[0]}}), Tensor()};
    const int64_t D = ws[1];
    Tensor idx = c.inputs[1].to(DType::i64).reshape({-1, 1}).expand({-1, D});
    Tensor g = c.grads[0].reshape({-1, D});
    return std::vector<Tensor>{scatter_add(zeros(ws, g.dtype(), g.device()), 0, idx, g), Tensor()};
  };
  em.save_inputs = 2;
  add_op(std::move(em));
}

void define_embedding_backward() {
  OpDef eb;
  eb.name = "embedding_backward";  // inputs: g (..., D), indices (...); attr num_weights -> (V, D)
  eb.num_inputs = 2;
  eb.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    check_float("embedding_backward", in[0], "gradient");
    check_integer("embedding_backward", in[1], "indices");
    const Shape &g = in[0].shape, &idx = in[1].shape;
    SINTER_CHECK_SHAPE(!g.empty() && Shape(g.begin(), g.end() - 1) == idx, "[embedding_backward] gradient", g,
                       " does not match indices", idx, " (want (..., D) and (...))");
    SINTER_CHECK(a.i("num_weights") >= 0, "[embedding_backward] num_weights must be >= 0");
    return std::vector<TensorMeta>{{Shape{a.i("num_weights"), g.back()}, in[0].dtype, in[0].device}};
  };
  add_op(std::move(eb));
}

void define_layer_norm() {
  OpDef ln;
  ln.name = "layer_norm";  // inputs: x (..., D), weight (D), bias (D); attr eps
  ln.num_inputs = 3;
  ln.infer = [](std::span<const TensorMeta> in, const Attrs&) {
    check_norm("layer_norm", in);
    return std::vector<TensorMeta>{in[0]};
  };
  ln.backward = [](BackwardCtx& c) {
    const Tensor &x = c.inputs[0], &w = c.inputs[1], &g = c.grads[0];
    static const OpDef& fused = get_op("layer_norm_backward");
    if (!grad_enabled()) return call(fused, {g, x, w}, c.attrs);
    Tensor xc = x - mean(x, {-1}, true);
    Tensor rstd = rsqrt(mean(xc * xc, {-1}, true) + c.attrs.f("eps"));
    Tensor xhat = xc * rstd;
    std::vector<Tensor> out(3);
    if (c.needs_grad[0]) {
      Tensor gh = g * w;
      out[0] = rstd * (gh - mean(gh, {-1}, true) - xhat * mean(gh * xhat, {-1}, true));
    }
    if (c.needs_grad[1]) out[1] = sum_to(g * xhat, w.shape());
    if (c.needs_grad[2]) out[2] = sum_to(g, w.shape());
    return out;
  };
  ln.save_inputs = 3;
  add_op(std::move(ln));
}

void define_rms_norm() {
  OpDef rn;
  rn.name = "rms_norm";  // inputs: x (..., D), weight (D); attr eps
  rn.num_inputs = 2;
  rn.infer = [](std::span<const TensorMeta> in, const Attrs&) {
    check_norm("rms_norm", in);
    return std::vector<TensorMeta>{in[0]};
  };
  rn.backward = [](BackwardCtx& c) {
    const Tensor &x = c.inputs[0], &w = c.inputs[1], &g = c.grads[0];
    static const OpDef& fused = get_op("rms_norm_backward");
    if (!grad_enabled()) return call(fused, {g, x, w}, c.attrs);
    Tensor r = rsqrt(mean(x * x, {-1}, true) + c.attrs.f("eps"));
    Tensor xhat = x * r;
    std::vector<Tensor> out(2);
    if (c.needs_grad[0]) {
      Tensor gh = g * w;
      out[0] = r * (gh - xhat * mean(gh * xhat, {-1}, true));
    }
    if (c.needs_grad[1]) out[1] = sum_to(g * xhat, w.shape());
    return out;
  };
  add_op(std::move(rn));
}

// Their fused backward (inputs g, x (..., D), w (D); attr eps; outputs dx, dw[, db]).
void define_norm_backward() {
  for (bool layer : {true, false}) {
    OpDef nb;
    nb.name = layer ? "layer_norm_backward" : "rms_norm_backward";  // inputs: g, x (..., D), w (D); attr eps
    nb.num_inputs = 3;                                               // outputs: dx, dw[, db]
    nb.num_outputs = layer ? 3 : 2;
    nb.infer = [layer, name = nb.name](std::span<const TensorMeta> in, const Attrs&) {
      check_norm(name, in.subspan(1));
      SINTER_CHECK_SHAPE(in[0].shape == in[1].shape && in[0].dtype == in[1].dtype, "[", name, "] gradient", in[0].shape,
                         " ", in[0].dtype, " does not match input", in[1].shape, " ", in[1].dtype);
      std::vector<TensorMeta> out{in[1], in[2]};
      if (layer) out.push_back(in[2]);
      return out;
    };
    add_op(std::move(nb));
  }
}

void define_rotary_embedding() {
  OpDef ro;
  ro.name = "rotary_embedding";  // inputs: x (..., T, D), cos (T, D/2), sin (T, D/2)
  ro.num_inputs = 3;
  ro.infer = [](std::span<const TensorMeta> in, const Attrs&) {
    const Shape& x = in[0].shape;
    check_float("rotary_embedding", in[0]);
    SINTER_CHECK_SHAPE(x.size() >= 2 && x.back() % 2 == 0, "[rotary_embedding] x must be (..., T, D) with even D, got ", x);
    const Shape want{x[x.size() - 2], x.back() / 2};
    for (int i = 1; i < 3; ++i) {
      SINTER_CHECK_SHAPE(in[size_t(i)].shape == want, "[rotary_embedding] ", i == 1 ? "cos" : "sin", " has shape ",
                         in[size_t(i)].shape, ", want ", want, " for x", x);
      SINTER_CHECK_DTYPE(in[size_t(i)].dtype == in[0].dtype, "[rotary_embedding] ", i == 1 ? "cos" : "sin", " has dtype ",
                         in[size_t(i)].dtype, ", x has ", in[0].dtype);
    }
    return std::vector<TensorMeta>{in[0]};
  };
  ro.backward = [](BackwardCtx& c) {
    const Tensor &x = c.inputs[0], &cs = c.inputs[1], &sn = c.inputs[2], &g = c.grads[0];
    const int64_t H = x.size(-1) / 2;
    Tensor g1 = g.narrow(-1, 0, H), g2 = g.narrow(-1, H, H);
    std::vector<Tensor> out(3);
    if (c.needs_grad[0]) out[0] = cat({g1 * cs + g2 * sn, g2 * cs - g1 * sn}, -1);
    Tensor x1 = x.narrow(-1, 0, H), x2 = x.narrow(-1, H, H);
    if (c.needs_grad[1]) out[1] = sum_to(g1 * x1 + g2 * x2, cs.shape());
    if (c.needs_grad[2]) out[2] = sum_to(g2 * x1 - g1 * x2, sn.shape());
    return out;
  };
  add_op(std::move(ro));
}

void define_cross_entropy() {
  OpDef ce;
  ce.name = "cross_entropy";  // inputs: logits (..., C), target (...) int; attrs ignore_index, label_smoothing
  ce.num_inputs = 2;
  ce.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    check_ce_inputs("cross_entropy", in, a);
    return std::vector<TensorMeta>{{Shape{}, in[0].dtype, in[0].device}};
  };
  ce.backward = [](BackwardCtx& c) {
    const Tensor &x = c.inputs[0], &g = c.grads[0];
    static const OpDef& fused = get_op("cross_entropy_backward");
    if (!grad_enabled()) return std::vector<Tensor>{call1(fused, {x, c.inputs[1], g}, c.attrs), Tensor()};
    const int64_t C = x.size(-1);
    const double eps = c.attrs.f("label_smoothing");
    Tensor t = c.inputs[1].to(DType::i64);
    Tensor keep = ne(t, full({}, double(c.attrs.i("ignore_index")), DType::i64));
    Tensor safe_t = where(keep, t, zeros({}, DType::i64));
    Tensor keepf = cast(keep, x.dtype());
    Tensor target_dist = cast(one_hot(safe_t, C), x.dtype()) * (1.0 - eps) + eps / double(C);
    Tensor count = sum(keepf);
    return std::vector<Tensor>{(softmax(x, -1) - target_dist) * keepf.unsqueeze(-1) * (g / count), Tensor()};
  };
  add_op(std::move(ce));
}

void define_cross_entropy_backward() {
  OpDef cb;
  cb.name = "cross_entropy_backward";  // inputs: logits (..., C), target (...), g (0-d); attrs as cross_entropy
  cb.num_inputs = 3;
  cb.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    check_ce_inputs("cross_entropy_backward", in, a);
    SINTER_CHECK_SHAPE(in[2].shape.empty() && in[2].dtype == in[0].dtype, "[cross_entropy_backward] gradient must be a 0-d ",
                       in[0].dtype, " tensor, got ", in[2].shape, " ", in[2].dtype);
    return std::vector<TensorMeta>{in[0]};
  };
  add_op(std::move(cb));
}

void define_dropout() {
  OpDef dr;
  dr.name = "dropout";  // attrs p, seed, counter: the same attrs regenerate the same mask
  dr.random = true;
  dr.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    check_float("dropout", in[0]);
    const double p = a.f("p");
    SINTER_CHECK(p >= 0 && p <= 1, "[dropout] p must be in [0, 1], got ", p);
    return std::vector<TensorMeta>{in[0]};
  };
  dr.backward = [](BackwardCtx& c) {  // linear in x: the same mask applied to g
    return std::vector<Tensor>{call1(c.op, {c.grads[0]}, c.attrs)};
  };
  dr.save_inputs = 0;
  add_op(std::move(dr));
}

void define_rope_cos_sin() {
  OpDef rp;
  rp.name = "rope_cos_sin";  // a factory: attrs seq_len, dim, theta, sin -> (seq_len, dim/2) f32
  rp.num_inputs = 0;
  rp.min_inputs = 0;
  rp.infer = [](std::span<const TensorMeta>, const Attrs& a) {
    const int64_t T = a.i("seq_len"), D = a.i("dim");
    SINTER_CHECK(D > 0 && D % 2 == 0 && T >= 0, "[rope_cos_sin] needs an even dim and seq_len >= 0, got ", D, ", ", T);
    return std::vector<TensorMeta>{{{T, D / 2}, DType::f32, a.has("device") ? a.device("device") : Device{}}};
  };
  add_op(std::move(rp));
}

}  // namespace

// The fused backward ops (embedding_backward, layer_norm_backward, ...) serve their forward op's
// backward when no graph of the backward is recorded (create_graph off); with create_graph the
// composite formulas run, which differentiate again. They have no backward of their own.
void register_nn_ops() {
  define_embedding();
  define_embedding_backward();
  define_layer_norm();
  define_rms_norm();
  define_norm_backward();
  define_rotary_embedding();
  define_cross_entropy();
  define_cross_entropy_backward();
  define_dropout();
  define_rope_cos_sin();
}

}  // namespace detail

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  static const OpDef& op = get_op("embedding");
  return call1(op, {weight, indices});
}

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  static const OpDef& op = get_op("layer_norm");
  const int64_t D = x.dim() ? x.size(-1) : 1;
  Tensor w = weight.defined() ? weight : ones({D}, x.dtype(), x.device());
  Tensor b = bias.defined() ? bias : zeros({D}, x.dtype(), x.device());
  return call1(op, {x, w, b}, {{"eps", eps}});
}

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  static const OpDef& op = get_op("rms_norm");
  Tensor w = weight.defined() ? weight : ones({x.dim() ? x.size(-1) : 1}, x.dtype(), x.device());
  return call1(op, {x, w}, {{"eps", eps}});
}

Tensor rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  static const OpDef& op = get_op("rotary_embedding");
  return call1(op, {x, cos, sin});
}

Tensor rope_cos_sin(int64_t seq_len, int64_t dim, double theta, bool want_sin) {
  static const OpDef& op = get_op("rope_cos_sin");
  return call1(op, {}, {{"seq_len", seq_len}, {"dim", dim}, {"theta", theta}, {"sin", want_sin}});
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index, double label_smoothing) {
  static const OpDef& op = get_op("cross_entropy");
  return call1(op, {logits, target}, {{"ignore_index", ignore_index}, {"label_smoothing", label_smoothing}});
}

Tensor dropout(const Tensor& x, double p, bool training) {
  static const OpDef& op = get_op("dropout");
  if (!training || p == 0.0) return x;
  Generator& g = default_generator();
  const uint64_t counter = g.reserve(uint64_t((x.numel() + 3) / 4));
  return call1(op, {x}, {{"p", p}, {"seed", int64_t(g.seed)}, {"counter", int64_t(counter)}});
}

}  // namespace sinter

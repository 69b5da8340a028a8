// Elementwise ops: the X-macros over elementwise.def produce the op-table entries and the public
// functions; where, clamp and cast are written out. Their CPU kernels: src/cpu/op_elementwise.cpp.
#include "ops/common.h"

namespace sinter {
namespace {

using detail::add_op;

enum class UnaryFn {
#define UNARY(F, name, rule, dx) F,
#define BINARY(F, name, rule, da, db)
#include "ops/elementwise.def"
#undef UNARY
#undef BINARY
};
enum class BinaryFn {
#define UNARY(F, name, rule, dx)
#define BINARY(F, name, rule, da, db) F,
#include "ops/elementwise.def"
#undef UNARY
#undef BINARY
};

// Derivative helpers used by elementwise.def, built from public ops so they differentiate too.
Tensor sign_of(const Tensor& x) { return sub(cast(gt(x, zeros({}, x.dtype())), x.dtype()), cast(lt(x, zeros({}, x.dtype())), x.dtype())); }
Tensor step_of(const Tensor& x) { return cast(gt(x, zeros({}, x.dtype())), x.dtype()); }
// f' and f'' of gelu (exact), gelu (tanh) and silu.
Tensor gelu_grad(const Tensor& x) {
  return 0.5 * (1.0 + erf(x * 0.70710678118654752)) + x * 0.3989422804014327 * exp(x * x * -0.5);
}
Tensor gelu_grad2(const Tensor& x) { return 0.3989422804014327 * exp(x * x * -0.5) * (2.0 - x * x); }
// gelu_tanh(x) = x s, s = sigmoid(2u), u = k (x + c x^3): f' = s + x s', f'' = 2 s' + x s''.
Tensor gelu_tanh_grad(const Tensor& x) {
  const double k = 0.79788456080286536, c = 0.044715;
  Tensor s = sigmoid(2 * k * (x + c * x * x * x));
  return s + x * (2 * k * (1.0 + 3 * c * x * x)) * s * (1.0 - s);
}
Tensor gelu_tanh_grad2(const Tensor& x) {
  const double k = 0.79788456080286536, c = 0.044715;
  Tensor s = sigmoid(2 * k * (x + c * x * x * x)), du = 2 * k * (1.0 + 3 * c * x * x), ddu = 12 * k * c * x;
  Tensor s1 = du * s * (1.0 - s), s2 = ddu * s * (1.0 - s) + du * s1 * (1.0 - 2 * s);
  return 2 * s1 + x * s2;
}
Tensor silu_grad(const Tensor& x) {
  Tensor s = sigmoid(x);
  return s * (1.0 + x * (1.0 - s));
}
Tensor silu_grad2(const Tensor& x) {
  Tensor s = sigmoid(x);
  return s * (1.0 - s) * (2.0 + x * (1.0 - 2 * s));
}
// 1 where a wins, 1/2 on ties (the subgradient PyTorch uses for maximum/minimum).
Tensor tie_share(const Tensor& a, const Tensor& b) {
  const DType dt = promote_types(a.dtype(), b.dtype());
  return cast(gt(a, b), dt) + 0.5 * cast(eq(a, b), dt);
}

enum class Rule { keep, float_, promote, true_div, compare };
constexpr Rule rule_keep = Rule::keep, rule_float = Rule::float_, rule_promote = Rule::promote,
               rule_true_div = Rule::true_div, rule_compare = Rule::compare;

InferFn unary_infer(std::string name, Rule rule) {
  return [name, rule](std::span<const TensorMeta> in, const Attrs&) {
    DType dt = in[0].dtype;
    if (rule == Rule::keep)
      SINTER_CHECK_DTYPE(dt != DType::boolean, "[", name, "] bool tensors are not supported; cast to a number type first");
    else if (!is_floating(dt)) dt = DType::f32;
    return std::vector<TensorMeta>{{in[0].shape, dt, in[0].device}};
  };
}

InferFn binary_infer(std::string name, Rule rule) {
  return [name, rule](std::span<const TensorMeta> in, const Attrs&) {
    const Shape shape = detail::broadcast_shapes(name, in[0].shape, in[1].shape);
    DType dt = promote_types(in[0].dtype, in[1].dtype);
    if (rule == Rule::compare) dt = DType::boolean;
    else SINTER_CHECK_DTYPE(dt != DType::boolean, "[", name, "] arithmetic on bool tensors is not supported (got ",
                            in[0].dtype, " and ", in[1].dtype, "); cast first");
    if (rule == Rule::true_div && !is_floating(dt)) dt = DType::f32;
    return std::vector<TensorMeta>{{shape, dt, in[0].device}};
  };
}

const OpDef& define_unary(const char* functor, const char* name, Rule rule, BackwardFn bw) {
  OpDef d;
  d.name = name;
  d.spelling = {.functor = functor};
  d.num_inputs = 1;
  d.infer = unary_infer(name, rule);
  d.backward = std::move(bw);
  d.save_outputs = 1;
  d.fusable = true;
  return add_op(std::move(d));
}

const OpDef& define_binary(const char* functor, const char* name, Rule rule, BackwardFn bw) {
  OpDef d;
  d.name = name;
  d.spelling = {.functor = functor, .true_div = rule == Rule::true_div};
  d.num_inputs = 2;
  d.infer = binary_infer(name, rule);
  d.backward = std::move(bw);
  d.save_outputs = 1;
  d.fusable = true;
  return add_op(std::move(d));
}

const OpDef* g_unary[32];
const OpDef* g_binary[32];

// The tables are filled when the op registry is first used, and an elementwise op may be the
// first op a program calls (`ones({2}) * 2.0`): touch the registry once before reading them.
inline void ensure_tables() {
  static const bool ready = find_op("add") != nullptr;
  (void)ready;
}
const OpDef& unary_def(UnaryFn k) { return ensure_tables(), *g_unary[int(k)]; }
const OpDef& binary_def(BinaryFn k) { return ensure_tables(), *g_binary[int(k)]; }

}  // namespace

namespace detail {

void register_elementwise_ops() {
#define UNARY(F, name, rule, dx)                                                          \
  g_unary[int(UnaryFn::F)] = &define_unary(#F, #name, rule_##rule, [](BackwardCtx& c) {                 \
    const Tensor &x = c.inputs[0], &y = c.outputs[0], &g = c.grads[0];                    \
    (void)x; (void)y;                                                                     \
    return std::vector<Tensor>{dx};                                                       \
  });
#define BINARY(F, name, rule, da, db) BINARY_##rule(F, name, rule, da, db)
#define BINARY_promote(F, name, rule, da, db) BINARY_DIFF(F, name, rule, da, db)
#define BINARY_true_div(F, name, rule, da, db) BINARY_DIFF(F, name, rule, da, db)
#define BINARY_compare(F, name, rule, da, db) \
  g_binary[int(BinaryFn::F)] = &define_binary(#F, #name, rule_##rule, nullptr);
#define BINARY_DIFF(F, name, rule, da, db)                                                \
  g_binary[int(BinaryFn::F)] = &define_binary(#F, #name, rule_##rule, [](BackwardCtx& c) {               \
    const Tensor &a = c.inputs[0], &b = c.inputs[1], &y = c.outputs[0], &g = c.grads[0];  \
    (void)a; (void)b; (void)y;                                                            \
    return std::vector<Tensor>{c.needs_grad[0] ? Tensor(da) : Tensor(),                   \
                               c.needs_grad[1] ? Tensor(db) : Tensor()};                  \
  });
#include "ops/elementwise.def"
#undef UNARY
#undef BINARY
#undef BINARY_promote
#undef BINARY_true_div
#undef BINARY_compare
#undef BINARY_DIFF

  OpDef w;
  w.name = "where";
  w.num_inputs = 3;
  w.infer = [](std::span<const TensorMeta> in, const Attrs&) {
    SINTER_CHECK_DTYPE(in[0].dtype == DType::boolean, "[where] condition must be bool, got ", in[0].dtype);
    Shape s = broadcast_shapes("where", broadcast_shapes("where", in[0].shape, in[1].shape), in[2].shape);
    return std::vector<TensorMeta>{{s, promote_types(in[1].dtype, in[2].dtype), in[0].device}};
  };
  w.backward = [](BackwardCtx& c) {
    const Tensor& cond = c.inputs[0];
    Tensor z = zeros({}, c.grads[0].dtype());
    return std::vector<Tensor>{Tensor(), c.needs_grad[1] ? where(cond, c.grads[0], z) : Tensor(),
                               c.needs_grad[2] ? where(cond, z, c.grads[0]) : Tensor()};
  };
  w.save_inputs = 1;
  w.fusable = true;
  w.spelling.form = Spelling::Form::select;
  add_op(std::move(w));

  OpDef cl;
  cl.name = "clamp";
  cl.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    SINTER_CHECK_DTYPE(in[0].dtype != DType::boolean, "[clamp] bool tensors cannot be clamped");
    if (a.has("min") && a.has("max"))
      SINTER_CHECK(a.f("min") <= a.f("max"), "[clamp] min ", a.f("min"), " is greater than max ", a.f("max"));
    return std::vector<TensorMeta>{in[0]};
  };
  cl.backward = [](BackwardCtx& c) {
    const Tensor& x = c.inputs[0];
    Tensor keep = ones_like(c.grads[0]);
    if (c.attrs.has("min")) keep = keep * cast(ge(x, scalar_tensor(c.attrs.f("min"), x.dtype())), x.dtype());
    if (c.attrs.has("max")) keep = keep * cast(le(x, scalar_tensor(c.attrs.f("max"), x.dtype())), x.dtype());
    return std::vector<Tensor>{c.grads[0] * keep};
  };
  cl.fusable = true;
  cl.spelling.form = Spelling::Form::clamp;
  add_op(std::move(cl));

  OpDef cs;
  cs.name = "cast";
  cs.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    return std::vector<TensorMeta>{{in[0].shape, a.dtype("dtype"), in[0].device}};
  };
  cs.backward = [](BackwardCtx& c) { return std::vector<Tensor>{c.grads[0]}; };
  cs.save_inputs = 0;
  cs.fusable = true;
  cs.spelling.form = Spelling::Form::cast;
  add_op(std::move(cs));
}

}  // namespace detail

#define UNARY(F, name, rule, dx) \
  Tensor name(const Tensor& x) { return call1(unary_def(UnaryFn::F), {x}); }
#define BINARY(F, name, rule, da, db) \
  Tensor name(const Tensor& a, const Tensor& b) { return call1(binary_def(BinaryFn::F), {a, b}); }
#define gelu gelu_exact_
#include "ops/elementwise.def"
#undef gelu
#undef UNARY
#undef BINARY

Tensor gelu(const Tensor& x, bool tanh_approximation) {
  return tanh_approximation ? gelu_tanh(x) : gelu_exact_(x);
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  static const OpDef& op = get_op("where");
  return call1(op, {cond, a, b});
}

Tensor clamp(const Tensor& x, std::optional<double> lo, std::optional<double> hi) {
  static const OpDef& op = get_op("clamp");
  Attrs a;
  if (lo) a.set("min", *lo);
  if (hi) a.set("max", *hi);
  return call1(op, {x}, a);
}

Tensor cast(const Tensor& x, DType dtype) {
  static const OpDef& op = get_op("cast");
  return call1(op, {x}, {{"dtype", dtype}});
}

Tensor Tensor::to(DType dtype) const { return this->dtype() == dtype ? *this : cast(*this, dtype); }

// A Python-style scalar: it takes the tensor's dtype unless a float meets an integer tensor.
static Tensor scalar_like(const Tensor& t, double v) {
  DType dt = t.dtype();
  if (!is_floating(dt) && (v != double(int64_t(v)) || dt == DType::boolean)) dt = v != double(int64_t(v)) ? DType::f32 : DType::i64;
  return scalar_tensor(v, dt);
}

Tensor add(const Tensor& a, double b) { return add(a, scalar_like(a, b)); }
Tensor sub(const Tensor& a, double b) { return sub(a, scalar_like(a, b)); }
Tensor mul(const Tensor& a, double b) { return mul(a, scalar_like(a, b)); }
Tensor div(const Tensor& a, double b) { return div(a, scalar_like(a, b)); }
Tensor pow(const Tensor& a, double b) { return pow(a, scalar_like(a, b)); }
Tensor rsub(const Tensor& a, double b) { return sub(scalar_like(a, b), a); }

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& a) { return neg(a); }
Tensor operator+(const Tensor& a, double b) { return add(a, b); }
Tensor operator-(const Tensor& a, double b) { return sub(a, b); }
Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
Tensor operator/(const Tensor& a, double b) { return div(a, b); }
Tensor operator+(double a, const Tensor& b) { return add(b, a); }
Tensor operator-(double a, const Tensor& b) { return rsub(b, a); }
Tensor operator*(double a, const Tensor& b) { return mul(b, a); }

}  // namespace sinter

// 2:4 semi-structured sparse weights: packing and pruning (by ops, on the weight's device), and the
// ops (one definition for eager calls, autograd of x, bias and the kept values, and tracing):
//   sparse24_linear(x, values, meta, scales[, bias][, packed]) -> y
//       attrs activation, bias, packed (which optional inputs are present)[, dense_copy (false keeps
//       small layers on the 2:4 kernels)][, packed_only, rows, cols (the weight is the packed bytes
//       alone)]; the CPU kernel (cpu/sparse24/linear_cpu.cpp) picks the kernel for the call

//   sparse24_to_dense(values, meta, scales) -> dense (N, K)
//   sparse24_gather(dense, meta) -> kept (N, K/2)
//   sparse24_select(dense) -> keep (N, K) bool, meta (N, ceil(K/8)): the rule of ops/sparse24_select.h
#include <cmath>
#include <sstream>
#include <tuple>

#include "ops/common.h"
#include "sinter/autograd.h"
#include "sinter/sparse.h"
#include "cpu/sparse24/dense_copy.h"
#include "cpu/sparse24/kernels.h"

namespace sinter {
namespace detail {
namespace {

// The weight's parts: values (N, K/2), meta (N, K/8) u8, scales (N) f32; returns (N, K).
std::pair<int64_t, int64_t> check_weight(const char* op, const TensorMeta& values, const TensorMeta& meta, const TensorMeta& scales) {
  SINTER_CHECK_SHAPE(values.shape.size() == 2 && meta.shape.size() == 2 && scales.shape.size() == 1, "[", op,
                     "] a 2:4 weight is values (N, K/2), meta (N, K/8), scales (N); got values", values.shape, " meta",
                     meta.shape, " scales", scales.shape);
  const int64_t N = values.shape[0], K = values.shape[1] * 2;
  SINTER_CHECK_SHAPE(K % 8 == 0 && meta.shape[0] == N && meta.shape[1] * 8 == K && scales.shape[0] == N, "[", op,
                     "] inconsistent 2:4 weight: values", values.shape, " meta", meta.shape, " scales", scales.shape,
                     " (want values (N, K/2), meta (N, K/8), scales (N), K a multiple of 8)");
  SINTER_CHECK_DTYPE(meta.dtype == DType::u8 && is_floating(scales.dtype), "[", op, "] meta must be u8 and scales floating, got ",
                     meta.dtype, " and ", scales.dtype);
  SINTER_CHECK_DTYPE(values.dtype == DType::f32 || values.dtype == DType::bf16 || values.dtype == DType::i8 ||
                         values.dtype == DType::f64,
                     "[", op, "] values must be f32, bf16, i8 (or f64), got ", values.dtype);
  return {N, K};
}

DType dense_dtype(DType values) { return values == DType::f64 ? DType::f64 : values == DType::bf16 ? DType::bf16 : DType::f32; }

}  // namespace

void register_sparse_ops() {
  OpDef li;
  li.name = "sparse24_linear";
  li.num_inputs = -1;
  li.min_inputs = 4;
  li.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    const bool has_bias = a.b("bias"), has_packed = a.b("packed");
    const size_t want = 4 + has_bias + has_packed;
    SINTER_CHECK(in.size() == want, "[sparse24_linear] takes x, values, meta, scales", has_bias ? ", bias" : "",
                 has_packed ? ", packed" : "", ": ", want, " inputs, got ", in.size());
    // packed_only: the weight is its prepacked layout alone (prepack(replace=true)); values and
    // meta are empty placeholders giving the values' dtype, and attrs rows and cols its shape.
    const bool packed_only = a.b_or("packed_only", false);
    int64_t N = 0, K = 0;
    if (packed_only) {
      N = a.i("rows"), K = a.i("cols");
      SINTER_CHECK_SHAPE(has_packed && N >= 0 && K % 8 == 0 && in[1].shape == Shape{0} && in[2].shape == Shape{0} &&
                             in[3].shape == Shape{N},
                         "[sparse24_linear] a weight held only prepacked is x, empty values and meta, scales (", N, "), the packed "
                         "bytes (K a multiple of 8); got values", in[1].shape, " meta", in[2].shape, " scales", in[3].shape,
                         has_packed ? "" : " and no packed input");
      SINTER_CHECK_DTYPE(in[1].dtype == DType::f32 || in[1].dtype == DType::bf16 || in[1].dtype == DType::i8,
                         "[sparse24_linear] prepacked values must be f32, bf16 or i8, got ", in[1].dtype);
    } else {
      std::tie(N, K) = check_weight("sparse24_linear", in[1], in[2], in[3]);
    }
    const Shape& x = in[0].shape;
    SINTER_CHECK_SHAPE(!x.empty() && x.back() == K, "[sparse24_linear] x", x, " does not match the 2:4 weight (", N, ", ", K,
                       ") (want x (..., K))");
    const bool f64 = in[0].dtype == DType::f64;
    SINTER_CHECK_DTYPE(in[0].dtype == DType::f32 || in[0].dtype == DType::bf16 || f64, "[sparse24_linear] x must be f32 or bf16, got ",
                       in[0].dtype);
    SINTER_CHECK_DTYPE(f64 == (in[1].dtype == DType::f64), "[sparse24_linear] f64 x needs f64 values and f64 values f64 x, got x ",
                       in[0].dtype, " values ", in[1].dtype);
    size_t at = 4;
    if (has_bias) {
      SINTER_CHECK_SHAPE(in[at].shape == Shape{N}, "[sparse24_linear] bias", in[at].shape, " does not match the weight's ", N, " rows");
      SINTER_CHECK_DTYPE(in[at].dtype == in[0].dtype, "[sparse24_linear] bias dtype ", in[at].dtype, " differs from x's ", in[0].dtype);
      ++at;
    }
    if (has_packed) {
      const int64_t want_bytes = sparse::prepacked_bytes(in[1].dtype, N, K);
      SINTER_CHECK_SHAPE(in[at].dtype == DType::u8 && in[at].shape == Shape{want_bytes}, "[sparse24_linear] packed ", in[at].dtype,
                         in[at].shape, " is not a prepacked (", N, ", ", K, ") weight of ", in[1].dtype, " values (want u8 (",
                         want_bytes, "))");
    }
    sparse::parse_activation(a.str("activation"));
    Shape out = x;
    out.back() = N;
    return std::vector<TensorMeta>{{out, in[0].dtype, in[0].device}};
  };
  li.backward = [](BackwardCtx& c) {
    SINTER_CHECK(c.attrs.str("activation") == "none",
                 "[sparse24_linear] no backward through a fused activation: linear(x, sparse_w, b, act) applies the "
                 "activation as its own op when a gradient is needed");
    SINTER_CHECK(!c.attrs.b_or("packed_only", false),
                 "[sparse24_linear] no backward for a weight held only prepacked (prepack(replace=true)): unpack() it first");
    const Tensor &x = c.inputs[0], &values = c.inputs[1], &meta = c.inputs[2], &scales = c.inputs[3], &g = c.grads[0];
    const int64_t N = values.size(0), K = values.size(1) * 2;
    std::vector<Tensor> out(c.input_meta.size());
    static const OpDef& to_dense = get_op("sparse24_to_dense");
    static const OpDef& gather = get_op("sparse24_gather");
    if (c.needs_grad[0]) {
      Tensor w = call1(to_dense, {values, meta, scales});
      out[0] = matmul(g, w.dtype() == g.dtype() ? w : w.to(g.dtype()));
    }
    if (c.needs_grad[1] && is_floating(values.dtype())) {  // the kept entries of g^T x, scaled
      Tensor gw = matmul(g.reshape({-1, N}).t(), x.reshape({-1, K}));
      out[1] = (call1(gather, {gw, meta}) * scales.to(gw.dtype()).reshape({N, 1})).to(values.dtype());
    }
    if (c.attrs.b("bias") && c.needs_grad[4]) out[4] = sum_to(g, {N});
    return out;
  };
  li.save_inputs = 0b1111;  // x and the weight (bias and packed are not needed)
  add_op(std::move(li));

  OpDef td;
  td.name = "sparse24_to_dense";  // values, meta, scales -> (N, K)
  td.num_inputs = 3;
  td.infer = [](std::span<const TensorMeta> in, const Attrs&) {
    const auto [N, K] = check_weight("sparse24_to_dense", in[0], in[1], in[2]);
    return std::vector<TensorMeta>{{{N, K}, dense_dtype(in[0].dtype), in[0].device}};
  };
  td.backward = [](BackwardCtx& c) {
    static const OpDef& gather = get_op("sparse24_gather");
    std::vector<Tensor> out(3);
    const Tensor &values = c.inputs[0], &scales = c.inputs[2];
    if (c.needs_grad[0] && is_floating(values.dtype()))
      out[0] = (call1(gather, {c.grads[0], c.inputs[1]}) * scales.to(c.grads[0].dtype()).reshape({values.size(0), 1})).to(values.dtype());
    return out;
  };
  add_op(std::move(td));

  OpDef ga;
  ga.name = "sparse24_gather";  // dense (N, K), meta (N, K/8) -> the kept entries (N, K/2)
  ga.num_inputs = 2;
  ga.infer = [](std::span<const TensorMeta> in, const Attrs&) {
    SINTER_CHECK_SHAPE(in[0].shape.size() == 2 && in[1].shape.size() == 2 && in[0].shape[1] % 8 == 0 &&
                           in[1].shape[0] == in[0].shape[0] && in[1].shape[1] * 8 == in[0].shape[1],
                       "[sparse24_gather] dense", in[0].shape, " and meta", in[1].shape, " (want (N, K) and (N, K/8))");
    SINTER_CHECK_DTYPE(in[0].dtype == DType::f32 || in[0].dtype == DType::f64, "[sparse24_gather] dense must be f32 or f64, got ",
                       in[0].dtype);
    SINTER_CHECK_DTYPE(in[1].dtype == DType::u8, "[sparse24_gather] meta must be u8, got ", in[1].dtype);
    return std::vector<TensorMeta>{{{in[0].shape[0], in[0].shape[1] / 2}, in[0].dtype, in[0].device}};
  };
  ga.backward = [](BackwardCtx& c) {  // the kept entries go back to their places, zeros elsewhere
    static const OpDef& to_dense = get_op("sparse24_to_dense");
    const int64_t N = c.inputs[0].size(0);
    std::vector<Tensor> out(2);
    if (c.needs_grad[0]) out[0] = call1(to_dense, {c.grads[0], c.inputs[1], ones({N}, DType::f32)});
    return out;
  };
  add_op(std::move(ga));

  OpDef se;
  se.name = "sparse24_select";  // dense (N, K), K a multiple of 4 -> keep (N, K) bool, meta (N, ceil(K/8)) u8
  se.num_inputs = 1;
  se.num_outputs = 2;
  se.infer = [](std::span<const TensorMeta> in, const Attrs&) {
    SINTER_CHECK_SHAPE(in[0].shape.size() == 2 && in[0].shape[1] % 4 == 0, "[sparse24_select] dense must be (N, K) with K a ",
                       "multiple of 4, got ", in[0].shape);
    SINTER_CHECK_DTYPE(in[0].dtype == DType::f32 || in[0].dtype == DType::f64, "[sparse24_select] dense must be f32 or f64, got ",
                       in[0].dtype);
    const int64_t N = in[0].shape[0], K = in[0].shape[1];
    return std::vector<TensorMeta>{{{N, K}, DType::boolean, in[0].device}, {{N, (K + 7) / 8}, DType::u8, in[0].device}};
  };
  add_op(std::move(se));
}

}  // namespace detail

int64_t SemiStructuredSparse::nbytes() const {
  const int64_t s = scales.defined() ? scales.numel() * scales.element_size() : 0;
  if (packed_only()) return packed.numel() + s;
  return values.numel() * values.element_size() + meta.numel() + s;
}

bool SemiStructuredSparse::packed_only() const { return packed.defined() && values.defined() && values.is_symbolic(); }

void SemiStructuredSparse::unpack() {
  if (!packed_only()) return;
  const int64_t N = rows(), K = cols();
  Tensor v = Tensor::empty({N, K / 2}, dtype()), m = Tensor::empty({N, K / 8}, DType::u8);
  sparse::packed_payload(packed.data<uint8_t>(), packed.numel(), dtype(), N, K, "unpack");  // this build's format, this weight
  sparse::unpack(packed.data<uint8_t>(), dtype(), N, K, v.data_ptr(), m.data<uint8_t>());
  values = v, meta = m;
  packed_from[0] = {values.storage(), values.data_ptr(), values.version()};
  packed_from[1] = {meta.storage(), meta.data_ptr(), meta.version()};
}

void SemiStructuredSparse::prepack(bool replace) {
  if (packed_only()) return;
  prepack_copy();
  if (replace) {  // the layout is the weight now: values and meta keep their shape and dtype, not their bytes
    values = Tensor::symbolic(values.shape(), values.dtype());
    meta = Tensor::symbolic(meta.shape(), DType::u8);
    packed_from[0] = packed_from[1] = {};
  }
}

void SemiStructuredSparse::prepack_copy() {
  SINTER_CHECK_SHAPE(values.defined() && meta.defined() && values.dim() == 2, "[prepack] needs values (N, K/2) and meta (N, K/8)",
                     values.defined() ? "; got values" : "; got no values", values.defined() ? values.shape() : Shape{});
  SINTER_CHECK_DTYPE(dtype() == DType::f32 || dtype() == DType::bf16 || dtype() == DType::i8,
                     "[prepack] values must be f32, bf16 or i8, got ", dtype());
  const int64_t N = rows(), K = cols();
  Tensor v = values.detach().contiguous(), m = meta.contiguous().to(DType::u8);
  SINTER_CHECK_SHAPE(m.shape() == Shape({N, K / 8}), "[prepack] meta", m.shape(), " does not match values", values.shape());
  Tensor p = Tensor::empty({sparse::prepacked_bytes(dtype(), N, K)}, DType::u8);
  sparse::prepack(v.data_ptr(), dtype(), m.data<uint8_t>(), N, K, p.data<uint8_t>());
  packed = p;
  packed_from[0] = {values.storage(), values.data_ptr(), values.version()};
  packed_from[1] = {meta.storage(), meta.data_ptr(), meta.version()};
}

bool prepacked_serves(DType values, int64_t M) { return sparse::prepacked_serves(values, M); }

bool SemiStructuredSparse::Source::same(const Tensor& t) const {
  return t.defined() && data == t.data_ptr() && version == t.version() && !storage.owner_before(t.storage()) &&
         !t.storage().owner_before(storage);
}

bool SemiStructuredSparse::packed_current() const {
  return packed_only() || (packed.defined() && packed_from[0].same(values) && packed_from[1].same(meta));
}

Tensor SemiStructuredSparse::to_dense() const {
  static const OpDef& op = get_op("sparse24_to_dense");
  if (packed_only()) {
    SemiStructuredSparse w = *this;
    w.unpack();
    return call1(op, {w.values, w.meta, w.scales});
  }
  return call1(op, {values, meta, scales});
}

namespace {

// w as the f32 or f64 (N, K) matrix the select and gather ops take: exact for every floating dtype.
Tensor rows_of(const Tensor& w, int64_t K) {
  return w.detach().to(w.dtype() == DType::f64 ? DType::f64 : DType::f32).contiguous().reshape({w.numel() / K, K});
}

// Fails naming the first group of four (in row-major order) that holds more than two nonzeros.
void check_two_of_four(const Tensor& d) {
  const int64_t N = d.size(0), K = d.size(1);
  const Tensor counts = sum(ne(d, zeros({}, d.dtype())).to(DType::i32).reshape({N * K / 4, 4}), {1});
  const int64_t g = argmax(gt(counts, full({}, 2, counts.dtype())).to(DType::i32), 0).item<int64_t>();  // the first crowded group
  const int64_t nz = counts.narrow(0, g, 1).item<int64_t>();
  if (nz <= 2) return;
  const int64_t n = g / (K / 4), c = 4 * (g % (K / 4));
  const std::vector<double> q = d.narrow(0, n, 1).narrow(1, c, 4).to(DType::f64).to_vector<double>();
  std::ostringstream vals;
  vals << q[0] << ", " << q[1] << ", " << q[2] << ", " << q[3];
  SINTER_THROW(ShapeError, "[to_sparse_semi_structured] row ", n, ", columns ", c, "..", c + 3, " hold ", nz, " nonzeros (", vals.str(),
               "): not in the 2:4 pattern (prune_2_4 makes it so)");
}

// int8 values of the kept entries, with symmetric per-row scales: the largest |kept| maps to 127,
// the others round half away from zero (scales computed in f64, held in f32).
std::pair<Tensor, Tensor> quantize_rows(const Tensor& kept) {
  const int64_t N = kept.size(0);
  if (kept.numel() == 0) return {Tensor::empty(kept.shape(), DType::i8, kept.device()), ones({N}, DType::f32, kept.device())};
  const Tensor most = max(abs(kept), 1).values.to(DType::f64);
  const Tensor scales = where(gt(most, zeros({}, DType::f64)), most / 127.0, ones({}, DType::f64)).to(DType::f32);
  const Tensor q = clamp(kept.to(DType::f64) / scales.to(DType::f64).reshape({N, 1}), -127.0, 127.0);
  const Tensor half = where(ge(q, zeros({}, DType::f64)), full({}, 0.5, DType::f64), full({}, -0.5, DType::f64));
  return {(q + half).to(DType::i8), scales};  // the cast truncates toward zero
}

}  // namespace

Tensor mask_2_4(const Tensor& w) {
  SINTER_CHECK_SHAPE(w.dim() >= 1 && w.size(-1) % 4 == 0, "[prune_2_4] the last dim must be a multiple of 4, got ", w.shape());
  SINTER_CHECK_DTYPE(is_floating(w.dtype()), "[prune_2_4] needs a floating tensor, got ", w.dtype());
  if (w.numel() == 0) return Tensor::empty(w.shape(), DType::boolean, w.device());
  static const OpDef& select = get_op("sparse24_select");
  return call(select, {rows_of(w, w.size(-1))})[0].reshape(w.shape());
}

Tensor prune_2_4(const Tensor& w) { return where(mask_2_4(w), w, zeros({}, w.dtype())); }

SemiStructuredSparse to_sparse_semi_structured(const Tensor& dense, std::optional<DType> values_dtype) {
  SINTER_CHECK_SHAPE(dense.dim() == 2 && dense.size(1) % 8 == 0, "[to_sparse_semi_structured] needs an (N, K) matrix with K a ",
                     "multiple of 8, got ", dense.shape());
  SINTER_CHECK_DTYPE(is_floating(dense.dtype()), "[to_sparse_semi_structured] needs a floating matrix, got ", dense.dtype());
  const DType vt = values_dtype ? *values_dtype : dense.dtype();
  SINTER_CHECK_DTYPE(vt == DType::f32 || vt == DType::bf16 || vt == DType::i8 || vt == DType::f64,
                     "[to_sparse_semi_structured] values can be f32, bf16, i8 or f64, not ", vt);
  const int64_t N = dense.size(0), K = dense.size(1);
  static const OpDef& select = get_op("sparse24_select");
  static const OpDef& gather = get_op("sparse24_gather");
  const Tensor d = rows_of(dense, std::max<int64_t>(K, 1));
  SemiStructuredSparse s;
  if (N * K > 0) check_two_of_four(d);
  s.meta = N * K > 0 ? call(select, {d})[1] : Tensor::empty({N, K / 8}, DType::u8, dense.device());
  const Tensor kept = N * K > 0 ? call1(gather, {d, s.meta}) : Tensor::empty({N, K / 2}, d.dtype(), dense.device());
  if (vt == DType::i8) {
    std::tie(s.values, s.scales) = quantize_rows(kept);
  } else {
    s.values = kept.to(vt);
    s.scales = ones({N}, DType::f32, dense.device());
  }
  return s;
}

// The activation as its own op (for calls that need its gradient).
static Tensor activate(const Tensor& y, const std::string& activation) {
  if (activation == "relu") return relu(y);
  if (activation == "silu") return silu(y);
  if (activation == "gelu") return gelu(y);
  return y;
}

// An eager call without gradients on a small CPU layer, where the 2:4 kernel would run the GEMM of
// the weight's cached dense copy: that copy through the dense linear op, so the 2:4 layer costs what
// a dense one does (no second op's bookkeeping). f32 x, or bf16 x without an activation (bf16 would
// round twice) where the copy is bf16. The weight gets the op's own checks; for any other malformed
// call (x, bias) it is undefined, and the op names what is wrong.
static Tensor small_layer_dense(const Tensor& x, const SemiStructuredSparse& w, const Tensor& b, bool grads, const std::string& act) {
  const bool bf16 = x.dtype() == DType::bf16 && act == "none" && sparse::dense_copy_dtype(x.dtype(), w.dtype()) == DType::bf16;
  if (grads || !(x.dtype() == DType::f32 || bf16) || x.device().type != DeviceType::cpu || x.is_symbolic() || x.dim() == 0) return {};
  const auto meta_of = [](const Tensor& t) { return TensorMeta{t.shape(), t.dtype(), t.device()}; };
  const auto [N, K] = detail::check_weight("sparse24_linear", meta_of(w.values), meta_of(w.meta), meta_of(w.scales));
  if (w.dtype() == DType::f64 || x.size(-1) != K || (b.defined() && (b.dtype() != x.dtype() || b.shape() != Shape{N}))) return {};
  const sparse::Call call{x.dtype(), w.dtype(), x.numel() / std::max<int64_t>(K, 1), N, K};
  if (sparse::choose(call).kernel != sparse::Kernel::dense) return {};
  const Tensor d = sparse::dense_copy(w.values, w.meta, w.scales, bf16 ? DType::bf16 : DType::f32);
  return d.defined() && d.dtype() == x.dtype() ? d : Tensor();  // a bf16 copy that had to stay f32: the op
}

Tensor linear(const Tensor& x, const SemiStructuredSparse& w, const Tensor& b, const std::string& activation) {
  static const OpDef& op = get_op("sparse24_linear");
  sparse::parse_activation(activation);
  if (w.packed_only()) {  // inference only: the gradients need values and meta
    SINTER_CHECK(w.scales.defined(), "[sparse24_linear] the 2:4 weight has no scales");
    SINTER_CHECK(!(grad_enabled() && (x.requires_grad() || (b.defined() && b.requires_grad()))),
                 "[sparse24_linear] the 2:4 weight is held only in its prepacked layout (prepack(replace=true)), which has no "
                 "gradient: call it under NoGradGuard with inputs that need none, or unpack() the weight first");
    static const Tensor empty_values[3] = {Tensor::empty({0}, DType::f32), Tensor::empty({0}, DType::bf16), Tensor::empty({0}, DType::i8)};
    static const Tensor empty_meta = Tensor::empty({0}, DType::u8);  // the same placeholders every call (a traced graph keeps them)
    const Tensor& ev = empty_values[w.dtype() == DType::f32 ? 0 : w.dtype() == DType::bf16 ? 1 : 2];
    std::vector<Tensor> in{x, ev, empty_meta, w.scales};
    if (b.defined()) in.push_back(b);
    in.push_back(w.packed);
    return call1(op, in,
                 {{"activation", activation}, {"bias", b.defined()}, {"packed", true}, {"packed_only", true}, {"rows", w.rows()},
                  {"cols", w.cols()}});
  }
  SINTER_CHECK(w.defined() && w.meta.defined() && w.scales.defined(), "[sparse24_linear] the 2:4 weight has no ",
               !w.defined() ? "values" : !w.meta.defined() ? "meta" : "scales");
  const bool grads = grad_enabled() && (x.requires_grad() || w.values.requires_grad() || (b.defined() && b.requires_grad()));
  if (const Tensor dense = small_layer_dense(x, w, b, grads, activation); dense.defined()) return activate(linear(x, dense, b), activation);
  std::vector<Tensor> in{x, w.values, w.meta, w.scales};
  if (b.defined()) in.push_back(b);
  const bool packed = w.packed_current();  // the kernel decides whether to read it
  if (packed) in.push_back(w.packed);
  const std::string act = grads ? "none" : activation;  // differentiable: the activation as its own op
  Tensor y = call1(op, in, {{"activation", act}, {"bias", b.defined()}, {"packed", packed}});
  return act == activation ? y : activate(y, activation);
}

bool prepack_helps(const SemiStructuredSparse& w, DType x, int64_t M) {
  SINTER_CHECK(w.defined() && w.values.dim() == 2, "[prepack_helps] needs a 2:4 weight");
  const sparse::Kernel k = sparse::choose({x, w.dtype(), M, w.rows(), w.cols(), true, true}).kernel;
  return k == sparse::Kernel::prepacked8 || k == sparse::Kernel::prepacked16 || k == sparse::Kernel::pairs_prepacked16;
}

std::string sparse_kernel_for(const SemiStructuredSparse& w, DType x, int64_t M) {
  SINTER_CHECK(w.defined() && w.values.dim() == 2, "[sparse_kernel_for] needs a 2:4 weight");
  return sparse::kernel_name(sparse::choose({x, w.dtype(), M, w.rows(), w.cols(), w.packed_current(), true, w.packed_only()}).kernel);
}

bool sparse_runs_densely(const SemiStructuredSparse& w, DType x) {
  SINTER_CHECK(w.defined() && w.values.dim() == 2, "[sparse_runs_densely] needs a 2:4 weight");
  return sparse::choose({x, w.dtype(), 1, w.rows(), w.cols(), false, true, w.packed_only()}).kernel == sparse::Kernel::dense;
}

int64_t sparse_dense_copy_bytes() { return sparse::dense_copy_bytes(); }

}  // namespace sinter

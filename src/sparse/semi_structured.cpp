// 2:4 semi-structured sparse weights: packing, pruning, and the ops that use them.
//   sparse24_linear(x, values, meta, scales[, bias]) -> y         attr activation
//   sparse24_linear_prepacked(x, packed, scales[, bias]) -> y     attrs activation, cols, values
//   sparse24_to_dense(values, meta, scales) -> dense (N, K)
//   sparse24_gather(dense, meta) -> kept (N, K/2)
// One op definition serves eager calls, autograd (gradients for x, bias and the float values:
// the weight gradient of the kept entries, so fine-tuning keeps the pattern) and tracing.
#include <cmath>
#include <sstream>

#include "ops/common.h"
#include "sinter/autograd.h"
#include "sinter/sparse.h"
#include "sparse/kernels.h"

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
  li.name = "sparse24_linear";  // x (..., K), values, meta, scales[, bias (N)]; attr activation
  li.num_inputs = -1;
  li.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    SINTER_CHECK(in.size() == 4 || in.size() == 5, "[sparse24_linear] takes x, values, meta, scales and an optional bias, got ",
                 in.size(), " inputs");
    const auto [N, K] = check_weight("sparse24_linear", in[1], in[2], in[3]);
    const Shape& x = in[0].shape;
    SINTER_CHECK_SHAPE(!x.empty() && x.back() == K, "[sparse24_linear] x", x, " does not match the 2:4 weight (", N, ", ", K,
                       ") (want x (..., K))");
    const bool f64 = in[0].dtype == DType::f64;
    SINTER_CHECK_DTYPE(in[0].dtype == DType::f32 || in[0].dtype == DType::bf16 || f64, "[sparse24_linear] x must be f32 or bf16, got ",
                       in[0].dtype);
    SINTER_CHECK_DTYPE(f64 == (in[1].dtype == DType::f64), "[sparse24_linear] f64 x needs f64 values and f64 values f64 x, got x ",
                       in[0].dtype, " values ", in[1].dtype);
    if (in.size() == 5) {
      SINTER_CHECK_SHAPE(in[4].shape == Shape{N}, "[sparse24_linear] bias", in[4].shape, " does not match the weight's ", N, " rows");
      SINTER_CHECK_DTYPE(in[4].dtype == in[0].dtype, "[sparse24_linear] bias dtype ", in[4].dtype, " differs from x's ", in[0].dtype);
    }
    sparse::parse_activation(a.has("activation") ? a.str("activation") : "none");
    Shape out = x;
    out.back() = N;
    return std::vector<TensorMeta>{{out, in[0].dtype, in[0].device}};
  };
  li.cpu = [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
    const int64_t N = in[1].size(0), K = in[1].size(1) * 2, M = in[0].numel() / std::max<int64_t>(K, 1);
    const sparse::Act act = sparse::parse_activation(a.has("activation") ? a.str("activation") : "none");
    Tensor values = contiguous_as(in[1], in[1].dtype()), meta = contiguous_as(in[2], DType::u8),
           scales = contiguous_as(in[3], DType::f32);
    if (in[0].dtype() == DType::f64) {
      Tensor x = contiguous_as(in[0], DType::f64), b = in.size() == 5 ? contiguous_as(in[4], DType::f64) : Tensor();
      sparse::linear_f64(x.data<double>(), M, K, values.data<double>(), meta.data<uint8_t>(), scales.data<float>(),
                         b.defined() ? b.data<double>() : nullptr, act, out[0].data<double>(), N);
      return;
    }
    Tensor b = in.size() == 5 ? contiguous_as(in[4], DType::f32) : Tensor();
    Tensor y = out[0].dtype() == DType::f32 ? out[0] : Tensor::empty(out[0].shape(), DType::f32);
    if (sparse::pairs_serve(in[0].dtype(), values.dtype(), M)) {  // bf16 x bf16: vdpbf16ps on pairs of kept values
      Tensor x = contiguous_as(in[0], DType::bf16);
      sparse::linear_bf16_pairs(reinterpret_cast<const uint16_t*>(x.data_ptr()), M, K, reinterpret_cast<const uint16_t*>(values.data_ptr()),
                                meta.data<uint8_t>(), scales.data<float>(), b.defined() ? b.data<float>() : nullptr, act, y.data<float>(), N);
      if (out[0].dtype() != DType::f32) out[0].copy_(y);
      return;
    }
    Tensor x = contiguous_as(in[0], DType::f32);
    sparse::linear_f32(x.data<float>(), M, K, values.data_ptr(), values.dtype(), meta.data<uint8_t>(), scales.data<float>(),
                       b.defined() ? b.data<float>() : nullptr, act, y.data<float>(), N);
    if (out[0].dtype() != DType::f32) out[0].copy_(y);
  };
  li.backward = [](BackwardCtx& c) {
    SINTER_CHECK(!c.attrs.has("activation") || c.attrs.str("activation") == "none",
                 "[sparse24_linear] no backward through a fused activation: linear(x, sparse_w, b, act) applies the "
                 "activation as its own op when a gradient is needed");
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
    if (out.size() == 5 && c.needs_grad[4]) out[4] = sum_to(g, {N});
    return out;
  };
  add_op(std::move(li));

  // The same product from prepacked weights (SemiStructuredSparse::prepack, layout in
  // sparse/kernels.h): packed u8, cols = K, values = the kept values' dtype. Inference only (no
  // backward): linear() takes it for calls without gradients.
  OpDef lp;
  lp.name = "sparse24_linear_prepacked";  // x (..., K), packed, scales (N)[, bias (N)]; attrs activation, cols, values
  lp.num_inputs = -1;
  lp.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    SINTER_CHECK(in.size() == 3 || in.size() == 4,
                 "[sparse24_linear_prepacked] takes x, packed, scales and an optional bias, got ", in.size(), " inputs");
    const int64_t K = a.i("cols");
    const DType vt = a.dtype("values");
    SINTER_CHECK_SHAPE(in[2].shape.size() == 1 && K > 0 && K % 8 == 0, "[sparse24_linear_prepacked] scales", in[2].shape,
                       " and cols ", K, " (want scales (N) and cols a positive multiple of 8)");
    const int64_t N = in[2].shape[0];
    SINTER_CHECK_DTYPE(vt == DType::f32 || vt == DType::bf16 || vt == DType::i8,
                       "[sparse24_linear_prepacked] values must be f32, bf16 or i8, got ", vt);
    const int64_t want = sparse::prepacked_bytes(vt, N, K);
    SINTER_CHECK_SHAPE(in[1].dtype == DType::u8 && in[1].shape == Shape{want}, "[sparse24_linear_prepacked] packed ", in[1].dtype,
                       in[1].shape, " is not a prepacked (", N, ", ", K, ") weight of ", vt, " values (want u8 (", want, "))");
    SINTER_CHECK_DTYPE(is_floating(in[2].dtype), "[sparse24_linear_prepacked] scales must be floating, got ", in[2].dtype);
    const Shape& x = in[0].shape;
    SINTER_CHECK_SHAPE(!x.empty() && x.back() == K, "[sparse24_linear_prepacked] x", x, " does not match the 2:4 weight (", N, ", ",
                       K, ") (want x (..., K))");
    SINTER_CHECK_DTYPE(in[0].dtype == DType::f32 || in[0].dtype == DType::bf16, "[sparse24_linear_prepacked] x must be f32 or bf16, got ",
                       in[0].dtype);
    if (in.size() == 4) {
      SINTER_CHECK_SHAPE(in[3].shape == Shape{N}, "[sparse24_linear_prepacked] bias", in[3].shape, " does not match the weight's ", N,
                         " rows");
      SINTER_CHECK_DTYPE(in[3].dtype == in[0].dtype, "[sparse24_linear_prepacked] bias dtype ", in[3].dtype, " differs from x's ",
                         in[0].dtype);
    }
    sparse::parse_activation(a.has("activation") ? a.str("activation") : "none", "sparse24_linear_prepacked");
    Shape out = x;
    out.back() = N;
    return std::vector<TensorMeta>{{out, in[0].dtype, in[0].device}};
  };
  lp.cpu = [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
    const int64_t N = in[2].size(0), K = a.i("cols"), M = in[0].numel() / K;
    const sparse::Act act = sparse::parse_activation(a.has("activation") ? a.str("activation") : "none", "sparse24_linear_prepacked");
    Tensor packed = contiguous_as(in[1], DType::u8), scales = contiguous_as(in[2], DType::f32);
    Tensor b = in.size() == 4 ? contiguous_as(in[3], DType::f32) : Tensor();
    Tensor y = out[0].dtype() == DType::f32 ? out[0] : Tensor::empty(out[0].shape(), DType::f32);
#if defined(SINTER_TILES16) && defined(__AVX512BF16__)
    if (in[0].dtype() == DType::bf16 && a.dtype("values") == DType::bf16) {  // vdpbf16ps on the layout's pairs
      Tensor xb = contiguous_as(in[0], DType::bf16);
      sparse::tiles16_linear_bf16(reinterpret_cast<const uint16_t*>(xb.data_ptr()), M, K, nullptr, nullptr, packed.data<uint8_t>(),
                                  scales.data<float>(), b.defined() ? b.data<float>() : nullptr, act, y.data<float>(), N);
      if (out[0].dtype() != DType::f32) out[0].copy_(y);
      return;
    }
#endif
    Tensor x = contiguous_as(in[0], DType::f32);
    sparse::linear_prepacked_f32(x.data<float>(), M, K, packed.data<uint8_t>(), a.dtype("values"), scales.data<float>(),
                                 b.defined() ? b.data<float>() : nullptr, act, y.data<float>(), N);
    if (out[0].dtype() != DType::f32) out[0].copy_(y);
  };
  add_op(std::move(lp));

  OpDef td;
  td.name = "sparse24_to_dense";  // values, meta, scales -> (N, K)
  td.num_inputs = 3;
  td.infer = [](std::span<const TensorMeta> in, const Attrs&) {
    const auto [N, K] = check_weight("sparse24_to_dense", in[0], in[1], in[2]);
    return std::vector<TensorMeta>{{{N, K}, dense_dtype(in[0].dtype), in[0].device}};
  };
  td.cpu = [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
    const int64_t N = in[0].size(0), K = in[0].size(1) * 2;
    Tensor values = contiguous_as(in[0], in[0].dtype()), meta = contiguous_as(in[1], DType::u8), scales = contiguous_as(in[2], DType::f32);
    if (out[0].dtype() == DType::f64) {
      sparse::to_dense<double>(values.data_ptr(), values.dtype(), meta.data<uint8_t>(), scales.data<float>(), N, K, out[0].data<double>());
      return;
    }
    Tensor d = out[0].dtype() == DType::f32 ? out[0] : Tensor::empty({N, K}, DType::f32);
    sparse::to_dense<float>(values.data_ptr(), values.dtype(), meta.data<uint8_t>(), scales.data<float>(), N, K, d.data<float>());
    if (out[0].dtype() != DType::f32) out[0].copy_(d);
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
  ga.cpu = [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
    const int64_t N = in[0].size(0), K = in[0].size(1);
    Tensor meta = contiguous_as(in[1], DType::u8);
    if (in[0].dtype() == DType::f64)
      sparse::gather_kept<double>(contiguous_as(in[0], DType::f64).data<double>(), meta.data<uint8_t>(), N, K, out[0].data<double>());
    else
      sparse::gather_kept<float>(contiguous_as(in[0], DType::f32).data<float>(), meta.data<uint8_t>(), N, K, out[0].data<float>());
  };
  ga.backward = [](BackwardCtx& c) {  // the kept entries go back to their places, zeros elsewhere
    static const OpDef& to_dense = get_op("sparse24_to_dense");
    const int64_t N = c.inputs[0].size(0);
    std::vector<Tensor> out(2);
    if (c.needs_grad[0]) out[0] = call1(to_dense, {c.grads[0], c.inputs[1], ones({N}, DType::f32)});
    return out;
  };
  add_op(std::move(ga));
}

}  // namespace detail

int64_t SemiStructuredSparse::nbytes() const {
  return values.numel() * values.element_size() + meta.numel() + (scales.defined() ? scales.numel() * scales.element_size() : 0);
}

void SemiStructuredSparse::prepack() {
  SINTER_CHECK_SHAPE(values.defined() && meta.defined() && values.dim() == 2, "[prepack] needs values (N, K/2) and meta (N, K/8)",
                     values.defined() ? "; got values" : "; got no values", values.defined() ? values.shape() : Shape{});
  SINTER_CHECK_DTYPE(dtype() == DType::f32 || dtype() == DType::bf16 || dtype() == DType::i8,
                     "[prepack] values must be f32, bf16 or i8, got ", dtype());
  const int64_t N = rows(), K = cols();
  Tensor v = detail::contiguous_as(values.detach(), dtype()), m = detail::contiguous_as(meta, DType::u8);
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
  return packed.defined() && packed_from[0].same(values) && packed_from[1].same(meta);
}

Tensor SemiStructuredSparse::to_dense() const {
  static const OpDef& op = get_op("sparse24_to_dense");
  return call1(op, {values, meta, scales});
}

Tensor mask_2_4(const Tensor& w) {
  SINTER_CHECK_SHAPE(w.dim() >= 1 && w.size(-1) % 4 == 0, "[prune_2_4] the last dim must be a multiple of 4, got ", w.shape());
  SINTER_CHECK_DTYPE(is_floating(w.dtype()), "[prune_2_4] needs a floating tensor, got ", w.dtype());
  Tensor a = detail::contiguous_as(w.detach(), DType::f64);
  Tensor mask = Tensor::empty(w.shape(), DType::boolean);
  const double* p = a.data<double>();
  bool* m = mask.data<bool>();
  for (int64_t g = 0; g < a.numel() / 4; ++g) {  // the two largest |w| of each four (the earlier on ties)
    int keep0 = 0, keep1 = -1;
    for (int i = 1; i < 4; ++i)
      if (std::fabs(p[4 * g + i]) > std::fabs(p[4 * g + keep0])) keep0 = i;
    for (int i = 0; i < 4; ++i)
      if (i != keep0 && (keep1 < 0 || std::fabs(p[4 * g + i]) > std::fabs(p[4 * g + keep1]))) keep1 = i;
    for (int i = 0; i < 4; ++i) m[4 * g + i] = i == keep0 || i == keep1;
  }
  return mask;
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
  Tensor a = detail::contiguous_as(dense.detach(), DType::f64);
  const double* p = a.data<double>();
  std::vector<double> kept(static_cast<size_t>(N * K / 2));
  Tensor meta = Tensor::empty({N, K / 8}, DType::u8);
  uint8_t* mt = meta.data<uint8_t>();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < K / 4; ++g) {
      const double* q = p + n * K + 4 * g;
      int pos[4], nz = 0;
      for (int i = 0; i < 4; ++i)
        if (q[i] != 0.0) pos[nz++] = i;
      if (nz > 2) {
        std::ostringstream vals;
        vals << q[0] << ", " << q[1] << ", " << q[2] << ", " << q[3];
        SINTER_THROW(ShapeError, "[to_sparse_semi_structured] row ", n, ", columns ", 4 * g, "..", 4 * g + 3, " hold ", nz,
                     " nonzeros (", vals.str(), "): not in the 2:4 pattern (prune_2_4 makes it so)");
      }
      bool used[4] = {false, false, false, false};
      for (int i = 0; i < nz; ++i) used[pos[i]] = true;
      for (int i = 0; i < 4 && nz < 2; ++i)  // fewer than two nonzeros: zeros kept at the first free columns
        if (!used[i]) used[i] = true, ++nz;
      for (int i = 0, k = 0; i < 4; ++i)
        if (used[i]) pos[k++] = i;
      kept[size_t(n * K / 2 + 2 * g)] = q[pos[0]];
      kept[size_t(n * K / 2 + 2 * g + 1)] = q[pos[1]];
      const uint8_t nib = uint8_t(pos[0] | (pos[1] << 2));
      uint8_t& byte = mt[n * K / 8 + g / 2];
      byte = g % 2 == 0 ? nib : uint8_t(byte | (nib << 4));
    }
  SemiStructuredSparse s;
  s.meta = meta;
  s.scales = ones({N}, DType::f32);
  if (vt == DType::i8) {  // symmetric per-row scales: the largest |kept| maps to 127
    Tensor v = Tensor::empty({N, K / 2}, DType::i8);
    float* sc = s.scales.data<float>();
    for (int64_t n = 0; n < N; ++n) {
      double mx = 0;
      for (int64_t j = 0; j < K / 2; ++j) mx = std::max(mx, std::fabs(kept[size_t(n * K / 2 + j)]));
      sc[n] = mx > 0 ? float(mx / 127.0) : 1.0f;
      for (int64_t j = 0; j < K / 2; ++j)
        v.data<int8_t>()[n * K / 2 + j] = int8_t(std::lround(std::clamp(kept[size_t(n * K / 2 + j)] / double(sc[n]), -127.0, 127.0)));
    }
    s.values = v;
  } else {
    Tensor v = Tensor::empty({N, K / 2}, DType::f64);
    std::copy(kept.begin(), kept.end(), v.data<double>());
    s.values = v.to(vt);
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

Tensor linear(const Tensor& x, const SemiStructuredSparse& w, const Tensor& b, const std::string& activation) {
  static const OpDef& op = get_op("sparse24_linear");
  sparse::parse_activation(activation);
  SINTER_CHECK(w.defined() && w.meta.defined() && w.scales.defined(), "[sparse24_linear] the 2:4 weight has no ",
               !w.defined() ? "values" : !w.meta.defined() ? "meta" : "scales");
  const bool grads = grad_enabled() && (x.requires_grad() || w.values.requires_grad() || (b.defined() && b.requires_grad()));
  std::vector<Tensor> in{x, w.values, w.meta, w.scales};
  if (b.defined()) in.push_back(b);
  const int64_t K = w.values.dim() == 2 ? w.cols() : 0;  // 0: a malformed weight, which the op's checks name
  const int64_t M = K ? x.numel() / K : 0;
  const bool plain_x = K && x.dim() >= 1 && x.size(-1) == K && (x.dtype() == DType::f32 || x.dtype() == DType::bf16);
  const bool pairs = sparse::pairs_serve(x.dtype(), w.dtype(), M) && sparse::pairs_beat_prepacked(M);  // bf16 pairs beat the tiles there
  if (!grads && plain_x && w.packed_current() && sparse::prepacked_serves(w.dtype(), M) && !pairs) {  // else the op's checks speak
    static const OpDef& pre = get_op("sparse24_linear_prepacked");
    std::vector<Tensor> pin{x, w.packed, w.scales};
    if (b.defined()) pin.push_back(b);
    return call1(pre, pin, {{"activation", activation}, {"cols", K}, {"values", w.dtype()}});
  }
  if (activation == "none" || !grads) return call1(op, in, {{"activation", activation}});
  return activate(call1(op, in, {{"activation", std::string("none")}}), activation);  // differentiable: the activation as its own op
}

}  // namespace sinter

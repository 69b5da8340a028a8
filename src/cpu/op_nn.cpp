// CPU kernels of the neural-network ops (src/ops/nn.cpp): fused row kernels (cpu/nn.cpp) on
// contiguous (rows, D) views.
#include <cmath>

#include "core/dispatch.h"
#include "cpu/cpu.h"
#include "ops/common.h"

namespace sinter::cpu {
namespace {

using detail::raw_reshape_contiguous;

Tensor rows2d(const Tensor& x) {
  const int64_t D = x.dim() ? x.size(-1) : 1;
  Tensor c = contiguous_as(x, x.dtype());
  return raw_reshape_contiguous(c, Shape{D ? x.numel() / D : 0, D});
}

void check_targets(const char* op, const Tensor& t, int64_t classes, int64_t ignore) {
  const int64_t* pt = t.data<int64_t>();
  for (int64_t i = 0; i < t.numel(); ++i)
    SINTER_CHECK_INDEX(pt[i] == ignore || (pt[i] >= 0 && pt[i] < classes), "[", op, "] target ", pt[i], " at position ", i,
                       " out of range for ", classes, " classes");
}

void embedding_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
  Tensor idx = contiguous_as(in[1], DType::i64);
  check_index_range("embedding", idx, in[0].size(0));
  embedding_rows(contiguous_as(in[0], in[0].dtype()), idx, out[0]);
}

void embedding_backward_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
  Tensor idx = contiguous_as(in[1], DType::i64);
  check_index_range("embedding_backward", idx, out[0].size(0));
  embedding_backward_rows(contiguous_as(in[0], in[0].dtype()), idx, out[0]);
}

void layer_norm_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  if (in[0].numel() == 0) return;
  Tensor x2 = rows2d(in[0]);
  layer_norm_rows(x2, contiguous_as(in[1], in[1].dtype()), contiguous_as(in[2], in[2].dtype()), a.f("eps"),
                  raw_reshape_contiguous(out[0], x2.shape()));
}

void rms_norm_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  if (in[0].numel() == 0) return;
  Tensor x2 = rows2d(in[0]);
  rms_norm_rows(x2, contiguous_as(in[1], in[1].dtype()), a.f("eps"), raw_reshape_contiguous(out[0], x2.shape()));
}

template <bool layer> void norm_backward_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  Tensor x2 = rows2d(in[1]), g2 = rows2d(in[0]), w = contiguous_as(in[2], in[2].dtype());
  Tensor dx2 = raw_reshape_contiguous(out[0], x2.shape());
  norm_backward_rows(layer, g2, x2, w, a.f("eps"), dx2, out[1], layer ? out[2] : Tensor());
}

void rotary_embedding_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
  const Tensor& x = in[0];
  if (x.numel() == 0) return;
  const int64_t T = x.size(-2), D = x.size(-1);
  Tensor xc = contiguous_as(x, x.dtype());
  const Shape s3{x.numel() / (T * D), T, D};
  rotary_rows(raw_reshape_contiguous(xc, s3), contiguous_as(in[1], x.dtype()), contiguous_as(in[2], x.dtype()),
              raw_reshape_contiguous(out[0], s3));
}

void cross_entropy_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const int64_t C = in[0].size(-1), ignore = a.i("ignore_index");
  Tensor t = contiguous_as(in[1], DType::i64);
  check_targets("cross_entropy", t, C, ignore);
  cross_entropy_rows(rows2d(in[0]), t, ignore, a.f("label_smoothing"), out[0]);
}

void cross_entropy_backward_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const int64_t C = in[0].size(-1), ignore = a.i("ignore_index");
  Tensor t = contiguous_as(in[1], DType::i64);
  check_targets("cross_entropy_backward", t, C, ignore);
  Tensor x2 = rows2d(in[0]);
  cross_entropy_backward_rows(x2, t, ignore, a.f("label_smoothing"), scalar_value(in[2]), raw_reshape_contiguous(out[0], x2.shape()));
}

void dropout_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  dropout(contiguous_as(in[0], in[0].dtype()), a.f("p"), uint64_t(a.i("seed")), uint64_t(a.i("counter")), out[0]);
}

// cos / sin of t * theta^(-2i / dim), computed in double.
void rope_cos_sin_kernel(std::span<const Tensor>, std::span<Tensor> out, const Attrs& a) {
  SINTER_KERNEL_ENTRY();
  const int64_t T = a.i("seq_len"), dim = a.i("dim"), H = dim / 2;
  const double theta = a.f("theta");
  const bool want_sin = a.b("sin");
  float* p = out[0].data<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < H; ++i) {
      const double ang = double(t) * std::pow(theta, -2.0 * double(i) / double(dim));
      p[t * H + i] = float(want_sin ? std::sin(ang) : std::cos(ang));
    }
}

}  // namespace

void register_nn_kernels() {
  detail::add_kernels(DeviceType::cpu, {{"embedding", embedding_kernel},
                                        {"embedding_backward", embedding_backward_kernel},
                                        {"layer_norm", layer_norm_kernel}, {"rms_norm", rms_norm_kernel},
                                        {"layer_norm_backward", norm_backward_kernel<true>},
                                        {"rms_norm_backward", norm_backward_kernel<false>},
                                        {"rotary_embedding", rotary_embedding_kernel},
                                        {"cross_entropy", cross_entropy_kernel},
                                        {"cross_entropy_backward", cross_entropy_backward_kernel},
                                        {"dropout", dropout_kernel}, {"rope_cos_sin", rope_cos_sin_kernel}});
}

}  // namespace sinter::cpu

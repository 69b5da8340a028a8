// The CUDA kernel of cat (src/ops/shape.cpp): each input copied into its slice of the output
// (copy_convert). The ops at a tensor's position are positions.cu's.
#include <span>

#include "core/view.h"
#include "cuda/cuda.h"
#include "ops/common.h"
#include "sinter/op.h"

namespace sinter::cuda {
namespace {

using detail::raw_slice;

void cat_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const int64_t dim = detail::wrap_dim("cat", a.i("dim"), in[0].dim());
  int64_t at = 0;
  for (const Tensor& t : in) {
    const int64_t n = t.size(dim);
    if (t.numel() > 0) copy_convert("cat", t, raw_slice(out[0], dim, at, at + n));
    at += n;
  }
}

}  // namespace

void register_shape_kernels() {
  constexpr DeviceType kCuda = DeviceType::cuda;
  register_kernel("cat", kCuda, cat_kernel);
}

}  // namespace sinter::cuda

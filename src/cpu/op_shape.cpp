// CPU kernels of copy and cat (src/ops/shape.cpp); the view ops need none.
#include "cpu/cpu.h"
#include "ops/common.h"

namespace sinter::cpu {
namespace {

void copy_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) { copy(in[0], out[0]); }

void cat_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const int64_t dim = detail::wrap_dim("cat", a.i("dim"), in[0].dim());
  int64_t at = 0;
  for (const Tensor& t : in) {
    const int64_t n = t.size(dim);
    copy(t, detail::raw_slice(out[0], dim, at, at + n));
    at += n;
  }
}

}  // namespace

void register_shape_kernels() {
  detail::add_kernel("copy", DeviceType::cpu, copy_kernel);
  detail::add_kernel("cat", DeviceType::cpu, cat_kernel);
}

}  // namespace sinter::cpu

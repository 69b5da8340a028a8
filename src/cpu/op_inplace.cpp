// CPU kernels of the in-place ops (src/ops/inplace.cpp): out[0] is the target itself.
#include "cpu/cpu.h"
#include "ops/common.h"

namespace sinter::cpu {
namespace {

template <BinaryOp k> void inplace_binary_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
  const Tensor& self = out[0];
  binary(k, self, in[1].dtype() == self.dtype() ? in[1] : contiguous_as(in[1], self.dtype()), self);
}

void fill_kernel(std::span<const Tensor>, std::span<Tensor> out, const Attrs& a) { fill(out[0], a.f("value")); }

void copy_inplace_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
  // Copying from an overlapping view of the same storage goes through a temporary.
  Tensor src = in[1];
  if (src.storage() == out[0].storage()) {
    Tensor tmp = Tensor::empty(src.shape(), src.dtype(), src.device());
    copy(src, tmp);
    src = tmp;
  }
  copy(src, out[0]);
}

}  // namespace

void register_inplace_kernels() {
  detail::add_kernels(DeviceType::cpu, {{"add_", inplace_binary_kernel<BinaryOp::Add>},
                                        {"sub_", inplace_binary_kernel<BinaryOp::Sub>},
                                        {"mul_", inplace_binary_kernel<BinaryOp::Mul>},
                                        {"div_", inplace_binary_kernel<BinaryOp::Div>}, {"fill_", fill_kernel},
                                        {"copy_", copy_inplace_kernel}});
}

}  // namespace sinter::cpu

// CPU kernels of the `item` and `to_device` ops (src/ops/tensor_data.cpp).
#include "cpu/cpu.h"
#include "ops/common.h"

namespace sinter::cpu {
namespace {
void item_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) { copy(in[0], out[0]); }
}  // namespace

// to_device between host-memory devices (the CPU to itself, or to a device whose memory the host
// reads): a contiguous copy. Copies to and from CUDA run the CUDA backend's kernel.
void to_device_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) { copy(in[0], out[0]); }

void register_data_kernels() {
  detail::add_kernel("item", DeviceType::cpu, item_kernel);
  detail::add_kernel("to_device", DeviceType::cpu, to_device_kernel);
}

}  // namespace sinter::cpu

// CPU kernels of the `item` and `to_device` ops (src/ops/tensor_data.cpp).
#include "cpu/cpu.h"
#include "ops/common.h"

namespace sinter::cpu {
namespace {
// Both are a contiguous copy on the host: item's 0-d copy, and to_device between host-memory
// devices (copies to and from CUDA run the CUDA backend's kernel).
void copy_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) { copy(in[0], out[0]); }
}  // namespace

void register_data_kernels() {
  detail::add_kernel("item", DeviceType::cpu, copy_kernel);
  detail::add_kernel("to_device", DeviceType::cpu, copy_kernel);
}

}  // namespace sinter::cpu

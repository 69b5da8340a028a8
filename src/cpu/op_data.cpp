// CPU kernel of the `item` op (src/ops/tensor_data.cpp).
#include "cpu/cpu.h"
#include "ops/common.h"

namespace sinter::cpu {
namespace {
void item_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) { copy(in[0], out[0]); }
}  // namespace

void register_data_kernels() { detail::add_kernel("item", DeviceType::cpu, item_kernel); }

}  // namespace sinter::cpu

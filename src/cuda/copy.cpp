// Copies between the CPU and CUDA devices: the CUDA kernels of to_device and item. Every copy goes on the
// device's stream; a copy to the CPU waits for it (the host reads the bytes next), one from the CPU
// returns once the driver has staged the source (CUDA's rule for pageable memory).
#include <span>

#include "cuda/cuda.h"
#include "sinter/op.h"

namespace sinter::cuda {
namespace {

void to_device_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
  const Tensor& y = out[0];  // contiguous, x's dtype, on the target device
  const Tensor x = in[0].contiguous();
  const size_t bytes = size_t(y.numel() * dtype_size(y.dtype()));
  if (bytes == 0) return;
  const Device from = x.device(), to = y.device();
  if (from.type == DeviceType::cpu) {
    SINTER_CUDA_CHECK(cudaMemcpyAsync(y.data_ptr(), x.data_ptr(), bytes, cudaMemcpyHostToDevice, stream(to.index)));
  } else if (to.type == DeviceType::cpu) {
    cudaStream_t s = stream(from.index);
    SINTER_CUDA_CHECK(cudaMemcpyAsync(y.data_ptr(), x.data_ptr(), bytes, cudaMemcpyDeviceToHost, s));
    SINTER_CUDA_CHECK(cudaStreamSynchronize(s));
  } else {  // device to device: ordered after the source's work, finished before the target's next
    cudaStream_t s = stream(from.index);
    SINTER_CUDA_CHECK(cudaMemcpyPeerAsync(y.data_ptr(), to.index, x.data_ptr(), from.index, bytes, s));
    if (from.index != to.index) SINTER_CUDA_CHECK(cudaStreamSynchronize(s));
  }
}

// item: the one element, as a 0-d tensor on the device (the host reads it through to_device).
void item_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
  SINTER_CUDA_CHECK(cudaMemcpyAsync(out[0].data_ptr(), in[0].data_ptr(), size_t(dtype_size(in[0].dtype())), cudaMemcpyDeviceToDevice,
                                    stream(out[0].device().index)));
}

}  // namespace

void register_copy_kernels() {
  register_kernel("to_device", DeviceType::cuda, to_device_kernel);
  register_kernel("item", DeviceType::cuda, item_kernel);
}

}  // namespace sinter::cuda

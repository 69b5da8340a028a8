// Copies between the CPU and CUDA devices: the CUDA kernels of to_device and item, and host bytes
// sent to a device without waiting (copy_from_host). Every copy goes on the device's stream; a copy
// to the CPU waits for it (the host reads the bytes next). A copy from pageable host memory may
// make the driver wait for the stream, so host bytes go as a kernel argument (up to 8 bytes: a
// scalar) or through pinned staging blocks, each reused once the event after its copy has passed.
#include <bit>
#include <cstring>
#include <mutex>
#include <span>
#include <vector>

#include "cuda/cuda.h"
#include "cuda/launch.cuh"
#include "sinter/op.h"

namespace sinter::cuda {
namespace {

constexpr size_t kStagedBytes = size_t(4) << 20;  // larger copies are one-off loads

__global__ void put_bytes_k(unsigned char* dst, uint64_t bits, int bytes) {
  for (int i = 0; i < bytes; ++i) dst[i] = (unsigned char)(bits >> (8 * i));
}

struct Staging {
  void* host = nullptr;
  size_t bytes = 0;
  cudaEvent_t copied = nullptr;  // recorded after the copy that read it
};

class StagingPool {
 public:
  // A pinned block of at least `bytes` whose last copy is done (or a new one).
  Staging take(size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < free_.size(); ++i) {
      if (free_[i].bytes < bytes) continue;
      const cudaError_t e = cudaEventQuery(free_[i].copied);
      if (e == cudaErrorNotReady) {
        (void)cudaGetLastError();  // not an error: the copy is still queued
        continue;
      }
      SINTER_CUDA_CHECK(e);
      const Staging s = free_[i];
      free_.erase(free_.begin() + std::ptrdiff_t(i));
      return s;
    }
    Staging s;
    s.bytes = std::max<size_t>(size_t(1) << 16, std::bit_ceil(bytes));
    SINTER_CUDA_CHECK(cudaHostAlloc(&s.host, s.bytes, cudaHostAllocPortable));
    SINTER_CUDA_CHECK(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming));
    return s;
  }
  void give_back(const Staging& s) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(s);
  }

 private:
  std::mutex mu_;
  std::vector<Staging> free_;  // kept until exit
};

StagingPool& staging() {
  static auto* pool = new StagingPool;
  return *pool;
}

void to_device_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
  const Tensor& y = out[0];  // contiguous, x's dtype, on the target device
  const Tensor x = in[0].contiguous();
  const size_t bytes = size_t(y.numel() * dtype_size(y.dtype()));
  if (bytes == 0) return;
  const Device from = x.device(), to = y.device();
  if (from.type == DeviceType::cpu) {
    copy_from_host(y.data_ptr(), x.data_ptr(), bytes, to.index);
  } else if (to.type == DeviceType::cpu) {
    SINTER_CUDA_CHECK(cudaMemcpyAsync(y.data_ptr(), x.data_ptr(), bytes, cudaMemcpyDeviceToHost, stream(from.index)));
    wait(from.index);
  } else {  // device to device: ordered after the source's work, finished before the target's next
    SINTER_CUDA_CHECK(cudaMemcpyPeerAsync(y.data_ptr(), to.index, x.data_ptr(), from.index, bytes, stream(from.index)));
    if (from.index != to.index) wait(from.index);
  }
}

// item: the one element, as a 0-d tensor on the device (the host reads it through to_device).
void item_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
  SINTER_CUDA_CHECK(cudaMemcpyAsync(out[0].data_ptr(), in[0].data_ptr(), size_t(dtype_size(in[0].dtype())), cudaMemcpyDeviceToDevice,
                                    stream(out[0].device().index)));
}

}  // namespace

void copy_from_host(void* dst, const void* src, size_t bytes, int device) {
  cudaStream_t s = stream(device);
  if (bytes <= sizeof(uint64_t)) {
    uint64_t bits = 0;
    std::memcpy(&bits, src, bytes);
    launch_kernel("to_device", put_bytes_k, 1, 1, 0, s, static_cast<unsigned char*>(dst), bits, int(bytes));
    return;
  }
  if (bytes > kStagedBytes) {  // a load of weights, not a step's input: the driver stages it (and may wait)
    SINTER_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s));
    return;
  }
  SINTER_CHECK(!capturing(device), "[cuda] copying ", bytes, " host bytes to cuda:", device, " while capturing a graph: each replay ",
               "would copy the staging memory again, by then another copy's; copy them before capturing");
  const Staging block = staging().take(bytes);
  std::memcpy(block.host, src, bytes);
  SINTER_CUDA_CHECK(cudaMemcpyAsync(dst, block.host, bytes, cudaMemcpyHostToDevice, s));
  SINTER_CUDA_CHECK(cudaEventRecord(block.copied, s));
  staging().give_back(block);
}

void register_copy_kernels() {
  register_kernel("to_device", DeviceType::cuda, to_device_kernel);
  register_kernel("item", DeviceType::cuda, item_kernel);
}

}  // namespace sinter::cuda

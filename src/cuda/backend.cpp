// sinter_cuda_attach: what libsinter calls after loading this library (src/core/cuda_loader.cpp).
// It checks for a device this build can run on, then registers the allocator and the kernels.
// Per device: a stream (created on first use) and a caching allocator, both kept until exit.
#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/cuda_hooks.h"
#include "cuda/caching_allocator.h"
#include "cuda/cuda.h"

namespace sinter::cuda {
namespace {

struct DeviceState {
  std::once_flag stream_once;
  cudaStream_t stream = nullptr;
  std::unique_ptr<CachingAllocator> memory;
  DeviceFault* fault_host = nullptr;  // mapped pinned memory: the host's view
  DeviceFault* fault_device = nullptr;
};
std::vector<DeviceState*> g_devices;  // never destroyed: tensors freed at exit still find them
std::atomic<int64_t> g_waits{0};      // host synchronizations so far (hooks: host_synchronizations)

DeviceState& device_state(int device) {
  SINTER_CHECK(device >= 0 && device < int(g_devices.size()), "[cuda] no device cuda:", device, " (", g_devices.size(), " found)");
  return *g_devices[size_t(device)];
}

Provider driver_memory(int device) {
  return {
      [device](int64_t bytes) -> void* {
        void* p = nullptr;
        SINTER_CUDA_CHECK(cudaSetDevice(device));
        // A graph's capture may need a block (its pool): cudaMalloc is not recorded, and is allowed in relaxed mode.
        cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
        SINTER_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
        const cudaError_t e = cudaMalloc(&p, size_t(bytes));
        (void)cudaThreadExchangeStreamCaptureMode(&mode);
        if (e == cudaErrorMemoryAllocation) {
          (void)cudaGetLastError();  // clear it: the process goes on
          return nullptr;
        }
        SINTER_CUDA_CHECK(e);
        return p;
      },
      [device](void* p) {
        (void)cudaSetDevice(device);
        (void)cudaFree(p);
      },
      [device]() -> int64_t {
        size_t free = 0, total = 0;
        if (cudaSetDevice(device) != cudaSuccess || cudaMemGetInfo(&free, &total) != cudaSuccess) return -1;
        return int64_t(free);
      },
  };
}

// Why this process cannot use CUDA, or an empty string.
std::string find_devices() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess)
    return std::string("cudaGetDeviceCount failed: ") + cudaGetErrorString(e) + " (error " + std::to_string(int(e)) + ")";
  if (count == 0) return "the CUDA driver sees no device";
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) return "cudaGetDeviceProperties failed for cuda:" + std::to_string(i);
    if (p.major != 9 || p.minor != 0)
      return "cuda:" + std::to_string(i) + " is " + p.name + " (compute capability " + std::to_string(p.major) + "." +
             std::to_string(p.minor) + "); this libsinter_cuda is built for sm_90a (Hopper)";
  }
  for (int i = 0; i < count; ++i) {
    auto* d = new DeviceState;
    d->memory = std::make_unique<CachingAllocator>(driver_memory(i), "cuda:" + std::to_string(i));
    SINTER_CUDA_CHECK(cudaSetDevice(i));
    SINTER_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&d->fault_host), sizeof(DeviceFault), cudaHostAllocMapped));
    *d->fault_host = DeviceFault{};
    SINTER_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&d->fault_device), d->fault_host, 0));
    g_devices.push_back(d);
  }
  return {};
}

void attach_hooks(detail::CudaHooks* hooks) {
  hooks->device_count = int(g_devices.size());
#ifdef SINTER_CUDA_EMULATED
  hooks->emulated = true;
#endif
  hooks->synchronize = [](int device) { wait(device); };
  hooks->host_synchronizations = [] { return g_waits.load(); };
  hooks->device_name = [](int device) -> const char* {
    static std::vector<std::string> names(g_devices.size());
    std::string& n = names.at(size_t(device));
    if (n.empty()) {
      cudaDeviceProp p{};
      int driver = 0;
      SINTER_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
      SINTER_CUDA_CHECK(cudaDriverGetVersion(&driver));
      n = std::string(p.name) + ", " + std::to_string(p.totalGlobalMem >> 30) + " GiB, " + std::to_string(p.multiProcessorCount) +
          " SMs, CUDA driver " + std::to_string(driver / 1000) + "." + std::to_string(driver % 1000 / 10);
    }
    return n.c_str();
  };
  hooks->copy_bytes = [](void* dst, const void* src, int64_t bytes, int device) {
    SINTER_CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyDeviceToDevice, stream(device)));
  };
  hooks->memory_stats = [](int device, int64_t* v) {
    const AllocatorStats s = device_state(device).memory->stats();
    v[0] = s.live, v[1] = s.cached, v[2] = s.peak;
  };
  hooks->graph_capture = graph_capture;
  hooks->graph_replay = graph_replay;
  hooks->graph_free = graph_free;
  hooks->empty_cache = [] {
    for (size_t i = 0; i < g_devices.size(); ++i) {
      (void)cudaStreamSynchronize(stream(int(i)));
      g_devices[i]->memory->empty_cache();
    }
  };
}

}  // namespace

cudaStream_t stream(int device) {
  DeviceState& d = device_state(device);
  SINTER_CUDA_CHECK(cudaSetDevice(device));
  std::call_once(d.stream_once, [&] { SINTER_CUDA_CHECK(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking)); });
  return d.stream;
}

DeviceFault* device_fault(int device) { return device_state(device).fault_device; }

CachingAllocator& memory(int device) { return *device_state(device).memory; }

void wait(int device) {
  SINTER_CHECK(!capturing(device), "[cuda] a host read of cuda:", device, "'s data (a wait for the device) while capturing a graph there: ",
               "a graph holds device work only; read results after replay()");
  SINTER_CUDA_CHECK(cudaStreamSynchronize(stream(device)));
  ++g_waits;
  volatile DeviceFault* f = device_state(device).fault_host;
  if (!f->set) return;
  const DeviceFault seen{1, f->value, f->position, f->size, f->length, f->op, f->what};
  f->set = 0;  // reported once; the device goes on
  const std::string where = " (found on cuda:" + std::to_string(device) + " by the kernel, raised at this host synchronization)";
  if (seen.length < 0) SINTER_THROW(ValueError, "[", seen.op, "] row ", seen.value, " ", seen.what, where);
  if (seen.length > 0)
    SINTER_THROW(IndexError, "[", seen.op, "] ", seen.what, " ", seen.value, "..", seen.value + seen.length, " out of range for size ",
                 seen.size, where);
  SINTER_THROW(IndexError, "[", seen.op, "] ", seen.what, " ", seen.value, " at position ", seen.position, " out of range for size ",
               seen.size, where);
}

void check_launch(const char* op) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) SINTER_THROW(Error, "[", op, "] CUDA kernel launch failed: ", cudaGetErrorString(e), " (error ", int(e), ")");
}

}  // namespace sinter::cuda

extern "C" __attribute__((visibility("default"))) const char* sinter_cuda_attach(sinter::detail::CudaHooks* hooks, int abi) {
  using namespace sinter;
  static std::string reason;
  try {
    if (abi != detail::kCudaHooksAbi) return (reason = "libsinter_cuda speaks hooks ABI " + std::to_string(detail::kCudaHooksAbi) +
                                                       ", libsinter " + std::to_string(abi) + ": rebuild them together").c_str();
    reason = cuda::find_devices();
    if (!reason.empty()) return reason.c_str();
    // SINTER_CUDA_POISON=1 (the tests): every block starts as NaN bytes, so an element a kernel
    // leaves unwritten shows.
    static const bool poison = std::getenv("SINTER_CUDA_POISON") && std::string(std::getenv("SINTER_CUDA_POISON")) == "1";
    register_allocator(DeviceType::cuda, {[](int64_t n, int device) {
                                            cudaStream_t s = cuda::stream(device);
                                            void* p = cuda::device_state(device).memory->allocate(n, uintptr_t(s));
                                            if (poison) SINTER_CUDA_CHECK(cudaMemsetAsync(p, 0xFF, size_t(n), s));
#ifdef SINTER_CUDA_EMULATED
                                            cuda::emulator::guard_tail(p, n, cuda::CachingAllocator::size_class(n));
#endif
                                            return p;
                                          },
                                          [](void* p, [[maybe_unused]] int64_t n, int device) {
#ifdef SINTER_CUDA_EMULATED
                                            cuda::emulator::unguard(p, cuda::CachingAllocator::size_class(n));
#endif
                                            cuda::device_state(device).memory->release(p);
                                          }});
    cuda::register_elementwise_kernels();
    cuda::register_copy_kernels();
    cuda::register_factory_kernels();
    cuda::register_reduce_kernels();
    cuda::register_softmax_kernels();
    cuda::register_linalg_kernels();
    cuda::register_nn_kernels();
    cuda::register_update_kernels();
    cuda::register_index_kernels();
    cuda::register_topk_kernel();
    cuda::register_shape_kernels();
    cuda::register_position_kernels();
    cuda::register_attention_kernels();
    cuda::register_sparse24_kernels();
    cuda::attach_hooks(hooks);
    return nullptr;
  } catch (const std::exception& e) {
    return (reason = e.what()).c_str();
  }
}

#pragma once
// What libsinter asks of the CUDA backend library (libsinter_cuda, src/cuda/backend.cpp) it loads:
// the backend's sinter_cuda_attach fills in these hooks and registers its allocator and kernels,
// or returns why it cannot (no driver, no device, a device it was not built for).
#include <cstdint>
#include <functional>

namespace sinter::detail {

constexpr int kCudaHooksAbi = 4;  // bumped when CudaHooks changes

struct CudaHooks {
  int device_count = 0;
  bool emulated = false;  // the CUDA emulator (src/cuda/emulator/): kernels on the CPU, no vendor libraries
  void (*synchronize)(int device) = nullptr;
  void (*memory_stats)(int device, int64_t* live_cached_peak) = nullptr;
  void (*empty_cache)() = nullptr;
  int64_t (*host_synchronizations)() = nullptr;
  void (*copy_bytes)(void* dst, const void* src, int64_t bytes, int device) = nullptr;
  const char* (*device_name)(int device) = nullptr;  // name, memory, SMs and driver, for reports
  void* (*graph_capture)(int device, const std::function<void()>& fn) = nullptr;  // cuda::Graph (src/cuda/graph.cpp)
  void (*graph_replay)(void* graph) = nullptr;
  void (*graph_free)(void* graph) = nullptr;
};

// Returns null on success, else the reason (static storage).
using CudaAttachFn = const char* (*)(CudaHooks* hooks, int abi);

void require_cuda();  // throws "[cuda] no CUDA device: <reason>" unless the backend is attached

}  // namespace sinter::detail

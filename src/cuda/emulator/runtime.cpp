// The emulator's CUDA runtime (src/cuda/emulator/include/cuda_runtime.h): one device, "cuda:0",
// whose memory is host memory under a budget (SINTER_CUDA_EMULATED_MEMORY bytes, default 4 GiB),
// so that an allocation past it fails as on a GPU. Streams and events exist as handles: everything
// runs when called, so each stream is always done; an event remembers the host clock when recorded.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "cuda/emulator/state.h"

namespace sinter::cuda::emulator {
namespace {

struct Memory {
  std::mutex mu;
  std::map<void*, size_t> blocks;
  size_t used = 0;
};
Memory& memory() {
  static Memory* m = new Memory;  // never destroyed: tensors freed at exit still find it
  return *m;
}

size_t budget() {
  static const size_t b = [] {
    const char* v = std::getenv("SINTER_CUDA_EMULATED_MEMORY");
    return v ? size_t(std::strtoull(v, nullptr, 10)) : size_t(4) << 30;
  }();
  return b;
}

thread_local cudaError_t t_error = cudaSuccess;  // pending, for cudaGetLastError
thread_local std::string t_detail;
thread_local cudaError_t t_returned = cudaSuccess;  // the last cudaGetLastError returned, for its string
thread_local std::string t_returned_detail;

struct Event {
  std::chrono::steady_clock::time_point at;
};

}  // namespace

void set_error(cudaError_t e, std::string detail) {
  if (t_error != cudaSuccess) return;  // the first error stands until it is read
  t_error = e;
  t_detail = std::move(detail);
}

}  // namespace sinter::cuda::emulator

using namespace sinter::cuda::emulator;

const char* cudaGetErrorString(cudaError_t e) {
  if (e == t_error && !t_detail.empty()) return t_detail.c_str();
  if (e == t_returned && !t_returned_detail.empty()) return t_returned_detail.c_str();
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
  }
  return "unknown error";
}

cudaError_t cudaGetLastError() {
  t_returned = t_error, t_returned_detail = std::move(t_detail);
  t_error = cudaSuccess, t_detail.clear();
  return t_returned;
}

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
  if (device != 0) return cudaErrorInvalidValue;
  *p = cudaDeviceProp{};
  std::strcpy(p->name, "Sinter CUDA emulator (the CPU)");
  p->totalGlobalMem = budget();
  p->sharedMemPerBlock = 48 << 10, p->sharedMemPerBlockOptin = 227 << 10;
  p->major = 9, p->minor = 0, p->multiProcessorCount = 1, p->warpSize = 32, p->maxThreadsPerBlock = 1024;
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* version) {
  *version = 13000;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidValue; }

cudaError_t cudaMalloc(void** p, size_t bytes) {
  Memory& m = memory();
  std::lock_guard lock(m.mu);
  if (bytes > budget() - m.used) {
    set_error(cudaErrorMemoryAllocation, "");
    return cudaErrorMemoryAllocation;
  }
  *p = std::aligned_alloc(256, (std::max<size_t>(bytes, 1) + 255) / 256 * 256);
  if (!*p) {
    set_error(cudaErrorMemoryAllocation, "");
    return cudaErrorMemoryAllocation;
  }
  m.blocks[*p] = bytes;
  m.used += bytes;
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  Memory& m = memory();
  std::lock_guard lock(m.mu);
  const auto it = m.blocks.find(p);
  if (it == m.blocks.end()) return cudaErrorInvalidValue;
  m.used -= it->second;
  m.blocks.erase(it);
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  Memory& m = memory();
  std::lock_guard lock(m.mu);
  *free = budget() - m.used, *total = budget();
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned) {
  *p = std::aligned_alloc(256, (std::max<size_t>(bytes, 1) + 255) / 256 * 256);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaFreeHost(void* p) {
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaHostGetDevicePointer(void** device, void* host, unsigned) {
  *device = host;
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t) {
  if (bytes) std::memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpyPeerAsync(void* dst, int, const void* src, int, size_t bytes, cudaStream_t) {
  return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice);
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) {
  if (bytes) std::memset(p, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  static char streams[16];
  static int next = 0;
  *s = reinterpret_cast<cudaStream_t>(&streams[next++ % 16]);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }

cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = reinterpret_cast<cudaEvent_t>(new Event{std::chrono::steady_clock::now()});
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) { return cudaEventCreate(e); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<Event*>(e);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
  reinterpret_cast<Event*>(e)->at = std::chrono::steady_clock::now();
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; }

cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  *ms = std::chrono::duration<float, std::milli>(reinterpret_cast<Event*>(end)->at - reinterpret_cast<Event*>(start)->at).count();
  return cudaSuccess;
}

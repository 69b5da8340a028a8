// The emulator's CUDA runtime (src/cuda/emulator/include/cuda_runtime.h): one device, "cuda:0",
// whose memory is host memory under a budget (SINTER_CUDA_EMULATED_MEMORY bytes, default 4 GiB),
// so that an allocation past it fails as on a GPU. Events exist as handles: everything runs when
// called (or, on a stream capturing a graph, when the graph is launched), so each stream is always
// done; an event remembers the host clock when recorded.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>

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

struct Recorded {  // a captured graph, and its instantiation
  std::vector<std::function<void()>> work;
};
thread_local cudaStream_t t_capturing = nullptr;  // the stream this thread captures on
thread_local cudaStreamCaptureMode t_mode = cudaStreamCaptureModeGlobal;  // relaxed: may call cudaMalloc while capturing

// An operation a graph cannot hold, on (or while this thread captures on) s: invalidates the capture.
cudaError_t refuse_while_capturing(cudaStream_t s) {
  if (!s) s = t_capturing;
  if (!s || !s->capturing) return cudaSuccess;
  s->invalidated = true;
  return cudaErrorStreamCaptureUnsupported;
}

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
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
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
  if (t_mode != cudaStreamCaptureModeRelaxed)
    if (const cudaError_t e = refuse_while_capturing(nullptr)) return e;  // not recorded: unsafe unless relaxed
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
  if (const cudaError_t e = refuse_while_capturing(nullptr)) return e;  // it waits for the device
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

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t s) {
  if (bytes) enqueue(s, [=] { std::memmove(dst, src, bytes); });
  return cudaSuccess;
}

cudaError_t cudaMemcpyPeerAsync(void* dst, int, const void* src, int, size_t bytes, cudaStream_t s) {
  return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s);
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s) {
  if (bytes) enqueue(s, [=] { std::memset(p, value, bytes); });
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  *s = new CUstream_st;  // kept until exit, as the backend keeps its streams
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) { return refuse_while_capturing(s); }

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
  if (!s || s->capturing) return cudaErrorInvalidValue;
  s->capturing = true, s->invalidated = false, s->recorded.clear();
  t_capturing = s;
  return cudaSuccess;
}

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  std::swap(t_mode, *mode);
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  if (!s || !s->capturing) return cudaErrorInvalidValue;
  s->capturing = false, t_capturing = nullptr;
  *graph = nullptr;
  if (s->invalidated) return cudaErrorStreamCaptureInvalidated;
  *graph = reinterpret_cast<cudaGraph_t>(new Recorded{std::move(s->recorded)});
  s->recorded.clear();
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (!graph) return cudaErrorInvalidValue;
  *exec = reinterpret_cast<cudaGraphExec_t>(new Recorded(*reinterpret_cast<Recorded*>(graph)));
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  if (!exec) return cudaErrorInvalidValue;
  if (s && s->capturing) return refuse_while_capturing(s);
  for (const auto& work : reinterpret_cast<Recorded*>(exec)->work) work();
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete reinterpret_cast<Recorded*>(exec);
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete reinterpret_cast<Recorded*>(graph);
  return cudaSuccess;
}

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

cudaError_t cudaEventSynchronize(cudaEvent_t) { return refuse_while_capturing(nullptr); }

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  *ms = std::chrono::duration<float, std::milli>(reinterpret_cast<Event*>(end)->at - reinterpret_cast<Event*>(start)->at).count();
  return cudaSuccess;
}

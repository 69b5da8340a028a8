#pragma once
// The CUDA backend as a program sees it. The backend is its own library, libsinter_cuda (built
// where the CUDA toolkit is found; src/cuda/), loaded the first time a CUDA device is asked for:
// libsinter links no CUDA library, so a CPU-only machine needs none.
#include <cstdint>
#include <functional>
#include <string>

namespace sinter::cuda {

bool available();                  // the backend is loaded and sees a device it can run on
std::string unavailable_reason();  // why not ("" when available): no backend built, no driver, no device
int device_count();                // 0 when unavailable
// The device is the CUDA emulator (libsinter_cuda_emulated, src/cuda/emulator/): the backend's
// kernels running on the CPU, for tests where there is no GPU; it has no cuDNN or cuSPARSELt.
bool emulated();
// Throws DeviceError "[cuda] no CUDA device: <reason>", or naming the devices there are when
// cuda:index is not one of them.
void require_device(int index = 0);
std::string device_name(int device = 0);  // the GPU, its memory and driver, for reports
void synchronize(int device = 0);  // waits until the device's queued work is done

struct MemoryStats {
  int64_t live = 0;    // bytes held by tensors (in the allocator's size classes)
  int64_t cached = 0;  // bytes freed by tensors and kept for reuse
  int64_t peak = 0;    // most live bytes so far
};
MemoryStats memory_stats(int device = 0);
void empty_cache();  // every cached block back to the driver
// How many times the host has waited for a device so far (a copy to the CPU, synchronize()): a
// training step waits once, to read its loss. An index a kernel found out of range is raised at
// the next wait, naming the op (the CPU's kernels raise it at once).
int64_t host_synchronizations();
// cudaMemcpyAsync of device memory to device memory on the device's stream: the bandwidth a
// kernel that reads and writes the same bytes is held to (sinter bench cuda).
void copy_device_bytes(void* dst, const void* src, int64_t bytes, int device = 0);

// Device work recorded once and replayed with one launch (a CUDA graph). The constructor runs fn
// while the device's stream captures: the kernels and device copies fn queues become the graph, and
// nothing runs yet. replay() runs them again with the same arguments and addresses, so the tensors
// fn reads must outlive the graph and what changes between replays must change in their memory
// (an input written with copy_, a position the graph itself advances). Tensors fn makes live in the
// graph's own memory, rewritten by each replay. Run fn once before capturing, so that what it makes
// lazily (GEMM plans, 2:4 copies, cuSPARSELt's search) exists. A host read of device data in fn, or
// anything else a graph cannot hold, is an error naming it, and the device goes on.
class Graph {
 public:
  Graph(int device, const std::function<void()>& fn);
  ~Graph();
  Graph(Graph&& o) noexcept : handle_(o.handle_) { o.handle_ = nullptr; }
  Graph& operator=(Graph&& o) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  void replay();  // on the device's stream, without waiting

 private:
  void* handle_ = nullptr;
};

}  // namespace sinter::cuda

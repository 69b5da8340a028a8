#pragma once
// The CUDA backend as a program sees it. The backend is its own library, libsinter_cuda (built
// where the CUDA toolkit is found; src/cuda/), loaded the first time a CUDA device is asked for:
// libsinter links no CUDA library, so a CPU-only machine needs none.
#include <cstdint>
#include <string>

namespace sinter::cuda {

bool available();                  // the backend is loaded and sees a device it can run on
std::string unavailable_reason();  // why not ("" when available): no backend built, no driver, no device
int device_count();                // 0 when unavailable
void synchronize(int device = 0);  // waits until the device's queued work is done

struct MemoryStats {
  int64_t live = 0;    // bytes held by tensors (in the allocator's size classes)
  int64_t cached = 0;  // bytes freed by tensors and kept for reuse
  int64_t peak = 0;    // most live bytes so far
};
MemoryStats memory_stats(int device = 0);
void empty_cache();  // every cached block back to the driver

}  // namespace sinter::cuda

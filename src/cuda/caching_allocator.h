#pragma once
// The CUDA backend's memory cache, as bookkeeping over a provider of raw device memory (cudaMalloc
// and cudaFree in the backend, a fake in the tests): blocks are rounded to size classes and, when
// freed, kept per stream for the next request of their class on that stream. A loop that allocates
// the same shapes every step (every training and decode step does) then reuses them without a
// cudaMalloc, which synchronizes the device. A block stays on its stream, whose order makes reuse
// safe without events. When the provider is out of memory, the cache is given back and the request
// tried once more; after that an Error names the bytes asked for, held, cached and free.
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace sinter::cuda {

struct Provider {
  std::function<void*(int64_t bytes)> alloc;  // null when out of memory
  std::function<void(void* p)> free;
  std::function<int64_t()> free_bytes;        // what the device has left, for the error message
};

struct AllocatorStats {
  int64_t live = 0;    // bytes in blocks held by tensors (size classes)
  int64_t cached = 0;  // bytes in freed blocks kept for reuse
  int64_t peak = 0;    // most live bytes since the last reset
  int64_t provider_allocs = 0, provider_frees = 0;
};

class CachingAllocator {
 public:
  CachingAllocator(Provider provider, std::string device_name);
  // A block of at least `bytes` (256-byte aligned as the provider's are), used on `stream`.
  void* allocate(int64_t bytes, uintptr_t stream);
  void release(void* p);  // into the cache of the stream it was allocated on
  void empty_cache();     // every cached block back to the provider, but those of pools not retired
  // A CUDA graph's pool. Its replays write its blocks at the addresses the capture gave them, so
  // until end_pool requests are served from (and their blocks freed into) `pool`, a key no stream
  // has, and no request outside it gets them until retire_pool; blocks from outside freed in the
  // meantime (the capture may have read them) are held until then too.
  void begin_pool(uintptr_t pool);
  void end_pool();
  // The pool's cached and held blocks go to `stream`'s cache (whose order follows the graph's
  // replays), and so do its live blocks when freed.
  void retire_pool(uintptr_t pool, uintptr_t stream);
  AllocatorStats stats() const;
  void reset_peak();
  // 512 B, then 2^k and 1.5 * 2^k: at most a third more than asked, and near sizes share.
  static int64_t size_class(int64_t bytes);

 private:
  struct Block {
    int64_t size;
    uintptr_t stream;  // or the pool it came from
  };
  void give_back_cache();  // under mu_
  uintptr_t pool_ = 0;     // the pool being captured into (0: none)
  // Pools not retired -> the blocks from outside them freed during their capture.
  std::unordered_map<uintptr_t, std::vector<std::pair<void*, Block>>> pools_;
  Provider provider_;
  std::string name_;
  mutable std::mutex mu_;
  std::unordered_map<void*, Block> live_;
  std::unordered_map<uintptr_t, std::unordered_map<int64_t, std::vector<void*>>> cache_;  // stream -> class -> blocks
  AllocatorStats stats_;
};

}  // namespace sinter::cuda

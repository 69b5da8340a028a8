// CachingAllocator (caching_allocator.h): plain C++, so its bookkeeping is tested without a GPU.
#include "cuda/caching_allocator.h"

#include <algorithm>

#include "sinter/error.h"

namespace sinter::cuda {
namespace {
std::string gib(int64_t bytes) { return detail::cat_message(bytes, " bytes (", double(bytes) / double(int64_t(1) << 30), " GiB)"); }
}  // namespace

CachingAllocator::CachingAllocator(Provider provider, std::string device_name)
    : provider_(std::move(provider)), name_(std::move(device_name)) {}

int64_t CachingAllocator::size_class(int64_t bytes) {
  if (bytes <= 512) return 512;
  int64_t p = 512;
  while (p < bytes) {
    if (p + p / 2 >= bytes) return p + p / 2;
    p *= 2;
  }
  return p;
}

void* CachingAllocator::allocate(int64_t bytes, uintptr_t stream) {
  SINTER_CHECK(bytes >= 0, "[", name_, "] cannot allocate ", bytes, " bytes");
  const int64_t size = size_class(std::max<int64_t>(bytes, 1));
  std::lock_guard lock(mu_);
  if (pool_) stream = pool_;
  void* p = nullptr;
  auto& mine = cache_[stream][size];
  if (!mine.empty()) {
    p = mine.back();
    mine.pop_back();
    stats_.cached -= size;
  } else {
    p = provider_.alloc(size);
    if (!p && stats_.cached > 0) {  // the cache holds what the device lacks: give it back, try again
      give_back_cache();
      p = provider_.alloc(size);
    }
    if (!p) {
      const int64_t free = provider_.free_bytes ? provider_.free_bytes() : -1;
      SINTER_THROW(DeviceError, "[", name_, "] out of memory: asked for ", gib(bytes), "; tensors hold ", gib(stats_.live),
                   ", the device has ", free >= 0 ? gib(free) : std::string("an unknown number of bytes"), " free");
    }
    ++stats_.provider_allocs;
  }
  live_[p] = {size, stream};
  stats_.live += size;
  stats_.peak = std::max(stats_.peak, stats_.live);
  return p;
}

void CachingAllocator::release(void* p) {
  if (!p) return;
  std::lock_guard lock(mu_);
  auto it = live_.find(p);
  SINTER_ASSERT(it != live_.end(), "[", name_, "] freeing a block this allocator did not give");
  const Block b = it->second;
  live_.erase(it);
  stats_.live -= b.size;
  stats_.cached += b.size;
  if (pool_ && b.stream != pool_) {  // the capture may have read it: its replays will too
    pools_[pool_].emplace_back(p, b);
    return;
  }
  cache_[b.stream][b.size].push_back(p);
}

void CachingAllocator::begin_pool(uintptr_t pool) {
  std::lock_guard lock(mu_);
  SINTER_CHECK(!pool_ && pool && !cache_.count(pool) && !pools_.count(pool), "[", name_, "] a graph's memory pool is already being captured");
  pool_ = pool;
  pools_[pool];
}

void CachingAllocator::end_pool() {
  std::lock_guard lock(mu_);
  pool_ = 0;
}

void CachingAllocator::retire_pool(uintptr_t pool, uintptr_t stream) {
  std::lock_guard lock(mu_);
  for (const auto& [p, b] : pools_[pool]) cache_[b.stream][b.size].push_back(p);
  pools_.erase(pool);
  for (auto& [size, blocks] : cache_[pool]) {
    auto& to = cache_[stream][size];
    to.insert(to.end(), blocks.begin(), blocks.end());
  }
  cache_.erase(pool);
  for (auto& [p, b] : live_)
    if (b.stream == pool) b.stream = stream;
}

void CachingAllocator::give_back_cache() {
  for (auto& [stream, classes] : cache_) {
    if (pools_.count(stream)) continue;  // a graph's: its replays write them
    for (auto& [size, blocks] : classes) {
      for (void* p : blocks) provider_.free(p), ++stats_.provider_frees;
      stats_.cached -= size * int64_t(blocks.size());
      blocks.clear();
    }
  }
}

void CachingAllocator::empty_cache() {
  std::lock_guard lock(mu_);
  give_back_cache();
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard lock(mu_);
  stats_.peak = stats_.live;
}

}  // namespace sinter::cuda

#include "core/allocator.h"

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "sinter/error.h"

namespace sinter {
namespace {

constexpr int64_t kCacheFrom = 256 << 10;  // from here blocks are cached without a count limit

int64_t cache_limit() {
  static const int64_t limit = [] {
    const char* s = std::getenv("SINTER_CPU_CACHE_MB");
    return (s ? std::atoll(s) : 4096) << 20;
  }();
  return limit;
}

// Size classes 2^k and 1.5 * 2^k: at most a third wasted, and shapes that differ a little share.
int64_t size_class(int64_t n) {
  int64_t p = kCacheFrom;
  while (p < n) {
    if (p + p / 2 >= n) return p + p / 2;
    p *= 2;
  }
  return p;
}

// Small blocks (under kCacheFrom) by class too: aligned_alloc goes through glibc's memalign path
// (carve an aligned block, free the padding), whose internals (_int_malloc, malloc_consolidate,
// unlink_chunk) were 7.2% of a decode step of the default model and are 2.5% with this cache
// (perf, one thread); a class keeps at most kSmallKeep blocks.
constexpr int kSmallClasses = 24;  // 64 B, then 2^k and 1.5 * 2^k from 128 B to 256 KiB (multiples of 64: aligned_alloc's rule)
constexpr size_t kSmallKeep = 64;
int small_class(int64_t n, int64_t* bytes) {
  if (n <= 64) return *bytes = 64, 0;
  int64_t p = 128;
  for (int i = 1;; i += 2, p *= 2) {
    if (n <= p) return *bytes = p, i;
    if (n <= p + p / 2) return *bytes = p + p / 2, i + 1;
  }
}

struct Cache {
  std::mutex mu;
  std::unordered_map<int64_t, std::vector<void*>> free;
  std::vector<void*> small[kSmallClasses];
  int64_t bytes = 0;
};
Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: storages freed at exit still find it
  return *c;
}

std::atomic<int64_t> g_live{0}, g_peak{0};

void count_alloc(int64_t n) {
  const int64_t now = g_live.fetch_add(n, std::memory_order_relaxed) + n;
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

}  // namespace

int64_t cpu_live_bytes() { return g_live.load(); }
int64_t cpu_peak_bytes() { return g_peak.load(); }
void cpu_reset_peak() { g_peak = g_live.load(); }

void* cpu_alloc(int64_t nbytes) {
  const int64_t n = std::max<int64_t>(nbytes, 1);
  count_alloc(n);
  if (n >= kCacheFrom) {
    const int64_t cls = size_class(n);
    Cache& c = cache();
    {
      std::lock_guard lock(c.mu);
      auto it = c.free.find(cls);
      if (it != c.free.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        c.bytes -= cls;
        return p;
      }
    }
    void* p = std::aligned_alloc(64, size_t(cls));
    SINTER_CHECK_T(Error, p != nullptr, "[alloc] out of memory allocating ", nbytes, " bytes");
    return p;
  }
  int64_t cls = 0;
  const int i = small_class(n, &cls);
  Cache& c = cache();
  {
    std::lock_guard lock(c.mu);
    if (!c.small[i].empty()) {
      void* p = c.small[i].back();
      c.small[i].pop_back();
      c.bytes -= cls;
      return p;
    }
  }
  void* p = std::aligned_alloc(64, size_t(cls));
  SINTER_CHECK_T(Error, p != nullptr, "[alloc] out of memory allocating ", nbytes, " bytes");
  return p;
}

void cpu_free(void* p, int64_t nbytes) {
  if (!p) return;
  const int64_t n = std::max<int64_t>(nbytes, 1);
  g_live.fetch_sub(n, std::memory_order_relaxed);
  if (n >= kCacheFrom) {
    const int64_t cls = size_class(n);
    Cache& c = cache();
    std::lock_guard lock(c.mu);
    if (c.bytes + cls <= cache_limit()) {
      c.free[cls].push_back(p);
      c.bytes += cls;
      return;
    }
  } else {
    int64_t cls = 0;
    const int i = small_class(n, &cls);
    Cache& c = cache();
    std::lock_guard lock(c.mu);
    if (c.small[i].size() < kSmallKeep && c.bytes + cls <= cache_limit()) {
      c.small[i].push_back(p);
      c.bytes += cls;
      return;
    }
  }
  std::free(p);
}

int64_t cpu_cached_bytes() {
  std::lock_guard lock(cache().mu);
  return cache().bytes;
}

void cpu_empty_cache() {
  Cache& c = cache();
  std::lock_guard lock(c.mu);
  for (auto& [cls, v] : c.free)
    for (void* p : v) std::free(p);
  c.free.clear();
  for (auto& v : c.small) {
    for (void* p : v) std::free(p);
    v.clear();
  }
  c.bytes = 0;
}

}  // namespace sinter

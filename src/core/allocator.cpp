#include "core/allocator.h"

#include <sys/mman.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "sinter/error.h"

#if defined(__SANITIZE_ADDRESS__)
#define SINTER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SINTER_ASAN 1
#endif
#endif

namespace sinter {
namespace {

// Under AddressSanitizer every block is the exact size asked for and freed at once (no size
// classes, no cache): a kernel (built-in, generated or a user's) writing past a tensor's end is
// reported as a heap-buffer-overflow, and one touching a freed tensor as a heap-use-after-free.
#if SINTER_ASAN
constexpr bool kExact = true;
#else
constexpr bool kExact = false;
#endif

// Every block is cached by size class when freed. Small ones too: aligned_alloc goes through
// glibc's memalign path (carve an aligned block, free the padding), whose internals
// (_int_malloc, malloc_consolidate, unlink_chunk) were 7.2% of a decode step of the default model
// and are 2.5% with the cache (perf, one thread). Below kKeepAllFrom a class keeps at most
// kSmallKeep blocks; from it, as many as the cache limit allows.
constexpr int64_t kKeepAllFrom = 256 << 10;
constexpr size_t kSmallKeep = 64;

int64_t cache_limit() {
  static const int64_t limit = [] {
    const char* s = std::getenv("SINTER_CPU_CACHE_MB");
    return (s ? std::atoll(s) : 4096) << 20;
  }();
  return limit;
}

// Blocks from 4 MiB start on a 2 MiB boundary and ask Linux for transparent huge pages
// (MADV_HUGEPAGE: honoured where THP is "madvise" or "always"): a kernel streaming such a tensor
// then crosses a page every 2 MiB instead of every 4 KiB. Measured on an Intel Xeon, 2 threads: a
// fused 6-op elementwise kernel over 16M floats (three 64 MiB streams) takes 14.0 ms with huge
// pages, 17.1 without. The size classes from 4 MiB are multiples of 2 MiB, so no bytes are added.
constexpr int64_t kHugeFrom = 4 << 20, kHugePage = 2 << 20;

// Size classes 64 B, then 2^k and 1.5 * 2^k (multiples of 64, as aligned_alloc requires): at
// most a third wasted, and shapes that differ a little share.
int64_t size_class(int64_t n) {
  if (n <= 64) return 64;
  int64_t p = 128;
  while (p < n) {
    if (p + p / 2 >= n) return p + p / 2;
    p *= 2;
  }
  return p;
}

struct Cache {
  std::mutex mu;
  std::unordered_map<int64_t, std::vector<void*>> free;
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
  if (kExact) {
    void* p = nullptr;
    SINTER_CHECK_T(Error, posix_memalign(&p, 64, size_t(n)) == 0, "[alloc] out of memory allocating ", nbytes, " bytes");
    return p;
  }
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
  void* p = std::aligned_alloc(cls >= kHugeFrom ? kHugePage : 64, size_t(cls));
  SINTER_CHECK_T(Error, p != nullptr, "[alloc] out of memory allocating ", nbytes, " bytes");
#if defined(MADV_HUGEPAGE)
  if (cls >= kHugeFrom) (void)madvise(p, size_t(cls), MADV_HUGEPAGE);  // a hint: no huge pages is no error
#endif
  return p;
}

void cpu_free(void* p, int64_t nbytes) {
  if (!p) return;
  const int64_t n = std::max<int64_t>(nbytes, 1);
  g_live.fetch_sub(n, std::memory_order_relaxed);
  if (kExact) return std::free(p);
  const int64_t cls = size_class(n);
  Cache& c = cache();
  {
    std::lock_guard lock(c.mu);
    std::vector<void*>& list = c.free[cls];
    if (c.bytes + cls <= cache_limit() && (cls >= kKeepAllFrom || list.size() < kSmallKeep)) {
      list.push_back(p);
      c.bytes += cls;
      return;
    }
  }
  std::free(p);
}

namespace {
struct Allocators {
  std::mutex mu;
  Allocator by_type[kNumDeviceTypes];
};
Allocators& allocators() {
  static Allocators a;
  return a;
}
std::atomic<bool> g_other_devices{false};
}  // namespace

bool other_devices_registered() { return g_other_devices.load(std::memory_order_relaxed); }

void register_allocator(DeviceType type, Allocator a) {
  SINTER_CHECK(type != DeviceType::cpu, "[register_allocator] the CPU allocator is built in");
  SINTER_CHECK(a.alloc && a.free, "[register_allocator] an allocator needs alloc and free functions");
  std::lock_guard lock(allocators().mu);
  allocators().by_type[int(type)] = std::move(a);
  g_other_devices.store(true, std::memory_order_relaxed);
}

bool has_allocator(DeviceType type) {
  if (type == DeviceType::cpu) return true;
  std::lock_guard lock(allocators().mu);
  return allocators().by_type[int(type)].alloc != nullptr;
}

const Allocator& device_allocator(DeviceType type) {
  std::lock_guard lock(allocators().mu);
  const Allocator& a = allocators().by_type[int(type)];
  SINTER_CHECK(a.alloc != nullptr, "[alloc] no allocator is registered for device ", Device{type, 0},
               " (this build has memory for the CPU only)");
  return a;
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
  c.bytes = 0;
}

}  // namespace sinter

// The CUDA backend's caching allocator (src/cuda/caching_allocator.cpp), as bookkeeping over a fake
// provider of device memory: reuse per stream and size class, and out-of-memory behaviour.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <set>

#include "cuda/caching_allocator.h"
#include "sinter/error.h"

using namespace sinter;
using namespace sinter::cuda;

namespace {

// Device memory of a fixed capacity, handed out as host blocks; counts what it gives.
struct FakeDevice {
  explicit FakeDevice(int64_t bytes) : capacity(bytes) {}
  int64_t capacity, used = 0;
  std::set<void*> blocks;
  Provider provider() {
    return {[this](int64_t n) -> void* {
              if (used + n > capacity) return nullptr;
              void* p = std::malloc(size_t(n));
              used += n, blocks.insert(p);
              sizes[p] = n;
              return p;
            },
            [this](void* p) {
              used -= sizes.at(p), blocks.erase(p), sizes.erase(p);
              std::free(p);
            },
            [this] { return capacity - used; }};
  }
  std::map<void*, int64_t> sizes;
};

}  // namespace

TEST(CudaAllocator, SizeClassesHoldTheRequestAndWasteAtMostAHalf) {
  for (int64_t n : {int64_t(1), int64_t(511), int64_t(512), int64_t(513), int64_t(1000), int64_t(1536), int64_t(1537),
                    int64_t(3) << 20, (int64_t(1) << 30) + 1}) {
    const int64_t c = CachingAllocator::size_class(n);
    EXPECT_GE(c, n);
    EXPECT_EQ(c % 256, 0) << n;  // cudaMalloc's alignment
    if (n > 512) {
      EXPECT_LE(c, n + n / 2) << n;
    }
  }
}

TEST(CudaAllocator, AFreedBlockIsReusedOnItsStreamOnly) {
  FakeDevice dev{1 << 20};
  CachingAllocator a(dev.provider(), "cuda:0");
  void* p = a.allocate(1000, 1);
  a.release(p);
  EXPECT_EQ(a.stats().cached, 1024);
  EXPECT_EQ(a.allocate(900, 1), p);  // the same class on the same stream: no provider call
  EXPECT_EQ(a.stats().provider_allocs, 1);
  a.release(p);
  void* q = a.allocate(900, 2);  // another stream never takes it (its queued work may still use it)
  EXPECT_NE(q, p);
  EXPECT_EQ(a.stats().provider_allocs, 2);
  EXPECT_EQ(a.stats().live, 1024);
  a.release(q);
  a.empty_cache();
  EXPECT_EQ(a.stats().cached, 0);
  EXPECT_EQ(dev.used, 0);
  EXPECT_EQ(a.stats().peak, 1024);  // never two blocks held at once
}

TEST(CudaAllocator, OutOfMemoryGivesBackTheCacheThenNamesTheBytesAndGoesOn) {
  FakeDevice dev{8192};
  CachingAllocator a(dev.provider(), "cuda:0");
  void* small = a.allocate(3000, 1);  // class 3072
  a.release(small);                   // cached
  void* big = a.allocate(6000, 1);    // class 6144: fits only once the cached block is given back
  EXPECT_NE(big, nullptr);
  EXPECT_EQ(a.stats().cached, 0);
  EXPECT_EQ(a.stats().provider_frees, 1);
  try {
    (void)a.allocate(5000, 1);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("[cuda:0] out of memory", 0), 0u) << m;
    EXPECT_NE(m.find("asked for 5000 bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("2048 bytes"), std::string::npos) << m;  // free on the device
  }
  a.release(big);
  void* again = a.allocate(6000, 1);  // the allocator goes on after the error
  EXPECT_EQ(again, big);
  a.release(again);
}

// A graph's pool: during its capture every request is served from the pool (never from a
// stream's cache) and its freed blocks serve the capture again; a block from outside freed during
// the capture, and the pool's cached blocks, reach no other request until the pool is retired,
// and empty_cache keeps them; then they join the stream's cache, and so do its live blocks when freed.
TEST(CudaAllocator, AGraphsPoolKeepsItsBlocksUntilRetired) {
  FakeDevice dev{1 << 20};
  CachingAllocator a(dev.provider(), "cuda:0");
  void* outside = a.allocate(1000, 1);
  void* cached = a.allocate(1000, 1);
  a.release(cached);
  const uintptr_t pool = 77;
  a.begin_pool(pool);
  void* t1 = a.allocate(1000, 1);
  EXPECT_NE(t1, cached);  // the stream's cache is not the pool's
  a.release(t1);
  void* t2 = a.allocate(1000, 1);
  EXPECT_EQ(t2, t1);  // reused within the capture, in its order
  void* out = a.allocate(3000, 1);
  a.release(outside);  // the capture's replays may read it
  a.release(t2);
  a.end_pool();
  for (int i = 0; i < 3; ++i) {  // none of the capture's blocks, nor the one it held
    void* p = a.allocate(1000, 1);
    EXPECT_TRUE(p != t1 && p != outside) << i;
    if (i == 0) {
      EXPECT_EQ(p, cached);
    }
  }
  a.empty_cache();
  EXPECT_TRUE(dev.blocks.count(t1) && dev.blocks.count(outside));
  a.retire_pool(pool, 1);
  std::set<void*> after;
  for (int i = 0; i < 2; ++i) after.insert(a.allocate(1000, 1));
  EXPECT_EQ(after, (std::set<void*>{t1, outside}));
  a.release(out);  // live when the pool retired: to the stream
  EXPECT_EQ(a.allocate(3000, 1), out);
}

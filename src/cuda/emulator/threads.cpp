// The emulated grid (emulator.h): a block's threads as fibers on the launching thread, run
// round-robin; a fiber gives way only at a barrier or a shuffle. A block barrier opens when every
// thread of the block that has not returned has reached it; a warp's when its live lanes have. A
// round in which no fiber arrives anywhere or returns is a deadlock: the launch fails. Fibers
// switch by saving the callee-saved registers on their own stack (x86-64 System V), without
// ucontext's signal-mask system call: a launch switches twice per thread at least.
#include <sys/mman.h>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SINTER_EMULATOR_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define SINTER_EMULATOR_ASAN 1
#endif
#ifdef SINTER_EMULATOR_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#include <cstdlib>
#include <string>
#include <vector>

#include "cuda/emulator/emulator.h"
#include "cuda/emulator/state.h"

namespace sinter::cuda::emulator {

thread_local const Place* here [[gnu::tls_model("initial-exec")]] = nullptr;

namespace {

constexpr size_t kStack = size_t(256) << 10, kGuard = 4096;  // per fiber; an overflow hits the guard page
constexpr size_t kTopFrame = 4096;  // holds fiber_main's frame
constexpr size_t kGatherWords = 3;  // a lane's words to an mma (A: 4 x 32 bits, B: 2 x 32) or an ldmatrix (its row)

struct Barrier {
  int size = 0, live = 0, arrived = 0;  // threads at the launch, not yet returned, waiting
  uint64_t generation = 0;
  bool full_mask = false;  // a waiter named every lane of its warp
};

// switch_stack(from, to): saves the callee-saved registers on the running stack, stores its pointer
// in *from, and resumes the stack `to`. The floating-point control words (MXCSR, x87) are not
// switched: kernel code has no way to change them, so every fiber runs with the launching
// thread's (saving and loading them took 80% of a switch, a third of an emulated training step).
extern "C" void sinter_emulator_switch(void** from, void* to);
asm(R"(
  .text
  .globl sinter_emulator_switch
  .hidden sinter_emulator_switch
  .type sinter_emulator_switch, @function
sinter_emulator_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size sinter_emulator_switch, .-sinter_emulator_switch
)");

struct Fiber {
  void* sp = nullptr;  // its saved stack pointer while another runs
  bool done = false;
  void* fake_stack = nullptr;  // AddressSanitizer's, while another runs
};

// AddressSanitizer is told of each switch (the stack it goes to) and of each arrival, so it checks
// each fiber against its own stack; elsewhere these are nothing.
#ifdef SINTER_EMULATOR_ASAN
void leaving(void** fake, const void* bottom, size_t size) { __sanitizer_start_switch_fiber(fake, bottom, size); }
void arrived(void* fake, const void** from_bottom, size_t* from_size) { __sanitizer_finish_switch_fiber(fake, from_bottom, from_size); }
#else
void leaving(void**, const void*, size_t) {}
void arrived(void*, const void**, size_t*) {}
#endif

struct Block {
  const std::function<void()>* body = nullptr;
  void* scheduler = nullptr;  // the launching thread's stack while a fiber runs
  const void* scheduler_bottom = nullptr;  // and its bounds, for AddressSanitizer
  size_t scheduler_size = 0;
  void* scheduler_fake = nullptr;
  std::vector<Fiber> fibers;
  std::vector<void*> stacks;  // each fiber's stack (its lowest address), kept by the launching thread
  std::vector<Place> places;
  std::vector<uint64_t> lanes[2];  // what each thread offers to a shuffle, by its barrier's parity
  std::vector<uint64_t> gathered[2];  // and to an mma, kGatherWords each
  std::vector<Barrier> warps;
  Barrier all;
  std::vector<unsigned char> shared;
  std::vector<int> live;  // the threads that have not returned, in order
  uint64_t events = 0;    // arrivals and returns: progress
  int running = 0;
};

thread_local Block* t_block [[gnu::tls_model("initial-exec")]] = nullptr;
thread_local std::vector<void*> t_stacks;  // kept for the thread's next launches

void* stack(size_t i) {
  while (t_stacks.size() <= i) {
    void* p = mmap(nullptr, kStack + kGuard, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) std::abort();
    mprotect(p, kGuard, PROT_NONE);
    t_stacks.push_back(p);
  }
  return static_cast<char*>(t_stacks[i]) + kGuard;
}

void unpoison_stacks(const std::vector<void*>& stacks) {
#ifdef SINTER_EMULATOR_ASAN
  for (void* s : stacks) ASAN_UNPOISON_MEMORY_REGION(s, kStack);
#endif
}

void give_way() {
  Block& b = *t_block;
  Fiber& f = b.fibers[size_t(b.running)];
  leaving(&f.fake_stack, b.scheduler_bottom, b.scheduler_size);
  sinter_emulator_switch(&f.sp, b.scheduler);
  arrived(f.fake_stack, &b.scheduler_bottom, &b.scheduler_size);
}

// Opens `bar`. A warp operation that named every lane while some had returned is undefined on the
// device: it fails the launch.
void open(Barrier& bar) {
  if (bar.full_mask && bar.live < bar.size)
    set_error(cudaErrorLaunchFailure, "emulated kernel: a warp operation with a full member mask after " +
                                          std::to_string(bar.size - bar.live) + " of the warp's lanes returned");
  bar.arrived = 0, bar.full_mask = false, ++bar.generation;
}

// Arrives at `bar` and waits until it opens.
void arrive_and_wait(Barrier& bar) {
  Block& b = *t_block;
  ++b.events;
  const uint64_t g = bar.generation;
  if (++bar.arrived == bar.live) return open(bar);
  while (bar.generation == g) give_way();
}

void leave(Barrier& bar) {
  --bar.live;
  if (bar.arrived > 0 && bar.arrived == bar.live) open(bar);
}

[[noreturn]] void fiber_main() {
  Block& b = *t_block;
  arrived(nullptr, &b.scheduler_bottom, &b.scheduler_size);
  const int i = b.running;
  (*b.body)();
  b.fibers[size_t(i)].done = true;
  ++b.events;
  leave(b.all);
  leave(b.warps[size_t(i / 32)]);
  void* unused;
  leaving(nullptr, b.scheduler_bottom, b.scheduler_size);  // this fiber's fake stack ends here
  sinter_emulator_switch(&unused, b.scheduler);              // never resumed
  __builtin_unreachable();
}

// A new fiber's stack as sinter_emulator_switch leaves one: six registers and fiber_main as the
// return address, entered with the stack aligned as after a call. For AddressSanitizer a fiber
// that returned left only fiber_main's frame poisoned, at the top: that is cleaned here, and the
// stacks of a deadlocked block, abandoned mid-call, whole (unpoison_stacks). Cleaning every stack
// whole for each block took half of an emulated test's time under ASan.
void* fresh_stack(void* bottom) {
  auto* top = reinterpret_cast<uint64_t*>(static_cast<char*>(bottom) + kStack);
#ifdef SINTER_EMULATOR_ASAN
  ASAN_UNPOISON_MEMORY_REGION(static_cast<char*>(bottom) + kStack - kTopFrame, kTopFrame);
#endif
  top[-2] = reinterpret_cast<uint64_t>(&fiber_main);
  for (int r = 3; r <= 8; ++r) top[-r] = 0;
  return &top[-8];
}

// SINTER_CUDA_EMULATED_ORDER=reverse runs each block's threads last to first between barriers: a
// read of another thread's write that lacks a barrier sees the old value in one order or the other.
bool reversed() {
  static const bool r = [] {
    const char* v = std::getenv("SINTER_CUDA_EMULATED_ORDER");
    return v && std::string(v) == "reverse";
  }();
  return r;
}

// Runs one block to its end; false when its threads deadlock.
bool run_block(Block& b) {
  const size_t n = b.fibers.size();
  b.all = Barrier{int(n), int(n), 0, 0};
  for (size_t w = 0; w < b.warps.size(); ++w) {
    const int lanes = int(std::min<size_t>(32, n - 32 * w));
    b.warps[w] = Barrier{lanes, lanes, 0, 0};
  }
  for (size_t i = 0; i < n; ++i) b.fibers[i] = Fiber{fresh_stack(b.stacks[i]), false};
  std::vector<int>& live = b.live;
  live.resize(n);
  for (size_t i = 0; i < n; ++i) live[i] = reversed() ? int(n - 1 - i) : int(i);
  while (!live.empty()) {
    const uint64_t before = b.events;
    size_t kept = 0;
    for (const int i : live) {
      b.running = i;
      here = &b.places[size_t(i)];
      leaving(&b.scheduler_fake, b.stacks[size_t(i)], kStack);
      sinter_emulator_switch(&b.scheduler, b.fibers[size_t(i)].sp);
      arrived(b.scheduler_fake, nullptr, nullptr);
      if (!b.fibers[size_t(i)].done) live[kept++] = i;
    }
    live.resize(kept);
    if (kept > 0 && b.events == before) return false;
  }
  return true;
}

}  // namespace

void launch(dim3 grid, dim3 block, size_t smem, cudaStream_t s, const std::function<void()>& body) {
  if (s && s->capturing) {  // the graph's node: the same launch when replayed
    s->recorded.push_back([=, body = body] { launch(grid, block, smem, nullptr, body); });
    return;
  }
  const size_t n = size_t(block.x) * block.y * block.z;
  if (n == 0 || n > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535) {
    set_error(cudaErrorInvalidValue, "invalid launch configuration");
    return;
  }
  Block b;
  b.body = &body;
  b.fibers.resize(n);
  b.stacks.resize(n);
  for (size_t i = 0; i < n; ++i) b.stacks[i] = stack(i);
  b.places.resize(n);
  for (size_t i = 0; i < n; ++i)
    b.places[i] = {{unsigned(i % block.x), unsigned(i / block.x % block.y), unsigned(i / (size_t(block.x) * block.y))}, {}, block, grid};
  b.lanes[0].resize(n), b.lanes[1].resize(n);
  b.gathered[0].resize(n * kGatherWords), b.gathered[1].resize(n * kGatherWords);
  b.warps.resize((n + 31) / 32);
  b.shared.assign(smem, 0xFF);  // uninitialized, as on the device: NaN bytes show a read before a write
  Block* outer = t_block;
  const Place* outer_here = here;
  t_block = &b;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        for (Place& p : b.places) p.block = {bx, by, bz};
        if (!run_block(b)) {
          unpoison_stacks(b.stacks);
          const std::string where = std::to_string(bx) + ", " + std::to_string(by) + ", " + std::to_string(bz);
          set_error(cudaErrorLaunchFailure,
                    "emulated kernel deadlocked in block (" + where + "): its threads wait at barriers that cannot open");
          t_block = outer, here = outer_here;
          return;
        }
      }
  t_block = outer, here = outer_here;
}

void* dynamic_shared() { return t_block->shared.data(); }

#ifdef SINTER_EMULATOR_ASAN
void guard_tail(void* p, int64_t used, int64_t block) { ASAN_POISON_MEMORY_REGION(static_cast<char*>(p) + used, size_t(block - used)); }
void unguard(void* p, int64_t block) { ASAN_UNPOISON_MEMORY_REGION(p, size_t(block)); }
#else
void guard_tail(void*, int64_t, int64_t) {}
void unguard(void*, int64_t) {}
#endif

void sync_block() { arrive_and_wait(t_block->all); }

void sync_warp(unsigned members) {
  Barrier& warp = t_block->warps[size_t(t_block->running / 32)];
  warp.full_mask |= members == 0xffffffffu;
  arrive_and_wait(warp);
}

// One barrier per exchange: consecutive exchanges use the two halves of `lanes` in turn, and no
// lane can write a half again before every lane has passed the barrier after it, having read.
uint64_t exchange_xor(uint64_t bits, unsigned lane_mask, unsigned members) {
  Block& b = *t_block;
  const size_t i = size_t(b.running), from = i / 32 * 32 + ((i % 32) ^ (lane_mask % 32));
  Barrier& warp = b.warps[i / 32];
  warp.full_mask |= members == 0xffffffffu;
  std::vector<uint64_t>& lanes = b.lanes[warp.generation & 1];
  lanes[i] = bits;
  arrive_and_wait(warp);
  return from < lanes.size() ? lanes[from] : bits;
}

namespace {
// Every lane of the warp offers its words; returns the warp's offers, lane i's at
// [kGatherWords i ...], readable until this lane's next warp operation.
const uint64_t* gather_warp(const uint64_t (&mine)[kGatherWords]) {
  Block& b = *t_block;
  const size_t i = size_t(b.running);
  Barrier& warp = b.warps[i / 32];
  warp.full_mask = true;
  std::vector<uint64_t>& slots = b.gathered[warp.generation & 1];
  for (size_t w = 0; w < kGatherWords; ++w) slots[i * kGatherWords + w] = mine[w];
  arrive_and_wait(warp);
  return slots.data() + i / 32 * 32 * kGatherWords;
}
}  // namespace

void mma_bf16_16816(float c[4], const uint32_t a[4], const uint32_t b[2]) {
  const uint64_t mine[kGatherWords] = {a[0] | uint64_t(a[1]) << 32, a[2] | uint64_t(a[3]) << 32, b[0] | uint64_t(b[1]) << 32};
  const uint64_t* warp = gather_warp(mine);
  auto half = [&](int lane, int reg, int k) {  // element k % 2 of register `reg` (A: 0-3, B: 4-5) of `lane`
    const uint32_t word = uint32_t(warp[kGatherWords * size_t(lane) + size_t(reg / 2)] >> (32 * (reg % 2)));
    return __uint_as_float((k % 2 ? word >> 16 : word & 0xffffu) << 16);
  };
  const int lane = int(t_block->running % 32), g = lane / 4, t = lane % 4;
  for (int r = 0; r < 4; ++r) {
    const int row = g + 8 * (r / 2), col = 2 * t + r % 2;
    float acc = c[r];
    for (int k = 0; k < 16; ++k)
      acc += half(row % 8 * 4 + k % 8 / 2, row / 8 + 2 * (k / 8), k) * half(col * 4 + k % 8 / 2, 4 + k / 8, k);
    c[r] = acc;
  }
}

void check_aligned16(const void* p) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) set_error(cudaErrorLaunchFailure, "emulated kernel: a 16-byte access off 16 bytes");
}

void ldmatrix_x4(uint32_t r[4], const void* row, bool trans) {
  const Block& b = *t_block;
  const auto at = reinterpret_cast<uintptr_t>(row), lo = reinterpret_cast<uintptr_t>(b.shared.data());
  if (at % 16 != 0 || at < lo || at + 16 > lo + b.shared.size())
    set_error(cudaErrorLaunchFailure, "emulated kernel: an ldmatrix row outside the block's shared memory or off 16 bytes");
  const uint64_t mine[kGatherWords] = {uint64_t(at), 0, 0};
  const uint64_t* warp = gather_warp(mine);
  const int lane = int(b.running % 32), g = lane / 4, t = lane % 4;
  auto element = [&](int m, int rw, int col) -> uint32_t {  // (rw, col) of matrix m: rw is its lane 8 m + rw's row
    const uintptr_t p = uintptr_t(warp[kGatherWords * size_t(8 * m + rw)]);
    return p % 16 == 0 && p >= lo && p + 16 <= lo + b.shared.size() ? reinterpret_cast<const uint16_t*>(p)[col] : 0u;
  };
  for (int m = 0; m < 4; ++m)
    r[m] = trans ? element(m, 2 * t, g) | element(m, 2 * t + 1, g) << 16 : element(m, g, 2 * t) | element(m, g, 2 * t + 1) << 16;
}

}  // namespace sinter::cuda::emulator

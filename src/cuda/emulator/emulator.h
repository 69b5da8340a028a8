#pragma once
// The CUDA emulator (src/cuda/emulator/): runs libsinter_cuda's kernels on the CPU, so that the
// backend's own tests run where there is no GPU (CI, a desk), against the CPU kernels and the
// double-precision reference. Built as libsinter_cuda_emulated.so from the same sources
// (SINTER_CUDA_EMULATED), it owns a CUDA runtime and a cuBLASLt of its own (the headers beside
// this one: the subset src/cuda/ calls, synchronous on the host) and the kernels' world.

// Each thread of a block is a fiber on the launching thread, blocks run one after another, and
// __syncthreads and the warp shuffles switch between fibers; a barrier that some threads never
// reach fails the launch. It proves what each kernel computes, that every element is written (the
// allocator's NaN poison) and where a block must synchronize; not speed, memory ordering between
// blocks, nvcc's code or the vendor libraries (cuBLASLt here is a loop).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
// A stream. Work queued on it runs when queued, but while it captures a graph
// (cudaStreamBeginCapture) the work is recorded, not run, and an operation a graph cannot hold (a
// wait on it, a cudaFree) invalidates the capture, as on the device.
struct CUstream_st {
  bool capturing = false, invalidated = false;
  std::vector<std::function<void()>> recorded;
};
typedef struct CUstream_st* cudaStream_t;

namespace sinter::cuda::emulator {

// Where the running fiber is in its launch: CUDA's threadIdx, blockIdx, blockDim and gridDim.
struct Place {
  uint3 thread, block;
  dim3 block_dim, grid_dim;
};
extern thread_local const Place* here [[gnu::tls_model("initial-exec")]];

// Runs body once per thread of the grid, a block at a time; an error (a deadlock) becomes the
// launch's error, which cudaGetLastError returns.
void launch(dim3 grid, dim3 block, size_t smem, cudaStream_t s, const std::function<void()>& body);
// Runs work now, or records it where s is capturing (kernels, copies, the vendor libraries' calls).
inline void enqueue(cudaStream_t s, std::function<void()> work) {
  if (s && s->capturing) s->recorded.push_back(std::move(work));
  else work();
}
void* dynamic_shared();         // the running block's `smem` bytes
void sync_block();              // __syncthreads
void sync_warp(unsigned members);  // __syncwarp(members)
// The value `bits` of lane (this lane ^ lane_mask) of this warp, each lane offering its own. A
// full member mask while lanes of the warp have returned fails the launch (undefined on the device).
uint64_t exchange_xor(uint64_t bits, unsigned lane_mask, unsigned members);
// mma.sync m16n8k16 with bf16 A and B and f32 C (cuda/mma.cuh has the fragment layout): gathers
// the warp's fragments at one warp barrier (lanes that returned fail the launch), then adds this
// lane's four sums, k in order, to c. Out of line: inlined into unrolled kernels it made clang's
// ASan build of one kernel file take minutes.
void mma_bf16_16816(float c[4], const uint32_t a[4], const uint32_t b[2]);
// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 (cuda/mma.cuh): gathers the warp's row
// addresses at one warp barrier (lane l names row l % 8 of matrix l / 8), then fills this lane's
// four registers. A row outside the block's dynamic shared memory, or off a 16-byte boundary,
// fails the launch (undefined on the device).
void ldmatrix_x4(uint32_t r[4], const void* row, bool trans);
// A 16-byte access (strided.cuh's load_pack and store_pack) at an address off 16 bytes fails the
// launch, as the device faults on a misaligned vector access (the emulated access copies bytes,
// so the launch goes on to report it).
void check_aligned16(const void* p);

// Under AddressSanitizer: the bytes of a device block past what a tensor asked for are poisoned
// while it holds the block, so a kernel reading or writing past its tensor is reported (the
// allocator's size classes would hide it otherwise); unguard gives the whole block back.
void guard_tail(void* p, int64_t used, int64_t block);
void unguard(void* p, int64_t block);

template <class T> T shfl_xor(T v, unsigned lane_mask, unsigned members) {
  static_assert(sizeof(T) <= sizeof(uint64_t));
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof v);
  bits = exchange_xor(bits, lane_mask, members);
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

}  // namespace sinter::cuda::emulator

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static  // one block runs at a time: a static is the block's memory
#define threadIdx (::sinter::cuda::emulator::here->thread)
#define blockIdx (::sinter::cuda::emulator::here->block)
#define blockDim (::sinter::cuda::emulator::here->block_dim)
#define gridDim (::sinter::cuda::emulator::here->grid_dim)

inline void __syncthreads() { ::sinter::cuda::emulator::sync_block(); }
inline void __syncwarp(unsigned members = 0xffffffffu) { ::sinter::cuda::emulator::sync_warp(members); }
inline void __threadfence_system() {}
template <class T> T __shfl_xor_sync(unsigned members, T v, int lane_mask, int = 32) {
  return ::sinter::cuda::emulator::shfl_xor(v, unsigned(lane_mask), members);
}
inline float __uint_as_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t __float_as_uint(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
// One fiber runs at a time: the read-modify-writes are whole.
template <class T, class V> T atomicAdd(T* p, V v) {
  const T old = *p;
  *p = T(old + v);
  return old;
}
inline int atomicCAS(int* p, int compare, int v) {
  const int old = *p;
  if (old == compare) *p = v;
  return old;
}

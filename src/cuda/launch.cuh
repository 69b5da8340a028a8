#pragma once
// What every CUDA kernel file uses to launch: the dtype dispatch (a value of the storage type of a
// dtype, among those a kernel takes), typed device pointers, the one launch every kernel goes
// through (it checks the launch; in the emulated build, src/cuda/emulator/, it runs the kernel's
// threads on the CPU), a grid-stride launch on the output's device stream, and the block's
// dynamic shared memory.
#include <algorithm>
#include <cstdint>

#include "cuda/cuda.h"
#include "cuda/strided.cuh"

namespace sinter::cuda {

enum class Types { floating, numeric, all };
// Calls fn with a value of the storage type of `dt`, among the types `T` allows.
template <Types T, class Fn> void dispatch(DType dt, const char* op, Fn&& fn) {
  switch (dt) {
    case DType::f32: return fn(float{});
    case DType::f64: return fn(double{});
    case DType::bf16: return fn(BF16{});
    case DType::f16: return fn(F16{});
    default: break;
  }
  if constexpr (T != Types::floating) {
    switch (dt) {
      case DType::i8: return fn(int8_t{});
      case DType::u8: return fn(uint8_t{});
      case DType::i32: return fn(int32_t{});
      case DType::i64: return fn(int64_t{});
      default: break;
    }
  }
  if constexpr (T == Types::all)
    if (dt == DType::boolean) return fn(bool{});
  SINTER_THROW(DTypeError, "[", op, "] has no CUDA kernel for dtype ", dt);
}

template <class S> S* ptr(const Tensor& t) { return static_cast<S*>(t.data_ptr()); }

// kernel<<<grid, block, smem, s>>>(args...), then the launch's error, naming `op`.
template <class... P, class... A>
void launch_kernel(const char* op, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, A... args) {
#ifdef SINTER_CUDA_EMULATED
  emulator::launch(grid, block, smem, s, [=] { kernel(args...); });
#else
  kernel<<<grid, block, smem, s>>>(args...);
#endif
  check_launch(op);
}

// kernel(n, args...) over n items on `device`'s stream, grid-stride.
template <class K, class... Args> void launch_n(const char* op, int64_t n, int device, K kernel, Args... args) {
  if (n == 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, int64_t(1) << 16);
  launch_kernel(op, kernel, unsigned(blocks), kThreads, 0, stream(device), n, args...);
}

// The block's dynamic shared memory (the launch's `smem` bytes) as T.
template <class T> __device__ __forceinline__ T* dynamic_shared() {
#ifdef SINTER_CUDA_EMULATED
  return static_cast<T*>(emulator::dynamic_shared());
#else
  extern __shared__ __align__(16) unsigned char sinter_dynamic_shared[];
  return reinterpret_cast<T*>(sinter_dynamic_shared);
#endif
}
// ... over the output's elements.
template <class K, class... Args> void launch(const char* op, const Tensor& out, K kernel, Args... args) {
  launch_n(op, out.numel(), out.device().index, kernel, args...);
}

// Records what a kernel found wrong as the device's fault unless another kernel already has (the
// host raises it at its next wait). f's strings must be host pointers the kernel was passed: a
// string literal in device code is a device address the host cannot read.
__device__ inline void record_fault(DeviceFault* fault, const DeviceFault& f) {
  if (atomicCAS(&fault->set, 0, 1) != 0) return;
  fault->value = f.value, fault->position = f.position, fault->size = f.size, fault->length = f.length;
  fault->op = f.op, fault->what = f.what;
  __threadfence_system();
}

// `#pragma unroll` under nvcc (register arrays indexed by the loop stay in registers); nothing in
// the emulated build, where clang's ASan build took over ten minutes on one unrolled kernel file.
#ifdef SINTER_CUDA_EMULATED
#define SINTER_UNROLL
#else
#define SINTER_UNROLL _Pragma("unroll")
#endif

#define SINTER_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)

}  // namespace sinter::cuda

#pragma once
// Row-wise reductions for CUDA kernels that give each row of a contiguous (rows, n) matrix one
// block of kBlock threads: the combining rules (NaN wins a max or min, as on the CPU), a block-wide
// combination every thread receives, and the launch over rows.
#include <limits>
#include <type_traits>

#include "cuda/launch.cuh"

namespace sinter::cuda {

constexpr int kBlock = 256;

#define SINTER_ROWS(row, rows) for (int64_t row = blockIdx.x; row < rows; row += gridDim.x)

enum class Red { sum, prod, max, min };

template <Red R, class A> __device__ __forceinline__ A combine(A a, A b) {
  if constexpr (R == Red::sum) return a + b;
  else if constexpr (R == Red::prod) return a * b;
  else if constexpr (R == Red::max) return (a != a || a > b) ? a : b;  // NaN wins, as on the CPU
  else return (a != a || a < b) ? a : b;
}

// Every thread of the block gets the block's combination of v.
template <Red R, class A> __device__ A block_reduce(A v) {
  __shared__ __align__(8) unsigned char buf[32 * sizeof(double)];
  A* warp_vals = reinterpret_cast<A*>(buf);
  for (int o = 16; o > 0; o >>= 1) v = combine<R>(v, A(__shfl_xor_sync(0xffffffffu, v, o)));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  __syncthreads();  // buf may still be read from a previous call
  if (lane == 0) warp_vals[warp] = v;
  __syncthreads();
  v = warp_vals[0];
  for (int w = 1; w < warps; ++w) v = combine<R>(v, warp_vals[w]);
  return v;
}

template <Red R, class A> __device__ A identity() {
  if constexpr (R == Red::sum) return A(0);
  else if constexpr (R == Red::prod) return A(1);
  else if constexpr (R == Red::max) return std::is_floating_point_v<A> ? -std::numeric_limits<A>::infinity() : std::numeric_limits<A>::lowest();
  else return std::is_floating_point_v<A> ? std::numeric_limits<A>::infinity() : std::numeric_limits<A>::max();
}

template <class K, class... Args> void launch_rows(const char* op, const Tensor& t, int64_t rows, K kernel, Args... args) {
  if (rows == 0) return;
  launch_kernel(op, kernel, unsigned(std::min<int64_t>(rows, 65535)), kBlock, 0, stream(t.device().index), rows, args...);
}

}  // namespace sinter::cuda

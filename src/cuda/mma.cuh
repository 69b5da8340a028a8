#pragma once
// One warp's 16 x 8 x 16 product on the tensor cores, bf16 in and f32 accumulated (PTX's
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32), and its fragment layout. Lane l, with
// g = l / 4 and t = l % 4, holds two bf16 per 32-bit register (the lower index in the low half):
//   A (16 x 16): a[r] = row g + 8 (r % 2), columns 2t + 8 (r / 2) + {0, 1};
//   B (16 x 8):  b[r] = column g, rows 2t + 8 r + {0, 1};
//   C (16 x 8):  c[r] = row g + 8 (r / 2), column 2t + r % 2.
// The emulated build computes it in emulator.h's mma_bf16_16816 (f32 sums, k in order); the tensor
// cores add in their own order.
#include <cstdint>

#include "cuda/launch.cuh"

namespace sinter::cuda {

__device__ __forceinline__ uint32_t pack_bf16(uint16_t lo, uint16_t hi) { return uint32_t(lo) | uint32_t(hi) << 16; }

// Two consecutive bf16 (a fragment register's pair along a contiguous row).
__device__ __forceinline__ uint32_t pair(const uint16_t* p) { return pack_bf16(p[0], p[1]); }

// f32 to bf16 bits, to nearest even (strided.cuh's store).
__device__ __forceinline__ uint16_t bf16_bits(float v) {
  BF16 b;
  store(&b, v);
  return b.bits;
}

__device__ __forceinline__ void mma_bf16_16816(float c[4], const uint32_t a[4], const uint32_t b[2]) {
#ifdef SINTER_CUDA_EMULATED
  emulator::mma_bf16_16816(c, a, b);
#else
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

}  // namespace sinter::cuda

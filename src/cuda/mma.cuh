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

// The A fragment of a product's k-step from two C fragments of an earlier one (its n-tiles 2 kt and
// 2 kt + 1: C's rows and column pairs are A's), rounded to bf16.
__device__ __forceinline__ void a_from_c(uint32_t a[4], const float* c0, const float* c1) {
  a[0] = pack_bf16(bf16_bits(c0[0]), bf16_bits(c0[1])), a[1] = pack_bf16(bf16_bits(c0[2]), bf16_bits(c0[3]));
  a[2] = pack_bf16(bf16_bits(c1[0]), bf16_bits(c1[1])), a[3] = pack_bf16(bf16_bits(c1[2]), bf16_bits(c1[3]));
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: four 8 x 8 bf16 matrices from shared memory,
// lane l naming row l % 8 of matrix l / 8 (16 bytes, 16-byte aligned). Register m of lane l takes
// matrix m's row g, columns 2t and 2t + 1; transposed, its rows 2t and 2t + 1 of column g.
template <bool Trans> __device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const uint16_t* row) {
#ifdef SINTER_CUDA_EMULATED
  emulator::ldmatrix_x4(r, row, Trans);
#else
  const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
#endif
}

// The fragments of a bf16 tile in shared memory, row-major with a row stride of ld elements (a
// multiple of 8, the tile 16-byte aligned), each one ldmatrix:
// A, rows [0, 16) x columns [k0, k0 + 16).
__device__ __forceinline__ void load_a(uint32_t a[4], const uint16_t* tile, int ld, int k0) {
  const int lane = int(threadIdx.x) % 32;
  ldmatrix_x4<false>(a, tile + (lane % 16) * ld + k0 + 8 * (lane / 16));
}
// B of n-tiles [n0, n0 + 8) and [n0 + 8, n0 + 16) at k [k0, k0 + 16) from a tile of B^T (n by k).
__device__ __forceinline__ void load_b_nk(uint32_t b[2][2], const uint16_t* tile, int ld, int n0, int k0) {
  const int lane = int(threadIdx.x) % 32;
  uint32_t r[4];
  ldmatrix_x4<false>(r, tile + (n0 + 8 * (lane / 16) + lane % 8) * ld + k0 + 8 * (lane / 8 % 2));
  b[0][0] = r[0], b[0][1] = r[1], b[1][0] = r[2], b[1][1] = r[3];
}
// B of n-tiles [n0, n0 + 8) and [n0 + 8, n0 + 16) at k [k0, k0 + 16) from a tile of B (k by n).
__device__ __forceinline__ void load_b_kn(uint32_t b[2][2], const uint16_t* tile, int ld, int k0, int n0) {
  const int lane = int(threadIdx.x) % 32;
  uint32_t r[4];
  ldmatrix_x4<true>(r, tile + (k0 + lane % 16) * ld + n0 + 8 * (lane / 16));
  b[0][0] = r[0], b[0][1] = r[1], b[1][0] = r[2], b[1][1] = r[3];
}
// B of n-tile [n0, n0 + 8) at k [k0, k0 + 16) and [k0 + 16, k0 + 32) from a tile of B (k by n).
__device__ __forceinline__ void load_b_kn_2k(uint32_t b[2][2], const uint16_t* tile, int ld, int k0, int n0) {
  const int lane = int(threadIdx.x) % 32;
  uint32_t r[4];
  ldmatrix_x4<true>(r, tile + (k0 + lane) * ld + n0);
  b[0][0] = r[0], b[0][1] = r[1], b[1][0] = r[2], b[1][1] = r[3];
}

}  // namespace sinter::cuda

#pragma once
// The AMX flash kernels' operand packing (flash_amx.cpp, flash_amx_backward.cpp): bf16 rows of an
// operand laid out as TDPBF16PS reads its B tiles (pairs of bf16 in each 32-bit lane) and as an A
// tile of a transposed product reads it, zero past the operand's ends. row(n) gives row n's bf16
// values (as u16) or null past the last row. Include only where AMX-BF16 and AVX-512 are built.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "cpu/simd/amx.h"
#include "cpu/simd/transpose.h"

namespace sinter::detail {
namespace {

constexpr int64_t kTile = 512;  // u16 in a 1 KiB tile

// A thread's buffer, 64-byte aligned (a tile row split across two lines loads 3x slower), grown on demand.
struct AlignedBuffer {
  struct Free {
    void operator()(float* f) const { std::free(f); }
  };
  std::unique_ptr<float, Free> data;
  int64_t size = 0;
  float* at_least(int64_t n) {
    if (size < n) data.reset(static_cast<float*>(std::aligned_alloc(64, size_t((n + 15) / 16 * 64)))), size = n;
    return data.get();
  }
  uint16_t* u16(int64_t n) { return reinterpret_cast<uint16_t*>(at_least((n + 1) / 2)); }
};

using cpu::simd::first_bits32;
SINTER_INLINE __mmask16 bits16(int64_t lo, int64_t hi) {  // lanes [lo, hi) of 16
  lo = std::clamp<int64_t>(lo, 0, 16), hi = std::clamp<int64_t>(hi, lo, 16);
  return __mmask16(((1u << hi) - 1u) & ~((1u << lo) - 1u));
}
template <class Row> SINTER_INLINE __m512i load_row32(Row row, int64_t n, int64_t c0, int64_t cols) {
  const uint16_t* p = row(n);
  return p ? _mm512_maskz_loadu_epi16(first_bits32(cols - c0), p + c0) : _mm512_setzero_si512();
}

// B tiles of X Y^T from Y's rows r0 .. r0 + 15 (Y: rows x cols): tile kd (at out + kd kTile, one per
// 32 columns) holds in row i, per row n, columns 32 kd + 2i and + 1. One 16 x 16 transpose a tile.
template <class Row> void pack_column_pairs(Row row, int64_t r0, int64_t cols, uint16_t* out) {
  for (int64_t kd = 0; kd < (cols + 31) / 32; ++kd) {
    __m512i r[16];
    for (int n = 0; n < 16; ++n) r[n] = load_row32(row, r0 + n, 32 * kd, cols);
    cpu::simd::transpose16(r);
    for (int i = 0; i < 16; ++i) _mm512_storeu_si512(out + kd * kTile + 32 * i, r[i]);
  }
}

// The interleaving of two rows of 32 bf16: (a, b) -> lanes 0-15 of each in pairs, then 16-31.
struct Interleave {
  __m512i lo, hi;
  Interleave() {
    alignas(64) uint16_t l[32], h[32];
    for (int i = 0; i < 16; ++i) l[2 * i] = uint16_t(i), l[2 * i + 1] = uint16_t(32 + i), h[2 * i] = uint16_t(16 + i), h[2 * i + 1] = uint16_t(48 + i);
    lo = _mm512_load_si512(l), hi = _mm512_load_si512(h);
  }
};

// B tiles of X^T Y (and of P V) from Y's rows r0 .. r0 + 31: tile dt (at out + dt kTile, one per 16
// columns, rounded up to pairs) holds in row i, per column 16 dt + n, rows r0 + 2i and + 1.
template <class Row> void pack_row_pairs(Row row, int64_t r0, int64_t cols, uint16_t* out) {
  static const Interleave il;
  for (int64_t i = 0; i < 16; ++i)
    for (int64_t dd = 0; dd < (cols + 31) / 32; ++dd) {
      const __m512i a = load_row32(row, r0 + 2 * i, 32 * dd, cols), b = load_row32(row, r0 + 2 * i + 1, 32 * dd, cols);
      _mm512_storeu_si512(out + 2 * dd * kTile + 32 * i, _mm512_permutex2var_epi16(a, il.lo, b));
      _mm512_storeu_si512(out + (2 * dd + 1) * kTile + 32 * i, _mm512_permutex2var_epi16(a, il.hi, b));
    }
}

}  // namespace
}  // namespace sinter::detail

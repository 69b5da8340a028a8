#pragma once
// The tile unit (AMX, Intel Xeon from Sapphire Rapids) on Linux: whether this process may use it.
// Linux hands the tile registers to a process that asks (arch_prctl ARCH_REQ_XCOMP_PERM), asked
// once here; SINTER_AMX=0 keeps every kernel off the tile unit. The tile configuration every AMX
// kernel here uses: eight tiles of 16 rows x 64 bytes.
#include <cstdint>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace sinter::cpu::simd {

bool amx_ready();

#if defined(__AVX512F__)
// The first n of 32 lanes (none for n <= 0): a row's last bf16 loaded without reading past it.
inline __mmask32 first_bits32(int64_t n) { return n >= 32 ? ~__mmask32(0) : n <= 0 ? 0 : (__mmask32(1) << n) - 1; }
#endif

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

}  // namespace sinter::cpu::simd

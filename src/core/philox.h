#pragma once
// One Philox4x32-10 block: four 32-bit outputs for (key = seed, counter), and a uniform draw from
// a stream of them. The CPU (random.cpp) and the CUDA kernels (src/cuda/) share both, so both draw
// the same numbers.
#include <cstdint>

#ifndef SINTER_HD
#define SINTER_HD
#endif

namespace sinter::detail {

SINTER_HD inline void philox_block(uint64_t seed, uint64_t counter, uint32_t out[4]) {
  uint32_t c0 = uint32_t(counter), c1 = uint32_t(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    const uint64_t p0 = uint64_t(0xD2511F53u) * c0, p1 = uint64_t(0xCD9E8D57u) * c2;
    const uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0, n2 = uint32_t(p0 >> 32) ^ c3 ^ k1;
    c0 = n0; c1 = uint32_t(p1); c2 = n2; c3 = uint32_t(p0);
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

// The i-th uniform draw in [0, 1) of the stream (seed, counter): 24 random bits, exactly a float.
SINTER_HD inline float philox_uniform(uint64_t seed, uint64_t counter, uint64_t i) {
  uint32_t r[4];
  philox_block(seed, counter + i / 4, r);
  return float(r[i % 4] >> 8) * (1.0f / 16777216.0f);
}

}  // namespace sinter::detail

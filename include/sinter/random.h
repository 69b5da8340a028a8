#pragma once
// Counter-based random numbers (Philox 4x32-10): element i of a draw depends only on the seed,
// the generator's offset and i, never on the thread count or on how work is split.
#include <cstdint>

namespace sinter {

void manual_seed(uint64_t seed);

struct Generator {
  uint64_t seed = 0x5eed;
  uint64_t offset = 0;  // in 128-bit Philox blocks consumed
  // Reserves `n` blocks; returns the first counter of the reservation.
  uint64_t reserve(uint64_t n) { uint64_t o = offset; offset += n; return o; }
};
Generator& default_generator();

struct PhiloxState { uint64_t seed, counter; };

// One Philox4x32-10 block: four 32-bit outputs for (key = seed, counter).
void philox(uint64_t seed, uint64_t counter, uint32_t out[4]);
// The uniform float in [0, 1) drawn for element i of a reservation starting at `counter`.
float philox_uniform(uint64_t seed, uint64_t counter, uint64_t i);

}  // namespace sinter

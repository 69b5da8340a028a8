#include "sinter/random.h"

#include "core/philox.h"

namespace sinter {

Generator& default_generator() {
  static Generator g;
  return g;
}

void manual_seed(uint64_t seed) {
  default_generator().seed = seed;
  default_generator().offset = 0;
}

void philox(uint64_t seed, uint64_t counter, uint32_t out[4]) { detail::philox_block(seed, counter, out); }

float philox_uniform(uint64_t seed, uint64_t counter, uint64_t i) {
  uint32_t r[4];
  philox(seed, counter + i / 4, r);
  return float(r[i % 4] >> 8) * (1.0f / 16777216.0f);  // 24 random bits: exactly representable
}

}  // namespace sinter

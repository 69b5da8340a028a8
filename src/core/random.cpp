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

float philox_uniform(uint64_t seed, uint64_t counter, uint64_t i) { return detail::philox_uniform(seed, counter, i); }

}  // namespace sinter

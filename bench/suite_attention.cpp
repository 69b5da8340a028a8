// Causal attention, B=1, H=16: the flash backend against the math backend, and PyTorch's SDPA.
#include <sinter/sinter.h>

#include "harness.h"

namespace sinter::bench {

void suite_attention(const Options& o, Report& r) {
  NoGradGuard g;
  manual_seed(0);
  for (int64_t D : {64, 128}) {
    for (int64_t S : o.quick ? std::vector<int64_t>{512} : std::vector<int64_t>{512, 2048}) {
      Tensor q = randn({1, 16, S, D}), k = randn({1, 16, S, D}), v = randn({1, 16, S, D});
      auto run = [&](SDPABackend b) { (void)scaled_dot_product_attention(q, k, v, {}, 0.0, true, {}, false, b); };
      const Timing tf = time_it([&] { run(SDPABackend::flash); }, 1, 3, 0);
      const Timing tm = time_it([&] { run(SDPABackend::math); }, 1, 3, 0);
      const std::string name = "causal D=" + std::to_string(D) + " S=" + std::to_string(S) + " fwd";
      // Extra memory beyond inputs/outputs: math holds (H, S, S) scores and their softmax.
      char note[96];
      std::snprintf(note, sizeof note, "math holds %.0f MiB of scores", 2.0 * 16 * double(S * S) * 4 / (1 << 20));
      r.add(name, tf, "Sinter math backend", tm, note);
    }
  }
}

}  // namespace sinter::bench

// Causal attention, B=1, H=16: the flash backend against the math backend, and PyTorch's SDPA.
#include <sinter/sinter.h>

#include "harness.h"

namespace sinter::bench {

void suite_attention(const Options& o, Report& r) {
  manual_seed(0);
  const double peak = fma_peak_gflops();
  r.line("fp32 FMA peak measured in this run: " + std::to_string(int(peak)) + " GFLOP/s");
  for (int64_t D : {64, 128}) {
    for (int64_t S : o.quick ? std::vector<int64_t>{512} : std::vector<int64_t>{512, 2048}) {
      Tensor q = randn({1, 16, S, D}), k = randn({1, 16, S, D}), v = randn({1, 16, S, D}), dout = randn({1, 16, S, D});
      auto fwd = [&](SDPABackend b) {
        NoGradGuard g;
        (void)scaled_dot_product_attention(q, k, v, {}, 0.0, true, {}, false, b);
      };
      auto fwd_bwd = [&](SDPABackend b) {
        Tensor qg = q.detach().requires_grad_(), kg = k.detach().requires_grad_(), vg = v.detach().requires_grad_();
        scaled_dot_product_attention(qg, kg, vg, {}, 0.0, true, {}, false, b).backward(dout);
      };
      // Useful FLOPs of causal attention: QK^T and PV over the visible half, 2 flops per FMA;
      // the backward does 2.5x the forward's.
      const double flop = 2.0 * 2.0 * 16 * double(S) * double(S + 1) / 2 * double(D);
      const std::string base = "causal D=" + std::to_string(D) + " S=" + std::to_string(S);
      for (bool with_bwd : {false, true}) {
        auto run = [&](SDPABackend b) { with_bwd ? fwd_bwd(b) : fwd(b); };
        const Timing tf = time_it([&] { run(SDPABackend::flash); }, 1, 3, 0);
        const Timing tm = time_it([&] { run(SDPABackend::math); }, 1, 3, 0);
        const double gf = flop * (with_bwd ? 3.5 : 1.0) / (tf.best_ms * 1e-3) / 1e9;
        // Extra memory beyond inputs/outputs: math holds (H, S, S) scores and their softmax.
        char note[128];
        std::snprintf(note, sizeof note, "flash %.0f GFLOP/s = %.0f%% of peak; math holds %.0f MiB of scores", gf, 100 * gf / peak,
                      2.0 * 16 * double(S * S) * 4 / (1 << 20));
        r.add(base + (with_bwd ? " fwd+bwd" : " fwd"), tf, "Sinter math backend", tm, note);
      }
    }
  }
}

}  // namespace sinter::bench

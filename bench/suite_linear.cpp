// linear(x, w) through the op table against raw oneDNN matmul primitives made once and executed
// repeatedly, on the same weights: plain (N, K) row-major, as our Linear keeps them, and
// prepacked into oneDNN's preferred blocked layout (the library's best case). bf16 against f32.
#include <dnnl.hpp>
#include <sinter/sinter.h>

#include "cpu/cpu.h"
#include "dnnl_peer.h"
#include "harness.h"

namespace sinter::bench {

void suite_linear(const Options& o, Report& r) {
  NoGradGuard no_grad;
  manual_seed(0);
  const double peak = fma_peak_gflops();
  r.line("fp32 FMA peak measured in this run: " + std::to_string(int(peak)) + " GFLOP/s");
  const int64_t K = 4096, N = 4096;
  const std::vector<int64_t> ms = o.quick ? std::vector<int64_t>{1, 128} : std::vector<int64_t>{1, 4, 32, 128, 512};
  std::map<int64_t, Timing> f32_time;
  r.expect(int(2 * ms.size()));
  for (DType dt : {DType::f32, DType::bf16}) {
    const std::string dn = dt == DType::f32 ? "f32" : "bf16";
    Tensor w = (randn({N, K}) * 0.02).to(dt);
    for (int64_t M : ms) {
      Tensor x = randn({M, K}).to(dt), y = Tensor::empty({M, N}, dt);
      auto ours_fn = [&] { (void)linear(x, w); };
      Timing ours = time_it(ours_fn);
      const double flop = 2.0 * double(M * K * N);
      char buf[96];
      std::snprintf(buf, sizeof buf, "%.0f GFLOP/s = %.0f%% of fp32 peak", flop / (ours.best_ms * 1e-3) / 1e9,
                    100 * flop / (ours.best_ms * 1e-3) / 1e9 / peak);
      std::string note = buf;
      const std::string name = "linear " + dn + " M=" + std::to_string(M) + " K=4096 N=4096";
      if (dt == DType::f32 || cpu::dnnl_has_bf16()) {
        RawMatmul plain(x, w, y, false), packed(x, w, y, true);
        auto [o1, p1] = time_pair(ours_fn, [&] { plain.run(); });
        r.add(name, o1, "oneDNN matmul, plain weights", p1, note);
        auto [o2, p2] = time_pair(ours_fn, [&] { packed.run(); });
        r.add(name, o2, "oneDNN matmul, prepacked weights", p2, note);
        ours = o1.best_ms < o2.best_ms ? o1 : o2;
      } else {
        note += M <= 8 ? "; oneDNN has no bf16 matmul on this CPU: bf16 weights read as they are"
                       : "; oneDNN has no bf16 matmul on this CPU: widened to f32";
      }
      if (dt == DType::f32) f32_time[M] = ours;
      else r.add(name, ours, "Sinter linear f32, same shape", f32_time[M], note);
    }
  }
}

}  // namespace sinter::bench

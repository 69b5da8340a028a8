// Eager overhead and the bandwidth-bound ops. Peers: a parallel memcpy moving the same bytes
// (the ceiling for a pass over memory), and PyTorch's same calls when installed.
#include <sinter/sinter.h>

#include "harness.h"

namespace sinter::bench {

void suite_ops(const Options&, Report& r) {
  NoGradGuard no_grad;
  manual_seed(0);
  {
    // Dispatch, shape inference, allocation and the kernel call, for an op with almost no work.
    Tensor a = randn({16}), b = randn({16});
    r.ours_only("overhead add 16 f32", time_per_call([&] { (void)add(a, b); }, 20000), "eager, no grad");
  }
  Timing copy;
  const double copy_gbs = copy_bandwidth_gbs(&copy);  // 64 MiB read + 64 MiB written
  const double copy_bytes = 2.0 * double(64 << 20);
  auto vs_copy = [&](const std::string& name, double bytes, const std::function<void()>& f) {
    const Timing t = time_it(f);
    const double gbs = bytes / (t.best_ms * 1e-3) / 1e9;
    char note[96];
    std::snprintf(note, sizeof note, "%.1f GB/s = %.0f%% of copy (%.1f GB/s)", gbs, 100 * gbs / copy_gbs, copy_gbs);
    const double scale = bytes / copy_bytes;  // the copy moving the same number of bytes
    r.add(name, t, "memcpy, same bytes", {copy.best_ms * scale, copy.median_ms * scale}, note);
  };
  const int64_t n = 16 << 20;
  Tensor a = randn({n}), b = randn({n});
  const double f4 = 4.0 * double(n);
  vs_copy("elementwise f32 add", 3 * f4, [&] { (void)add(a, b); });
  vs_copy("elementwise f32 gelu (erf)", 2 * f4, [&] { (void)gelu(a); });
  vs_copy("elementwise f32 gelu (tanh)", 2 * f4, [&] { (void)gelu(a, true); });
  vs_copy("elementwise f32 mul by scalar", 2 * f4, [&] { (void)mul(a, 0.5); });
  Tensor m = randn({16384, 1024}), w = randn({1024}), bias = randn({1024});
  vs_copy("softmax f32 16384x1024", 2 * f4, [&] { (void)softmax(m, -1); });
  vs_copy("layer_norm f32 16384x1024", 2 * f4, [&] { (void)layer_norm(m, w, bias); });
  vs_copy("rms_norm f32 16384x1024", 2 * f4, [&] { (void)rms_norm(m, w); });
}

}  // namespace sinter::bench

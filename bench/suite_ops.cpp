// Eager overhead and the bandwidth-bound ops. Peers: a parallel memcpy moving the same bytes
// (the ceiling for a pass over memory), and PyTorch's same calls when installed.
#include <cstring>
#include <sinter/sinter.h>

#include "core/parallel.h"

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
  // The peer: a 2-thread memcpy moving the same number of bytes (read + written), timed in
  // alternation with the op.
  auto vs_copy = [&](const std::string& name, double bytes, const std::function<void()>& f) {
    const int64_t n = int64_t(bytes / 2);
    Tensor src = Tensor::empty({n}, DType::u8), dst = Tensor::empty({n}, DType::u8);
    std::memset(src.data_ptr(), 1, size_t(n));
    auto copy = [&] {
      parallel_for(0, n, 1 << 20, [&](int64_t lo, int64_t hi) {
        std::memcpy(static_cast<char*>(dst.data_ptr()) + lo, static_cast<const char*>(src.data_ptr()) + lo, size_t(hi - lo));
      });
    };
    const auto [t, c] = time_pair(f, copy);
    const double gbs = bytes / (t.best_ms * 1e-3) / 1e9, copy_gbs = bytes / (c.best_ms * 1e-3) / 1e9;
    char note[96];
    std::snprintf(note, sizeof note, "%.1f GB/s = %.0f%% of copy (%.1f GB/s)", gbs, 100 * gbs / copy_gbs, copy_gbs);
    r.add(name, t, "memcpy, same bytes", c, note);
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

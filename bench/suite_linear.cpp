// linear(x, w) through the op table against raw oneDNN matmul primitives made once and executed
// repeatedly, on the same weights: plain (N, K) row-major, as our Linear keeps them, and
// prepacked into oneDNN's preferred blocked layout (the library's best case). bf16 against f32.
// Decode rows (one row of x, weights past the cache) are held to a plain read of the weight's
// bytes in the same rounds: a one-row product must stream its weights once, at memory speed.
#include <dnnl.hpp>
#include <sinter/sinter.h>

#include "cpu/cpu.h"
#include "dnnl_peer.h"
#include "harness.h"

namespace sinter::bench {
namespace {

// Reads `bytes` at p once on all threads (8-byte words summed, so nothing is skipped): the
// bandwidth a kernel streaming the same bytes can reach.
uint64_t plain_read(const void* p, int64_t bytes) {
  const auto* w = static_cast<const uint64_t*>(p);
  const int64_t n = bytes / 8;
  std::vector<uint64_t> sums(size_t(num_threads()) * 8, 0);
  parallel_for(0, n, 1 << 16, [&](int64_t lo, int64_t hi) {
    uint64_t s[8] = {};
    int64_t i = lo;
    for (; i + 8 <= hi; i += 8)
      for (int j = 0; j < 8; ++j) s[j] += w[i + j];
    for (; i < hi; ++i) s[0] += w[i];
    uint64_t t = 0;
    for (uint64_t v : s) t += v;
    sums[size_t(omp_get_thread_num()) * 8] += t;
  });
  uint64_t t = 0;
  for (uint64_t v : sums) t += v;
  return t;
}

// One row of x against weights of LLaMA-13B's MLP sizes (283 MB in f32): the plain read of the
// weight's bytes and oneDNN's matmul on the same call.
void decode_rows(const Options& o, Report& r) {
  const std::vector<std::pair<int64_t, int64_t>> shapes =
      o.quick ? std::vector<std::pair<int64_t, int64_t>>{{5120, 13824}} : std::vector<std::pair<int64_t, int64_t>>{{5120, 13824}, {13824, 5120}};
  for (DType dt : {DType::f32, DType::bf16})
    for (auto [K, N] : shapes) {
      Tensor w = (randn({N, K}) * 0.02).to(dt), x = randn({1, K}).to(dt), y = Tensor::empty({1, N}, dt);
      const std::string name = std::string("linear ") + (dt == DType::f32 ? "f32" : "bf16") + " M=1 K=" + std::to_string(K) +
                               " N=" + std::to_string(N);
      const int64_t bytes = w.numel() * dtype_size(dt);
      const double mb = double(bytes) / 1e6;
      auto ours_fn = [&] { (void)linear(x, w); };
      volatile uint64_t sink = 0;
      auto [o1, p1] = time_pair(ours_fn, [&] { sink = sink + plain_read(w.data_ptr(), bytes); });
      char note[128];
      std::snprintf(note, sizeof note, "weights %.0f MB: ours %.1f GB/s, plain read %.1f GB/s", mb, mb / o1.best_ms,
                    mb / p1.best_ms);
      r.add(name, o1, "plain read of the weight's bytes", p1, note);
      if (dt == DType::f32 || cpu::dnnl_has_bf16()) {
        RawMatmul plain(x, w, y, false);
        auto [o2, p2] = time_pair(ours_fn, [&] { plain.run(); });
        r.add(name, o2, "oneDNN matmul, plain weights", p2);
      }
    }
}

}  // namespace

void suite_linear(const Options& o, Report& r) {
  NoGradGuard no_grad;
  manual_seed(0);
  const double peak = fma_peak_gflops();
  r.line("fp32 FMA peak measured in this run: " + std::to_string(int(peak)) + " GFLOP/s");
  const int64_t K = 4096, N = 4096;
  const std::vector<int64_t> ms = o.quick ? std::vector<int64_t>{1, 128} : std::vector<int64_t>{1, 4, 32, 128, 512};
  std::map<int64_t, Timing> f32_time;
  r.expect(int(2 * ms.size()) + (o.quick ? 2 : 4));
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
  decode_rows(o, r);
}

}  // namespace sinter::bench

// Causal attention, B=1, H=16: the flash backend against the baseline a careful user would write
// (scores head by head with the library GEMM, causal softmax, times V; autograd per head), against
// Sinter's math backend (all heads at once) where its scores fit, and PyTorch's SDPA. Extra memory
// is the peak of tensors held during the call beyond what was live before it. Decode rows: one
// query row per head against a long KV cache, GQA 4:1, as bandwidth against a copy. Masked rows:
// the automatic backend choice against the faster backend.
#include <cmath>
#include <sinter/sinter.h>

#include "core/allocator.h"
#include "core/parallel.h"
#include "harness.h"

namespace sinter::bench {
namespace {

// Runs f once more and returns the most tensor memory it held beyond what was live before and
// beyond its results (`result_bytes`: the output, and the input gradients with a backward), in MiB.
template <class F> double extra_mib(F&& f, double result_bytes) {
  const int64_t before = cpu_live_bytes();
  cpu_reset_peak();
  f();
  return (double(cpu_peak_bytes() - before) - result_bytes) / (1 << 20);
}

// Keeps every head's output (and input gradients) until it returns, as a full call would.
void per_head_math(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout, bool backward) {
  const int64_t H = q.size(1);
  const double scale = 1.0 / std::sqrt(double(q.size(3)));
  std::vector<Tensor> results;
  for (int64_t h = 0; h < H; ++h) {
    Tensor qh = q.select(1, h), kh = k.select(1, h), vh = v.select(1, h);  // (1, S, D)
    if (backward) qh = qh.detach().requires_grad_(), kh = kh.detach().requires_grad_(), vh = vh.detach().requires_grad_();
    Tensor o = matmul(causal_softmax(matmul(qh * scale, kh.transpose(-1, -2)), 0), vh);
    if (backward) {
      o.backward(dout.select(1, h));
      results.insert(results.end(), {qh.grad(), kh.grad(), vh.grad()});
    }
    results.push_back(o.detach());
  }
}

}  // namespace

void suite_attention(const Options& o, Report& r) {
  manual_seed(0);
  const double peak = fma_peak_gflops();
  r.line("fp32 FMA peak measured in this run: " + std::to_string(int(peak)) + " GFLOP/s");
  const int64_t H = 16;
  r.expect(2 * (o.quick ? 1 : 3) * 2 + 2 + (o.quick ? 1 : 3) * 2);  // D x S x (fwd, fwd+bwd), two decode cases, masked rows
  for (int64_t D : {64, 128}) {
    for (int64_t S : o.quick ? std::vector<int64_t>{512} : std::vector<int64_t>{512, 2048, 8192}) {
      Tensor q = randn({1, H, S, D}), k = randn({1, H, S, D}), v = randn({1, H, S, D}), dout = randn({1, H, S, D});
      auto sdpa = [&](SDPABackend b, bool with_bwd) {
        if (!with_bwd) {
          NoGradGuard g;
          (void)scaled_dot_product_attention(q, k, v, {}, 0.0, true, {}, false, b);
          return;
        }
        Tensor qg = q.detach().requires_grad_(), kg = k.detach().requires_grad_(), vg = v.detach().requires_grad_();
        scaled_dot_product_attention(qg, kg, vg, {}, 0.0, true, {}, false, b).backward(dout);
      };
      // Useful FLOPs of causal attention: QK^T and PV over the visible half, 2 per FMA; the
      // backward does 2.5x the forward's.
      const double flop = 2.0 * 2.0 * double(H) * double(S) * double(S + 1) / 2 * double(D);
      const std::string base = "causal D=" + std::to_string(D) + " S=" + std::to_string(S);
      const int reps = S >= 8192 ? 2 : 3;
      for (bool with_bwd : {false, true}) {
        const double result_bytes = double(H * S * D) * 4 * (with_bwd ? 4 : 1);
        // Flash's per-thread tiles live outside the allocator: added by their size (64 x 64 tiles of
        // Q, S, O, K^T forward; K^T, V^T, P, dS, Q and delta backward).
        const double tiles = double(num_threads()) * 4 *
                             (with_bwd ? double(3 * 64 * D + 2 * 64 * 64 + S) : double(3 * 64 * D + 64 * 64 + 2 * 64));
        const double mem_flash =
            extra_mib([&] { sdpa(SDPABackend::flash, with_bwd); }, result_bytes) + tiles / (1 << 20);
        auto head = [&] {
          if (with_bwd) {
            per_head_math(q, k, v, dout, true);
          } else {
            NoGradGuard g;
            per_head_math(q, k, v, dout, false);
          }
        };
        // Flash and the per-head baseline timed alternately (best of `reps` after a warm-up each),
        // so a noisy neighbour slows both alike.
        const auto [tf, th] = time_pair([&] { sdpa(SDPABackend::flash, with_bwd); }, head, 1, reps, 0);
        const double mem_head = extra_mib(head, result_bytes);
        const double gf = flop * (with_bwd ? 3.5 : 1.0) / (tf.best_ms * 1e-3) / 1e9;
        char note[200];
        std::snprintf(note, sizeof note, "flash %.0f GFLOP/s = %.0f%% of peak; extra memory: flash %.2f MiB, per-head math %.1f MiB (1/%.0f)",
                      gf, 100 * gf / peak, mem_flash, mem_head, mem_head / std::max(mem_flash, 1e-3));
        const std::string name = base + (with_bwd ? " fwd+bwd" : " fwd");
        r.add(name, tf, "math per head (oneDNN GEMM)", th, note);
        if (S <= 2048) r.add(name, tf, "Sinter math backend, all heads", time_it([&] { sdpa(SDPABackend::math, with_bwd); }, 1, reps, 0), note);
      }
    }
  }
  // Masked (not causal) attention, B=1, H=8, D=64, forward: the automatic choice against the faster
  // of the two backends (found by timing both alternately), timed alternately with it
  // (sdpa_choose's rule weighs the mask's kind and size).
  for (int64_t L : o.quick ? std::vector<int64_t>{512} : std::vector<int64_t>{512, 1000, 4096}) {
    for (bool boolean : {false, true}) {
      NoGradGuard g;
      Tensor q = randn({1, 8, L, 64}), k = randn({1, 8, L, 64}), v = randn({1, 8, L, 64});
      const Tensor m = boolean ? gt(randn({1, 1, L, L}), full({}, -1.0)) : randn({1, 1, L, L});
      auto run = [&](SDPABackend b) { (void)scaled_dot_product_attention(q, k, v, m, 0.0, false, {}, false, b); };
      const int reps = L >= 4096 ? 3 : 8;
      const auto [tf, tm] = time_pair([&] { run(SDPABackend::flash); }, [&] { run(SDPABackend::math); }, 1, reps, 0);
      const bool flash_faster = tf.best_ms <= tm.best_ms;
      // The automatic choice alternating with the faster backend in the same rounds: on a shared
      // machine two timings of one kernel taken apart differ by more than the 5% this row checks.
      const SDPABackend faster = flash_faster ? SDPABackend::flash : SDPABackend::math;
      const auto [ta, tb] = time_pair([&] { run(SDPABackend::automatic); }, [&] { run(faster); }, 1, reps, 0);
      const SDPAChoice c = sdpa_choose(q, k, m, 0.0);
      char note[200];
      std::snprintf(note, sizeof note, "chose %s; flash %.2f ms, math %.2f ms", c.backend == SDPABackend::flash ? "flash" : "math",
                    tf.best_ms, tm.best_ms);
      r.add(std::string(boolean ? "mask bool" : "mask additive") + " D=64 L=" + std::to_string(L) + " fwd, automatic", ta,
            flash_faster ? "flash (the faster here)" : "math (the faster here)", tb, note);
    }
  }
  // Decode: 16 query heads sharing 4 KV heads, one new token against Lkv cached positions.
  Timing copy;
  const double copy_gbs = copy_bandwidth_gbs(&copy);
  for (int64_t L : {int64_t(2048), int64_t(8192)}) {
    NoGradGuard g;
    const int64_t D = 128;
    Tensor q = randn({1, 16, 1, D}), k = randn({1, 4, L, D}), v = randn({1, 4, L, D});
    const Timing t = time_it([&] { (void)scaled_dot_product_attention(q, k, v, {}, 0.0, true, {}, true, SDPABackend::flash); });
    const double bytes = 2.0 * 4 * double(L) * D * 4, gbs = bytes / (t.best_ms * 1e-3) / 1e9;
    char note[160];
    std::snprintf(note, sizeof note, "reads K and V (%.0f MiB) at %.1f GB/s = %.0f%% of copy (%.1f GB/s)", bytes / (1 << 20), gbs,
                  100 * gbs / copy_gbs, copy_gbs);
    // The peer: a copy moving the same number of bytes (read + write) as the decode step reads.
    const double scale = bytes / (2.0 * double(64 << 20));
    r.add("decode GQA 16:4 D=128 Lkv=" + std::to_string(L), t, "memcpy, same bytes", {copy.best_ms * scale, copy.median_ms * scale},
          note);
  }
}

}  // namespace sinter::bench

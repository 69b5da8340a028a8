// 2:4 sparse linear against oneDNN's dense matmul on the same (pruned) weights, with the weights
// plain or prepacked in oneDNN's blocked layout, whichever is faster, timed alternately in one run.
// f32, int8 and bf16 values; decode sizes (M = 1, 4, 16: memory-bound, 2:4 halves the bytes), the
// sizes between (M = 32) and compute-bound sizes (M = 128 ... 2048). Our weights are prepacked too
// (SemiStructuredSparse::prepack, read where the kernel choice prefers it: src/cpu/sparse24/kernels.h);
// the note of the rows where a prepacked copy can serve gives the ratio from values + meta alone,
// timed right after. f32 rows at M = 4, 16, 32 are timed again with the prepacked layout as the
// weight's only copy (prepack(replace=true)), as a server holds it. Rows where
// Sinter's own dense kernel beats oneDNN's (M <= 8: f32 at M >= 2, bf16 weights) are timed
// against it too. Last, end to end: generation with a 2:4 model against the dense model with the
// same pruned weights (the default model and a 1024-wide one).
#include <dnnl.hpp>
#include <sinter/sinter.h>
#include <sinter/train.h>

#include <fstream>
#include <sstream>
#include <tuple>

#include "cpu/cpu.h"
#include "dnnl_peer.h"
#include "harness.h"
#include "cpu/sparse24/kernels.h"

namespace sinter::bench {

void suite_sparse(const Options& o, Report& r) {
  NoGradGuard no_grad;
  manual_seed(0);
  const double peak = fma_peak_gflops(), copy_gbs = copy_bandwidth_gbs();
  char head[160];
  std::snprintf(head, sizeof head, "fp32 FMA peak measured in this run: %.0f GFLOP/s; copy bandwidth %.1f GB/s", peak, copy_gbs);
  r.line(head);
  const std::vector<std::pair<int64_t, int64_t>> shapes = o.quick ? std::vector<std::pair<int64_t, int64_t>>{{4096, 4096}}
                                                                  : std::vector<std::pair<int64_t, int64_t>>{{4096, 4096}, {4096, 11008}, {11008, 4096}};
  struct Plan { const char* name; DType vt; std::vector<int64_t> ms; };
  const std::vector<Plan> plans = o.quick ? std::vector<Plan>{{"f32", DType::f32, {1, 128}}, {"int8", DType::i8, {1}}}
                                          : std::vector<Plan>{{"f32", DType::f32, {1, 4, 16, 32, 128, 512, 2048}},
                                                              {"int8", DType::i8, {1, 4, 16, 128}},
                                                              {"bf16", DType::bf16, {1, 16, 128}}};
  size_t cases = o.quick ? 0 : 3 * 2 * 2 + 2 * 3;  // the (nn::Linear) and generate rows below
  for (const Plan& p : plans) cases += shapes.size() * p.ms.size();
  if (!o.quick) cases += shapes.size() * 3;  // the one-copy rows (f32, M = 4, 16, 32)
  r.expect(int(cases));
  for (auto [K, N] : shapes) {
    Tensor w = prune_2_4(randn({N, K}) * 0.02);
    for (const Plan& p : plans) {
      SemiStructuredSparse s = to_sparse_semi_structured(w, p.vt);
      const SemiStructuredSparse unpacked{s.values, s.meta, s.scales};
      SemiStructuredSparse one_copy{s.values, s.meta, s.scales};
      one_copy.prepack(/*replace=*/true);  // the serving layout alone
      s.prepack();  // as the dense peer may be (oneDNN's blocked layout)
      // The dense peer: the same weights in the dtype oneDNN can run (f32 for int8 values: oneDNN
      // 2.6 has no weight-only int8; f32 for bf16 where the CPU has no bf16 matmul).
      const bool bf16_dense = p.vt == DType::bf16 && cpu::dnnl_has_bf16();
      const DType dense_dt = bf16_dense ? DType::bf16 : DType::f32;
      Tensor wd = s.to_dense().to(dense_dt);
      for (int64_t M : p.ms) {
        const DType xt = p.vt == DType::bf16 ? DType::bf16 : DType::f32;
        Tensor x = randn({M, K}).to(xt), xd = x.to(dense_dt), y = Tensor::empty({M, N}, dense_dt);
        // oneDNN's best dense kernel for the shape: weights plain or prepacked in its blocked
        // layout, whichever runs faster here (on AVX2 the blocked layout is sometimes slower).
        RawMatmul plain(xd, wd, y, false), packed(xd, wd, y, true);
        const int reps = M >= 512 ? 5 : 15;
        const bool use_packed = time_it([&] { packed.run(); }, 1, 3, 0).best_ms < time_it([&] { plain.run(); }, 1, 3, 0).best_ms;
        RawMatmul& dense = use_packed ? packed : plain;
        auto [ours, peer] = time_pair([&] { (void)linear(x, s); }, [&] { dense.run(); }, 1, reps, M >= 512 ? 0.0 : 0.6);
        char note[200];
        const double dense_mb = double(N * K * (dense_dt == DType::f32 ? 4 : 2)) / 1e6, sparse_mb = double(s.nbytes()) / 1e6;
        if (M <= 16)
          std::snprintf(note, sizeof note, "weights %.1f MB vs dense %.1f MB; sparse reads %.1f GB/s (copy %.1f)", sparse_mb, dense_mb,
                        sparse_mb / 1e3 / (ours.best_ms * 1e-3), copy_gbs);
        else
          std::snprintf(note, sizeof note, "dense-equivalent %.0f GFLOP/s = %.0f%% of fp32 peak; dense %.0f%%",
                        2.0 * M * N * K / (ours.best_ms * 1e-3) / 1e9, 100 * 2.0 * M * N * K / (ours.best_ms * 1e-3) / 1e9 / peak,
                        100 * 2.0 * M * N * K / (peer.best_ms * 1e-3) / 1e9 / peak);
        std::string peer_name = std::string("oneDNN dense ") + (dense_dt == DType::f32 ? "f32" : "bf16") + (use_packed ? ", prepacked" : ", plain");
        std::string n = note;
        if (sparse::prepacked_serves(p.vt, M)) {
          const Timing u = time_it([&] { (void)linear(x, unpacked); }, 1, reps, M >= 512 ? 0.0 : 0.3);
          char more[120];
          std::snprintf(more, sizeof more, "; prepacked (values + meta alone: %.3g ms, %.2fx)", u.best_ms, peer.best_ms / u.best_ms);
          n += more;
        }
        if (p.vt == DType::i8) n += "; no int8-weight dense kernel in oneDNN 2.6: against f32";
        if (p.vt == DType::bf16 && !bf16_dense) n += "; no bf16 matmul on this CPU: against f32";
        const std::string row = std::string(p.name) + " M=" + std::to_string(M) + " K=" + std::to_string(K) + " N=" + std::to_string(N);
        r.add(row, ours, peer_name, peer, n);
        // One copy of the weight, for serving: prepack(replace=true), the layout read at every M.
        if (p.vt == DType::f32 && (M == 4 || M == 16 || M == 32)) {
          auto [one, peer1] = time_pair([&] { (void)linear(x, one_copy); }, [&] { dense.run(); }, 1, reps, 0.6);
          char one_note[200];
          std::snprintf(one_note, sizeof one_note, "weights %.1f MB = %.2fx dense, the only copy (values + meta alone: %.2fx dense bytes)",
                        double(one_copy.nbytes()) / 1e6, double(one_copy.nbytes()) / 1e6 / dense_mb, sparse_mb / dense_mb);
          r.add(row + " one copy (prepack(replace=true))", one, peer_name, peer1, one_note);
        }
        // Sinter's own dense kernel where it beats oneDNN's: f32 at 2 <= M <= 8 (oneDNN runs a
        // GEMM there) and bf16 weights at M <= 8 (read as bf16; oneDNN has no bf16 matmul on an
        // AVX2 CPU). The best dense kernel for such a row is the faster of the two peers.
        if (M <= 8 && (M >= 2 || (p.vt == DType::bf16 && !bf16_dense))) {
          const DType own_dt = p.vt == DType::bf16 ? DType::bf16 : DType::f32;
          const Tensor wo = wd.to(own_dt);  // x is in own_dt already
          auto [ours2, own] = time_pair([&] { (void)linear(x, s); }, [&] { (void)linear(x, wo); }, 1, reps, 0.6);
          char own_note[160];
          std::snprintf(own_note, sizeof own_note, "weights %.1f MB vs dense %.1f MB; sparse reads %.1f GB/s (copy %.1f)%s", sparse_mb,
                        double(N * K * dtype_size(own_dt)) / 1e6, sparse_mb / 1e3 / (ours2.best_ms * 1e-3), copy_gbs,
                        p.vt == DType::i8 ? "; int8 values against f32 dense" : "");
          r.add(row, ours2, std::string("Sinter dense linear ") + (own_dt == DType::f32 ? "f32" : "bf16"), own, own_note);
        }
      }
    }
  }
  if (o.quick) return;
  // The default model's layers (128 wide, 512 inner): small enough to stay in cache, where the 2:4
  // kernels lose to dense, so nn::Linear computes them densely (include/sinter/nn.h). Ours: the
  // sparse layer's forward; peer: the dense layer with the same (pruned) weights, both through
  // the same framework calls; the note gives the 2:4 kernel alone (linear(x, layer.sparse, b))
  // against the same peer. Timed over batches of calls.
  for (auto [K, N] : std::vector<std::pair<int64_t, int64_t>>{{128, 128}, {128, 512}, {512, 128}}) {
    for (DType vt : {DType::f32, DType::i8}) {
      nn::Linear layer(K, N), dense(K, N);
      layer.sparsify(vt);
      dense.weight.detach().copy_(layer.sparse.to_dense().to(DType::f32));
      dense.bias.detach().copy_(layer.bias);
      for (int64_t M : {int64_t(1), int64_t(2048)}) {
        Tensor x = randn({M, K});
        const int calls = int(std::max<int64_t>(1, (int64_t(1) << 22) / (M * N * K)));
        auto batch = [calls](auto&& f) { return [calls, f] { for (int i = 0; i < calls; ++i) f(); }; };
        auto per_call = [calls](Timing t) { return Timing{t.best_ms / calls, t.median_ms / calls}; };
        const auto peer_run = batch([&] { (void)dense.forward(x); });
        auto [ours, peer] = time_pair(batch([&] { (void)layer.forward(x); }), peer_run, 1, 9, 0.5);
        auto [kernel, peer2] = time_pair(batch([&] { (void)linear(x, layer.sparse, layer.bias); }), peer_run, 1, 9, 0.5);
        char note[200];
        std::snprintf(note, sizeof note, "a %.0f KiB layer: computed densely; the 2:4 kernel alone %.2fx", double(N * K * 4) / 1024,
                      peer2.best_ms / kernel.best_ms);
        r.add(std::string(vt == DType::f32 ? "f32" : "int8") + " M=" + std::to_string(M) + " K=" + std::to_string(K) +
                  " N=" + std::to_string(N) + " (nn::Linear)",
              per_call(ours), "dense nn::Linear", per_call(peer), note);
      }
    }
  }
  // End to end: `sinter generate`'s work (a 16-token prompt, then greedy tokens with the KV cache,
  // int8 layers prepacked as `sinter generate` does) on a 2:4 model against the dense model with
  // the same pruned weights, per token; with bf16 values both models run in bf16 (`sinter generate
  // --dtype bf16`). The default model (tiny: its layers stay in cache and run densely) and
  // bench/configs/gpt2-1024x8.json (403 MB of f32 Linear weights, streamed from memory), both
  // freshly initialized: the time per token does not depend on the values.
  const std::string big_path = std::string(SINTER_SOURCE_DIR) + "/bench/configs/gpt2-1024x8.json";
  std::ifstream big_file(big_path);
  SINTER_CHECK(big_file.good(), "[bench sparse] cannot read ", big_path, " (the source tree's model config)");
  std::stringstream big_json;
  big_json << big_file.rdbuf();
  const std::vector<std::tuple<std::string, nn::ModelConfig, int64_t>> models = {
      {"tiny", nn::ModelConfig::preset("tiny"), 96}, {"gpt2-1024x8", nn::ModelConfig::from_json(big_json.str(), big_path), 32}};
  for (const auto& [name, cfg, n_new] : models) {
    for (DType vt : {DType::f32, DType::i8, DType::bf16}) {
      nn::GPT sparse(cfg), dense(cfg);
      sparse.init_weights(0), dense.init_weights(0);
      sparse.sparsify(vt);
      const auto sl = sparse.block_linears(), dl = dense.block_linears();
      int64_t sparse_bytes = 0, dense_bytes = 0;
      bool small = false;  // layers computed from a dense copy (in cache, where 2:4 loses)
      for (size_t i = 0; i < sl.size(); ++i) {
        dl[i]->weight.detach().copy_(sl[i]->sparse.to_dense().to(DType::f32));
        dense_bytes += dl[i]->weight.numel() * (vt == DType::bf16 ? 2 : 4);
        small = small || sparse_runs_densely(sl[i]->sparse, DType::f32);
      }
      sparse.eval(), dense.eval();
      if (vt == DType::bf16) sparse.to(DType::bf16), dense.to(DType::bf16);
      const int64_t packed = sparse.prepack_for_decode(/*replace=*/true);  // as `sinter generate` serves
      for (auto& l : sl) sparse_bytes += l->sparse.nbytes();
      Tensor prompt = randint(32, 127, {16});
      train::Sampling greedy;
      greedy.temperature = 0;
      const int64_t tokens = n_new;  // a structured binding: lambdas capture it by copy (clang 14)
      auto [ours, peer] = time_pair([&] { (void)train::generate(sparse, prompt, tokens, greedy); },
                                    [&] { (void)train::generate(dense, prompt, tokens, greedy); }, 1, 5, 0);
      auto per_token = [n = double(n_new)](Timing t) { return Timing{t.best_ms / n, t.median_ms / n}; };
      char note[240];
      std::snprintf(note, sizeof note, "%.0f tokens/s; Linear weights %.1f MB vs dense %.1f MB%s%s", 1e3 * double(n_new) / ours.best_ms,
                    double(sparse_bytes) / 1e6, double(dense_bytes) / 1e6, packed ? " (prepacked in place)" : "",
                    small ? "; its layers are small enough to run from dense copies" : "");
      r.add(std::string("generate ") + (vt == DType::i8 ? "int8" : dtype_name(vt)) + " values " + name + " batch=1 " +
                std::to_string(n_new) + " tokens (per token)",
            per_token(ours), "dense model, same pruned weights", per_token(peer), note);
    }
  }
}

}  // namespace sinter::bench

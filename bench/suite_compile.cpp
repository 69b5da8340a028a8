// sinter::compile against eager Sinter on the same calls (alternating in one process), plus the
// copy bandwidth for the bytes a fused elementwise chain must move, and the compile times (cold:
// an empty cache in a fresh folder; warm: the disk cache, as a new process sees it), and the
// exported model run by libsinter_rt (suite_aot.cpp).
#include <chrono>
#include <cstring>
#include <filesystem>
#include <sinter/compile.h>
#include <sinter/sinter.h>
#include <sinter/train.h>

#include "core/parallel.h"
#include "dnnl_peer.h"
#include "harness.h"

namespace sinter::bench {

void kernel_rows(const Options& o, Report& r);  // suite_kernels.cpp
void aot_rows(const Options& o, Report& r);     // suite_aot.cpp

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

void suite_compile(const Options& o, Report& r) {
  manual_seed(0);
  const std::string cache = (std::filesystem::temp_directory_path() / "sinter_bench_compile_cache").string();
  std::filesystem::remove_all(cache);
  setenv("SINTER_CACHE_DIR", cache.c_str(), 1);
  r.expect(13);
  {
    NoGradGuard no_grad;
    const int64_t n = o.quick ? 4 << 20 : 16 << 20;
    Tensor x = randn({n}), a = randn({n}), b = randn({n});
    auto chain = [](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{gelu(in[0] * 1.5 + in[1], true) * sigmoid(in[0]) + in[0] * 0.5};
    };
    CompiledFunction f = compile(chain, {.name = "chain6"});
    (void)f({x, a, b});
    const auto [c, e] = time_pair([&] { (void)f({x, a, b}); }, [&] { (void)chain({x, a, b}); });
    const double bytes = 4.0 * double(n) * 3;  // reads x and a, writes the result
    const double copy_gbs = copy_bandwidth_gbs();
    char note[160];
    std::snprintf(note, sizeof note, "%.1f GB/s = %.0f%% of copy (%.1f GB/s); %d kernel", bytes / (c.best_ms * 1e-3) / 1e9,
                  100 * bytes / (c.best_ms * 1e-3) / 1e9 / copy_gbs, copy_gbs, f.explain({x, a, b}).fused_kernels);
    r.add("chain6 f32 " + std::to_string(n >> 20) + "M", c, "eager Sinter", e, note);
  }
  {
    NoGradGuard no_grad;
    const int64_t rows = o.quick ? 4096 : 16384;
    Tensor m = randn({rows, 1024}), res = randn({rows, 1024}), w = randn({1024}), bias = randn({1024});
    auto fn = [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{gelu(layer_norm(in[0] + in[1], w, bias), true)}; };
    CompiledFunction f = compile(fn, {.name = "residual_layernorm_gelu"});
    (void)f({m, res});
    const auto [c, e] = time_pair([&] { (void)f({m, res}); }, [&] { (void)fn({m, res}); });
    const Explanation x = f.explain({m, res});
    r.add("residual_layernorm_gelu f32 " + std::to_string(rows) + "x1024", c, "eager Sinter", e,
          std::to_string(x.fused_kernels) + " fused kernels + " + std::to_string(x.library_calls) + " library calls");
  }
  {
    NoGradGuard no_grad;
    Tensor x = randn({512, 1024}), w1 = randn({4096, 1024}) * 0.03, b1 = randn({4096}), w2 = randn({1024, 4096}) * 0.015,
           b2 = randn({1024});
    auto fn = [&](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{in[0] + linear(gelu(linear(in[0], w1, b1), true), w2, b2)};
    };
    CompiledFunction f = compile(fn, {.name = "mlp"});
    (void)f({x});
    const auto [c, e] = time_pair([&] { (void)f({x}); }, [&] { (void)fn({x}); });
    const Explanation ex = f.explain({x});
    r.add("mlp f32 512x1024x4096", c, "eager Sinter", e,
          std::to_string(ex.library_calls) + " GEMMs with bias + GELU(tanh) / bias + residual as epilogues, " +
              std::to_string(ex.fused_kernels) + " other kernels");
  }
  {
    // A linear's GELU(tanh) in its GEMM call (the tiny model's first MLP layer): Sinter's compiled
    // call, which gives oneDNN the GELU as a post-op only where oneDNN runs AVX-512 kernels and
    // otherwise runs Sinter's pass over the output (src/cpu/gemm.cpp), against oneDNN's matmul
    // with the GELU as its post-op.
    NoGradGuard no_grad;
    Tensor x = randn({2048, 128}), w = randn({512, 128}) * 0.1, y = Tensor::empty({2048, 512});
    auto fn = [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{gelu(linear(in[0], w), true)}; };
    CompiledFunction f = compile(fn, {.name = "linear_gelu"});
    (void)f({x});
    RawMatmul fused(x, w, y, false, dnnl::algorithm::eltwise_gelu_tanh);
    const auto [c, p] = time_pair([&] { (void)f({x}); }, [&] { fused.run(); }, 2, 30);
    const Explanation ex = f.explain({x});
    r.add("linear + gelu_tanh f32 2048x128x512", c, "oneDNN matmul, gelu_tanh post-op", p,
          std::to_string(ex.library_calls) + " GEMM call, " + std::to_string(ex.fused_kernels) + " other kernels");
  }
  {
    // Greedy decoding with the KV cache: a 16-token prompt, then 96 tokens, one decode step each;
    // the compiled step is one graph for every position (the cache position is a tensor it reads).
    NoGradGuard no_grad;
    nn::GPT model(nn::ModelConfig::preset("tiny"));
    model.init_weights(2);
    model.eval();
    std::vector<nn::KVCache> caches = model.make_caches(1, model.config().max_position_embeddings);
    const Tensor prompt = randint(32, 127, {1, 16});
    const int64_t n_new = 96;
    CompiledFunction step = compile([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{model.forward(in[0], &caches)}; },
                                    {.name = "decode_step"});
    auto run = [&](bool compiled) {
      caches[0].pos.zero_();
      Tensor logits = model.forward(prompt, &caches);
      for (int64_t i = 0; i < n_new; ++i) {
        const Tensor tok = argmax(logits.select(0, 0).select(0, logits.size(1) - 1), 0).reshape({1, 1});
        logits = compiled ? step({tok})[0] : model.forward(tok, &caches);
      }
    };
    run(true);
    const auto [c, e] = time_pair([&] { run(true); }, [&] { run(false); }, 1, o.quick ? 3 : 10);
    const Explanation ex = step.explain({randint(0, 256, {1, 1})});
    char note[160];
    std::snprintf(note, sizeof note, "%.0f tokens/s (eager %.0f); %d compile for all positions; %d fused kernels + %d library calls",
                  n_new / (c.best_ms * 1e-3), n_new / (e.best_ms * 1e-3), ex.compiles, ex.fused_kernels, ex.library_calls);
    r.add("generate tiny per token (96 after a 16-token prompt)", Timing{c.best_ms / n_new, c.median_ms / n_new}, "eager Sinter",
          Timing{e.best_ms / n_new, e.median_ms / n_new}, note);
  }
  {
    const data::ByteDataset data = data::ByteDataset::fortunes();
    auto make = [] {
      auto m = std::make_unique<nn::GPT>(nn::ModelConfig::preset("tiny"));
      m->init_weights(1);
      return m;
    };
    auto me = make(), mc = make();
    optim::AdamW oe(me->named_parameters(), 1e-3, 0.9, 0.95, 1e-8, 0.1), oc(mc->named_parameters(), 1e-3, 0.9, 0.95, 1e-8, 0.1);
    const auto batch = data.batch(true, 16, 128, 1, 0);
    const Tensor &x = batch.first, &y = batch.second;  // references, not bindings: the lambdas below capture them
    CompiledFunction f = compile([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{train::step(*mc, oc, in[0], in[1])}; },
                                 {.name = "train_step"});
    const auto t0 = std::chrono::steady_clock::now();
    (void)f({x, y});
    const double cold = seconds_since(t0);
    const auto [c, e] = time_pair([&] { (void)f({x, y}); }, [&] { (void)train::step(*me, oe, x, y); }, 1, o.quick ? 5 : 15);
    char note[160];
    std::snprintf(note, sizeof note, "%.0f tokens/s (eager %.0f); first call %.2f s (trace + codegen + g++)",
                  16 * 128 / (c.best_ms * 1e-3), 16 * 128 / (e.best_ms * 1e-3), cold);
    r.add("train tiny step B=16 T=128", c, "eager Sinter", e, note);
    // Warm: a second function over the same graph finds the compiled code in the disk cache.
    CompiledFunction g = compile([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{train::step(*mc, oc, in[0], in[1])}; },
                                 {.name = "train_step"});
    const auto t1 = std::chrono::steady_clock::now();
    (void)g.explain({x, y});
    const double warm = seconds_since(t1);
    char guard[96];
    std::snprintf(guard, sizeof guard, "; guard check per call %.3f us (%d inputs)", g.explain({x, y}).guard_check_us, 2);
    r.line("compile time, train tiny step: cold " + std::to_string(cold).substr(0, 5) + " s, warm (code from the cache) " +
           std::to_string(warm).substr(0, 5) + " s" + guard);
  }
  kernel_rows(o, r);
  aot_rows(o, r);
  std::filesystem::remove_all(cache);
}

}  // namespace sinter::bench

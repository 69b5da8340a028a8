// The exported model (sinter export, run by libsinter_rt through its C ABI) against the same
// greedy decoding in process: eager Sinter and the compiled decode step. Plus the runtime's load
// time and the sizes of libsinter_rt and model.so.
#include <dlfcn.h>
#include <sinter/sinter.h>
#include <sinter/sinter_rt.h>
#include <sinter/train.h>

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "harness.h"

namespace sinter::bench {

namespace {

// The last position's argmax of a runtime output.
int64_t argmax_last(const sinter_rt_tensor& t) {
  const int64_t V = t.shape[t.rank - 1], rows = t.shape[t.rank - 2];
  const float* row = static_cast<const float*>(t.data) + (rows - 1) * V;
  return std::max_element(row, row + V) - row;
}

int64_t run_graph(sinter_rt_session* s, const char* graph, std::vector<int64_t>& tokens) {
  sinter_rt_tensor in = {tokens.data(), SINTER_RT_I64, 2, {1, int64_t(tokens.size())}, 0}, out = {};
  SINTER_CHECK(sinter_rt_run(s, graph, &in, 1, &out, 1) == 0, "[bench] ", sinter_rt_last_error());
  return argmax_last(out);
}

}  // namespace

void aot_rows(const Options& o, Report& r) {
  NoGradGuard no_grad;
  nn::GPT model(nn::ModelConfig::preset("tiny"));
  model.init_weights(2);
  model.eval();
  const std::string dir = (std::filesystem::temp_directory_path() / "sinter_bench_aot").string();
  std::filesystem::remove_all(dir);
  train::ExportOptions xo;
  xo.out_dir = dir;
  const auto t0 = std::chrono::steady_clock::now();
  const aot::Exported ex = train::export_model(model, xo);
  const double export_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Load time: best of several loads (each maps the weights and checks every file's SHA-256).
  double load_ms = 1e9;
  for (int i = 0; i < 5; ++i) {
    const auto t1 = std::chrono::steady_clock::now();
    sinter_rt_model* m = sinter_rt_load(dir.c_str());
    load_ms = std::min(load_ms, std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count() * 1e3);
    SINTER_CHECK(m != nullptr, "[bench] ", sinter_rt_last_error());
    sinter_rt_model_free(m);
  }
  sinter_rt_model* m = sinter_rt_load(dir.c_str());
  sinter_rt_session* s = sinter_rt_session_new(m);
  std::vector<nn::KVCache> caches = model.make_caches(1, model.config().max_position_embeddings);
  const std::vector<int64_t> prompt = randint(32, 127, {16}).to_vector<int64_t>();
  const int64_t n_new = 96;
  CompiledFunction step = compile([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{model.forward(in[0], &caches)}; },
                                  {.name = "decode_step"});
  // The same loop three ways: greedy, the prompt through prefill, then one token per step.
  auto in_process = [&](bool compiled) {
    caches[0].pos.zero_();
    Tensor logits = model.forward(tensor<int64_t>(prompt).reshape({1, -1}), &caches);
    for (int64_t i = 0; i < n_new; ++i) {
      const Tensor tok = argmax(logits.select(0, 0).select(0, logits.size(1) - 1), 0).reshape({1, 1});
      logits = compiled ? step({tok})[0] : model.forward(tok, &caches);
    }
  };
  auto exported = [&] {
    sinter_rt_session_reset(s);
    std::vector<int64_t> tokens = prompt;
    std::vector<int64_t> one(1);
    one[0] = run_graph(s, "prefill", tokens);
    for (int64_t i = 1; i < n_new; ++i) one[0] = run_graph(s, "decode", one);
  };
  in_process(true);
  exported();
  const int reps = o.quick ? 3 : 10;
  const auto [x, e] = time_pair(exported, [&] { in_process(false); }, 1, reps);
  const auto [x2, c] = time_pair(exported, [&] { in_process(true); }, 1, reps);
  auto per_token = [&](const Timing& t) { return Timing{t.best_ms / n_new, t.median_ms / n_new}; };
  char note[160];
  std::snprintf(note, sizeof note, "%.0f tokens/s exported (eager %.0f)", n_new / (x.best_ms * 1e-3), n_new / (e.best_ms * 1e-3));
  r.add("exported tiny decode per token (96 after 16)", per_token(x), "eager Sinter", per_token(e), note);
  std::snprintf(note, sizeof note, "%.0f tokens/s exported (compiled %.0f)", n_new / (x2.best_ms * 1e-3), n_new / (c.best_ms * 1e-3));
  r.add("exported tiny decode per token vs compiled", per_token(x2), "compiled step in process", per_token(c), note);
  Dl_info info{};
  dladdr(reinterpret_cast<void*>(&sinter_rt_load), &info);
  const double rt_mb = info.dli_fname ? double(std::filesystem::file_size(info.dli_fname)) / 1e6 : 0;
  char line[240];
  std::snprintf(line, sizeof line,
                "exported tiny (prefill, decode, forward; seq 1..256): load %.1f ms (SHA-256 of every file, weights mapped); "
                "libsinter_rt %.1f MB, model.so %.2f MB, weights %.2f MB; export %.1f s",
                load_ms, rt_mb, double(ex.model_so_bytes) / 1e6, double(ex.weights_bytes) / 1e6, export_s);
  r.line(line);
  sinter_rt_session_free(s);
  sinter_rt_model_free(m);
  std::filesystem::remove_all(dir);
}

}  // namespace sinter::bench

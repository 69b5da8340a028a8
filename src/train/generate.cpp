// Generation with a KV cache (or recomputing the window), and sampling (temperature, top-k, top-p).
#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/format.h"
#include "sinter/autograd.h"
#include "sinter/dist.h"
#include "sinter/io.h"
#include "sinter/optim.h"
#include "sinter/random.h"
#include "sinter/sparse.h"
#include "sinter/compile.h"
#include "sinter/cuda.h"
#include "train/internal.h"
#include <optional>

namespace sinter::train {

namespace {
void check_settings(const Sampling& s, const char* op) {
  SINTER_CHECK(s.temperature >= 0 && s.top_k >= 0 && s.top_p > 0 && s.top_p <= 1, "[", op,
               "] need temperature >= 0, top_k >= 0, 0 < top_p <= 1");
}

void check_finite(double top, const char* op) {
  SINTER_CHECK(std::isfinite(top), "[", op, "] the model's logits are not finite (", top, "): its weights hold NaN or infinity");
}

// The drawn token as a 0-dim tensor on the logits' device: greedy, or a draw from the softmax of
// the logits shifted by the largest (any temperature > 0 gives finite exponents; a tiny one puts
// all the mass on the top token) over the top_k largest, then over the nucleus: each of them,
// largest first, whose predecessors' probabilities sum to less than top_p.
Tensor draw(const Tensor& l, const Tensor& top, const Sampling& s) {
  if (s.temperature <= 0) return argmax(l, 0);
  const Tensor scaled = (l - top) / s.temperature;
  const int64_t k = s.top_k > 0 ? std::min(s.top_k, l.size(0)) : l.size(0);
  if (k == l.size(0) && s.top_p >= 1.0) return multinomial(softmax(scaled, 0), 1, true).reshape({});
  const ValuesIndices sorted = topk(scaled, k, 0, true);
  Tensor kept = sorted.values;
  if (s.top_p < 1.0) {
    const Tensor p = softmax(kept.to(DType::f64), 0), ahead = cumsum(p, 0) - p;
    kept = where(lt(ahead, full({}, s.top_p, DType::f64, l.device())), kept, full({}, -INFINITY, DType::f32, l.device()));
  }
  return index_select(sorted.indices, 0, multinomial(softmax(kept, 0), 1, true)).reshape({});
}

// The drawn id, and the largest logit checked, in one read; errors name `op`.
int64_t sample_row(const Tensor& logits, const Sampling& s, const char* op) {
  const Tensor l = logits.to(DType::f32), top = max(l);
  std::vector<float> got;
  try {
    got = cat({top.reshape({1}), draw(l, top, s).to(DType::f32).reshape({1})}, 0).to_vector<float>();
  } catch (const Error&) {
    check_finite(top.item<float>(), op);  // the draw saw NaN: say why
    throw;
  }
  check_finite(got[0], op);
  return int64_t(got[1]);
}

// The KV-cache decode step on a GPU as a CUDA graph: the first step runs eagerly (what it makes
// lazily then exists), the graph is captured with the token in a tensor of its own, and each later
// step writes the token there and replays. Where the capture is refused, steps run eagerly.
struct DecodeGraph {
  DecodeGraph(const Device& device, bool allowed) {
    const char* env = std::getenv("SINTER_CUDA_GRAPHS");
    on = allowed && device.type == DeviceType::cuda && !(env && std::string(env) == "0");
  }
  Tensor step(const Tensor& token, const std::function<Tensor(const Tensor&)>& forward) {
    if (graph) {
      input.copy_(token);
      graph->replay();
      return output;
    }
    Tensor logits = forward(token);
    if (on) {
      on = false;  // one try
      input = token.clone();
      try {
        graph.emplace(token.device().index, [&] { output = forward(input); });
        path = "CUDA graph";
      } catch (const Error& e) {
        path = std::string("eager (CUDA graph refused: ") + e.what() + ")";
      }
    }
    return logits;
  }
  bool on = false;
  std::optional<cuda::Graph> graph;
  Tensor input, output;
  std::string path;  // what ran, once a capture was tried
};

}  // namespace

int64_t sample(const Tensor& logits, const Sampling& s) {
  check_settings(s, "sample");
  SINTER_CHECK_SHAPE(logits.dim() == 1 && logits.numel() > 0, "[sample] needs a 1-D row of logits, got shape ", logits.shape());
  return sample_row(logits, s, "sample");
}

Tensor generate(nn::GPT& model, const Tensor& prompt, int64_t max_new, const Sampling& s, bool use_cache, double* rate,
                const std::function<void(int64_t)>& on_token, bool compiled, const std::function<void(CompiledFunction&)>& report,
                std::string* decode) {
  CompiledFunction** compiled_fn = nullptr;
  CompiledFunction* holder = nullptr;
  if (report) compiled_fn = &holder;
  SINTER_CHECK_SHAPE(prompt.dim() == 1 && prompt.numel() > 0, "[generate] the prompt must be a non-empty 1-D token tensor, got ",
                     prompt.shape());
  SINTER_CHECK(max_new >= 0, "[generate] max_new_tokens must be >= 0");
  check_settings(s, "generate");
  const int64_t limit = model.config().max_position_embeddings;
  NoGradGuard g;
  const bool was_training = model.is_training();
  model.eval();
  manual_seed(s.seed);
  std::vector<int64_t> ids = prompt.to(DType::i64).to_vector<int64_t>();
  // The model sees a window of at most `limit` tokens; when it fills, it slides forward by half
  // (with the cache: the cache is refilled from the kept half), the same with or without cache.
  int64_t start = std::max<int64_t>(0, int64_t(ids.size()) - limit);
  std::vector<nn::KVCache> caches;
  if (use_cache) caches = model.make_caches(1, limit);
  // The decode step (one token in, logits out) compiled once: the caches and their position are
  // captured tensors it reads and writes, so every position runs the same graph.
  std::optional<CompiledFunction> step;
  if (compiled) {
    SINTER_CHECK(use_cache, "[generate] a compiled decode step needs the KV cache");
    SINTER_CHECK(model.device() == Device::cpu(), "[generate] a compiled decode step generates CPU code; the model is on ", model.device());
    step.emplace(compile([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{model.forward(in[0], &caches)}; },
                         {.name = "decode_step"}));
    if (compiled_fn) *compiled_fn = &*step;
  }
  const Device device = model.device();  // token ids go where the weights are
  auto window = [&] { return tensor<int64_t>(std::vector<int64_t>(ids.begin() + start, ids.end())).reshape({1, -1}).to(device); };
  auto one = [&](int64_t id) { return tensor<int64_t>({id}).reshape({1, 1}).to(device); };
  DecodeGraph graph(device, use_cache && !step);
  const auto t0 = std::chrono::steady_clock::now();
  Tensor logits = model.forward(window(), use_cache ? &caches : nullptr);
  for (int64_t i = 0; i < max_new; ++i) {
    const int64_t next = sample_row(logits.select(0, 0).select(0, logits.size(1) - 1), s, "generate");
    ids.push_back(next);
    if (on_token) on_token(next);
    if (i + 1 == max_new) break;
    if (int64_t(ids.size()) - start > limit) {
      start = int64_t(ids.size()) - limit / 2;
      if (use_cache) caches[0].pos.zero_();
      logits = model.forward(window(), use_cache ? &caches : nullptr);
    } else if (step) {
      logits = (*step)({one(next)})[0];
    } else if (use_cache) {
      logits = graph.step(one(next), [&](const Tensor& token) { return model.forward(token, &caches); });
    } else {
      logits = model.forward(window());
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (rate) *rate = double(max_new) / std::max(secs, 1e-9);
  if (report && holder) report(*holder);
  if (decode) *decode = !graph.path.empty() ? graph.path : step ? "compiled" : "eager";
  model.train(was_training);
  return tensor<int64_t>(ids);
}

}  // namespace sinter::train

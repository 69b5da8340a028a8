// Generation at batch 1 with the KV cache: a 16-token prompt, then 96 greedy tokens; reported per
// token. The peer is PyTorch eager with a preallocated KV cache (bench/torch_peer.py).
#include <sinter/sinter.h>
#include <sinter/train.h>

#include "harness.h"

namespace sinter::bench {

void suite_generate(const Options& o, Report& r) {
  NoGradGuard no_grad;
  const int64_t prompt_len = 16, n_new = 96;
  for (DType dt : {DType::f32, DType::bf16}) {
    manual_seed(0);
    std::unique_ptr<nn::GPT> model;
    if (!o.checkpoint.empty()) {
      model = train::load_model(o.checkpoint);
    } else {
      model = std::make_unique<nn::GPT>(nn::ModelConfig::preset("tiny"));
      model->init_weights(0);
    }
    model->eval();
    model->to(dt);
    Tensor prompt = randint(32, 127, {prompt_len});
    train::Sampling s;
    s.temperature = 0;
    const Timing t = time_it([&] { (void)train::generate(*model, prompt, n_new, s, true); }, 1, 5, 0);
    const Timing per_token{t.best_ms / n_new, t.median_ms / n_new};
    char note[96];
    std::snprintf(note, sizeof note, "%.0f tokens/s", 1e3 / per_token.best_ms);
    r.ours_only(std::string("generate ") + dtype_name(dt) + " tiny batch=1 96 tokens (per token)", per_token, note);
  }
  // The KV cache against recomputing the whole context for each token, as the context grows: with
  // the cache the cost per token should stay nearly flat.
  manual_seed(0);
  nn::GPT model(nn::ModelConfig::preset("tiny"));
  model.init_weights(0);
  model.eval();
  const int64_t max_len = model.config().max_position_embeddings;
  for (int64_t ctx : {int64_t(16), max_len / 2, max_len - 32}) {
    Tensor prompt = randint(32, 127, {ctx});
    train::Sampling s;
    s.temperature = 0;
    auto per_token = [&](bool cache) {
      const Timing t = time_it([&] { (void)train::generate(model, prompt, 32, s, cache); }, 1, o.quick ? 2 : 5, 0);
      return Timing{t.best_ms / 32, t.median_ms / 32};
    };
    r.add("generate f32 tiny KV cache, context " + std::to_string(ctx) + " (per token)", per_token(true),
          "Sinter recomputing the context", per_token(false));
  }
}

}  // namespace sinter::bench

// Generation speed against context length, with the KV cache and without (recomputing the whole
// context for every token): with the cache the cost per token should stay nearly flat.
//   build/bench/sinter_bench_generate [CHECKPOINT]   (default: a freshly initialized tiny model)
#include <chrono>
#include <cstdio>
#include <sinter/sinter.h>
#include <sinter/train.h>

using namespace sinter;

int main(int argc, char** argv) try {
  std::unique_ptr<nn::GPT> model;
  if (argc > 1) {
    model = train::load_model(argv[1]);
  } else {
    model = std::make_unique<nn::GPT>(nn::ModelConfig::preset("tiny"));
    model->init_weights(0);
  }
  const int64_t max_len = model->config().max_position_embeddings;
  NoGradGuard g;
  model->eval();
  std::printf("%-24s %16s %16s %8s\n", "context (tokens)", "cache tok/s", "no-cache tok/s", "ratio");
  for (int64_t ctx : {int64_t(16), max_len / 4, max_len / 2, max_len - 32}) {
    // Time 32 greedy tokens generated after a prompt of `ctx` tokens.
    Tensor prompt = randint(32, 127, {ctx});
    train::Sampling s;
    s.temperature = 0;
    double with = 0, without = 0;
    for (int rep = 0; rep < 3; ++rep) {
      double r1 = 0, r2 = 0;
      train::generate(*model, prompt, 32, s, true, &r1);
      train::generate(*model, prompt, 32, s, false, &r2);
      with = std::max(with, r1);
      without = std::max(without, r2);
    }
    std::printf("%-24lld %16.1f %16.1f %8.2f\n", (long long)ctx, with, without, with / without);
  }
  return 0;
} catch (const sinter::Error& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 2;
}

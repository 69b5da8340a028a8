// Trains a small LLaMA-style model on one sentence with Sinter's public API, from outside the
// Sinter tree. Exits 0 when the loss fell by at least half.
#include <sinter/sinter.h>

#include <cstdio>

using namespace sinter;

int main() {
  manual_seed(0);
  nn::GPT model(nn::ModelConfig::preset("llama-tiny"));
  model.init_weights(7);
  optim::AdamW opt(model.named_parameters(), 3e-3, 0.9, 0.95, 1e-8, 0.0);

  Tensor ids = data::encode("Sinter trains language models from C++; this one learns a sentence.");
  const int64_t T = ids.size(0) - 1;
  Tensor inp = ids.narrow(0, 0, T).reshape({1, T}), tgt = ids.narrow(0, 1, T).reshape({1, T});

  double first = 0, last = 0;
  for (int step = 1; step <= 40; ++step) {
    Tensor loss = cross_entropy(model.forward(inp).reshape({-1, 256}), tgt.reshape({-1}));
    opt.zero_grad();
    loss.backward();
    opt.step();
    last = loss.item<float>();
    if (step == 1) first = last;
  }
  std::printf("downstream: sinter %s, %lld parameters, loss %.4f -> %.4f after 40 steps\n", version(),
              static_cast<long long>(model.num_parameters()), first, last);
  return last < 0.5 * first ? 0 : 1;
}

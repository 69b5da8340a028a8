// One optimizer step of the default model (tiny GPT, B=16, T=128): forward, cross-entropy,
// backward, gradient clipping, AdamW. The peer is PyTorch eager doing the same (bench/torch_peer.py).
#include <sinter/sinter.h>
#include <sinter/train.h>

#include "harness.h"

namespace sinter::bench {

void suite_train(const Options& o, Report& r) {
  const int64_t B = 16, T = 128;
  for (DType dt : {DType::f32, DType::bf16}) {
    manual_seed(0);
    nn::GPT model(nn::ModelConfig::preset("tiny"));
    model.init_weights(0);
    model.train();
    optim::AdamW opt(model.named_parameters(), 1e-3, 0.9, 0.95, 1e-8, 0.1);
    Tensor x = randint(0, 256, {B, T}), y = randint(0, 256, {B, T});
    auto step = [&] {
      AutocastGuard autocast(dt);  // f32: off; bf16: linear layers in bf16, master weights f32
      Tensor logits = model.forward(x);
      Tensor loss = cross_entropy(logits.reshape({-1, 256}), y.reshape({-1}));
      opt.zero_grad();
      loss.backward();
      optim::clip_grad_norm(model.parameters(), 1.0);
      opt.step();
    };
    const Timing t = time_it(step, 3, o.quick ? 5 : 10, 0);
    char note[96];
    std::snprintf(note, sizeof note, "%.0f tokens/s", double(B * T) / (t.best_ms * 1e-3));
    r.ours_only(std::string("train ") + dtype_name(dt) + " tiny B=16 T=128 step", t, note);
  }
}

}  // namespace sinter::bench

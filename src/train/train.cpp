// A training step as `sinter train` takes it (loss, gradients over micro-batches, clipping, the
// update), evaluation, and the options' record in a checkpoint. The loop is trainer.cpp.
#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>

#include "sinter/autograd.h"
#include "sinter/dist.h"
#include "sinter/random.h"
#include "train/internal.h"

namespace sinter::train {

using json = nlohmann::json;
using namespace detail;

std::string Options::to_json() const {
  json j{{"preset", preset}, {"config", config_path}, {"data", data_path}, {"steps", steps}, {"batch", batch}, {"grad_accum", grad_accum}, {"checkpoint_activations", checkpoint_activations},
         {"seq_len", seq_len}, {"lr", lr}, {"min_lr", min_lr}, {"weight_decay", weight_decay},
         {"grad_clip", grad_clip}, {"warmup", warmup}, {"seed", seed}, {"dtype", dtype}, {"tp", tp}, {"dp", dp}, {"sequence_parallel", sequence_parallel},
         {"compile", compile}, {"on_nan", on_nan}, {"init", init_dir}, {"device", device}};
  return j.dump();
}


Tensor detail::lm_loss(nn::GPT& model, const Tensor& x, const Tensor& y) {
  Tensor logits = model.forward(x);
  if (model.parallel_loss) return model.parallel_loss(logits, y);  // logits sharded over the vocabulary
  return cross_entropy(logits.reshape({-1, logits.size(-1)}), y.reshape({-1}));
}

double evaluate(nn::GPT& model, const data::ByteDataset& data, int64_t batch, int64_t seq_len, int64_t batches,
                uint64_t seed) {
  NoGradGuard g;
  const bool was_training = model.is_training();
  model.eval();
  double total = 0;
  for (int64_t i = 0; i < batches; ++i) {
    auto [x, y] = data.batch(false, batch, seq_len, seed, uint64_t(i));
    total += lm_loss(model, x.to(model.device()), y.to(model.device())).item_double();
  }
  model.train(was_training);
  return total / double(batches);
}

std::array<Tensor, 2> loss_and_gradients(nn::GPT& model, optim::Optimizer& opt, const Tensor& x, const Tensor& y,
                                         double grad_clip, DType compute, int64_t micro_batches) {
  const int64_t B = x.size(0);
  SINTER_CHECK(micro_batches >= 1 && B % micro_batches == 0, "[train] a batch of ", B, " sequences does not split into ",
               micro_batches, " micro-batches");
  opt.zero_grad();
  Tensor loss;
  for (int64_t i = 0, rows = B / micro_batches; i < micro_batches; ++i) {
    Tensor part;
    {
      AutocastGuard autocast(compute);
      part = micro_batches == 1 ? lm_loss(model, x, y)
                                : lm_loss(model, x.narrow(0, i * rows, rows), y.narrow(0, i * rows, rows)) * (1.0 / double(micro_batches));
    }
    part.backward();  // the leaves' gradients add up over the micro-batches
    loss = micro_batches == 1 ? part : loss.defined() ? loss + part.detach() : part.detach();
  }
  const std::vector<Tensor> params = model.parameters();
  const bool parallel = std::any_of(params.begin(), params.end(), [](const Tensor& p) { return dist::parameter_layout(p).has_value(); });
  Tensor norm = parallel ? dist::clip_grad_norm(params, grad_clip) : optim::clip_grad_norm(params, grad_clip);
  return {loss, norm};
}

Tensor step(nn::GPT& model, optim::Optimizer& opt, const Tensor& x, const Tensor& y, double grad_clip, DType compute,
            int64_t micro_batches) {
  Tensor loss = loss_and_gradients(model, opt, x, y, grad_clip, compute, micro_batches)[0];
  opt.step();
  return loss;
}

}  // namespace sinter::train

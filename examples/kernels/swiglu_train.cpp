// The swiglu user kernel in a compiled training step of the llama-tiny model: every block's MLP
// runs it (nn::SwiGLU::combine), the step (forward, backward through the kernel's own backward,
// clipping, AdamW) is one compiled graph, and its losses follow the plain model trained eagerly.
//   build/swiglu_train [steps]      (the tests run it: example_swiglu_train)
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <sinter/sinter.h>
#include <sinter/train.h>

#include "kernels.h"

using namespace sinter;

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 8;
  const OpDef& swiglu = examples::swiglu_op(SINTER_KERNELS_DIR);
  auto make = [] {
    auto m = std::make_unique<nn::GPT>(nn::ModelConfig::preset("llama-tiny"));
    m->init_weights(7);
    return m;
  };
  auto plain = make(), fused = make();
  for (auto& b : fused->blocks) static_cast<nn::SwiGLU&>(*b->mlp).combine = &swiglu;
  optim::AdamW plain_opt(plain->named_parameters(), 2e-3), fused_opt(fused->named_parameters(), 2e-3);
  CompiledFunction step = compile([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{train::step(*fused, fused_opt, in[0], in[1])}; },
                                  {.fullgraph = true, .name = "swiglu_train_step"});
  const data::ByteDataset data = data::ByteDataset::from_text(std::string(4000, 'a') + "the quick brown fox jumps over the lazy dog", "t");
  double worst = 0;
  for (int s = 0; s < steps; ++s) {
    auto [x, y] = data.batch(true, 4, 64, 1, uint64_t(s));
    const double lp = train::step(*plain, plain_opt, x, y).item<double>(), lf = step({x, y})[0].item<double>();
    worst = std::max(worst, std::fabs(lf - lp) / std::fabs(lp));
    std::printf("step %d  loss %.6f (plain, eager) %.6f (swiglu kernel, compiled)\n", s + 1, lp, lf);
  }
  auto [x, y] = data.batch(true, 4, 64, 1, 0);
  const Explanation e = step.explain({x, y});
  for (const std::string& k : e.user_kernels) std::printf("user kernel %s\n", k.c_str());
  std::printf("one graph: %s; largest relative loss difference %.2e\n", e.graphs == 1 && e.breaks == 0 ? "yes" : "no", worst);
  return e.graphs == 1 && e.breaks == 0 && !e.user_kernels.empty() && worst < 1e-5 ? 0 : 1;
}

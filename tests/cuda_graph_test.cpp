// cuda::Graph (src/cuda/graph.cpp) against the same work run eagerly: a capture runs nothing, each
// replay recomputes from the inputs' memory as it is then, a decode step of a GPT-2 and a LLaMA
// model replays to the eager step's logits and KV cache, and what a graph cannot hold (a host read)
// is an error after which the device goes on.
#include <cmath>

#include "cuda_test_util.h"
#include "train_util.h"

using namespace sinter;

namespace {

const Device kGpu = Device::cuda();

double max_diff(const Tensor& a, const Tensor& b) { return max(abs(a.to(Device::cpu()) - b.to(Device::cpu()))).item<double>(); }

}  // namespace

// y = gelu(x W + b) + x, captured: nothing runs at capture; replays follow x's memory (written
// with copy_ between them) and equal the eager result; what the capture allocates stays the graph's.
TEST(CudaGraph, ACaptureRunsNothingAndEachReplayRecomputesFromTheInputsMemory) {
  NEEDS_GPU();
  manual_seed(21);
  const Tensor w = randn({256, 256}).to(kGpu) * 0.05, b = randn({256}).to(kGpu);
  Tensor x = randn({4, 256}).to(kGpu);  // 4 KiB: a size class of its own here
  auto step = [&] { return gelu(matmul(x, w) + b) + x; };
  (void)step();  // what the step makes lazily (GEMM plans) exists before capturing
  Tensor y;
  cuda::Graph graph(0, [&] { y = step(); });
  const Tensor y0 = y.to(Device::cpu());
  EXPECT_FALSE(test::all_close(y0, step().to(Device::cpu()), 1e-3, 1e-3)) << "the capture ran the step";
  // The blocks the capture freed stay the graph's: tensors made after it are not what a replay writes.
  std::vector<Tensor> others;
  for (int i = 0; i < 4; ++i) others.push_back(full({4, 256}, double(i), DType::f32, kGpu));
  graph.replay();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(max_diff(others[size_t(i)], full({4, 256}, double(i), DType::f32, kGpu)), 0) << i;
  for (int i = 0; i < 3; ++i) {
    x.copy_(randn({4, 256}).to(kGpu));
    graph.replay();
    EXPECT_LE(max_diff(y, step()), 1e-6) << "replay " << i;
  }
}

// A decode step (one token, KV caches advancing on the device) captured once and replayed gives
// the eager decode's logits at each position, for GPT-2's and LLaMA's layers.
TEST(CudaGraph, ADecodeStepReplaysAsItRunsEagerly) {
  NEEDS_GPU();
  for (const char* type : {"gpt2", "llama"}) {
    const nn::ModelConfig cfg = test::micro_config(type);
    manual_seed(12);
    nn::GPT model(cfg);
    model.to(kGpu);
    model.eval();
    NoGradGuard no_grad;
    const Tensor prompt = randint(0, cfg.vocab_size, {1, 5}).to(kGpu);
    std::vector<int64_t> next;
    for (int i = 0; i < 6; ++i) next.push_back((7 * i + 3) % cfg.vocab_size);
    auto eager = model.make_caches(1, 16), graphed = model.make_caches(1, 16);
    (void)model.forward(prompt, &eager);
    (void)model.forward(prompt, &graphed);
    Tensor token = tensor<int64_t>({next[0]}).reshape({1, 1}).to(kGpu);
    Tensor want = model.forward(token, &eager), logits;
    (void)model.forward(token, &graphed);  // the warm-up step, eagerly
    cuda::Graph graph(0, [&] { logits = model.forward(token, &graphed); });
    for (size_t i = 1; i < next.size(); ++i) {
      token.copy_(tensor<int64_t>({next[i]}).reshape({1, 1}).to(kGpu));
      want = model.forward(token, &eager);
      graph.replay();
      EXPECT_LE(max_diff(logits, want), 1e-5) << type << " position " << 5 + i;
    }
    EXPECT_LE(max_diff(graphed[0].k, eager[0].k), 1e-6) << type;
  }
}

// A host read inside the capture is an error naming it; the capture ends, nothing of it runs,
// and the device goes on (eager work and a new capture).
TEST(CudaGraph, AHostReadWhileCapturingIsAnErrorAndTheDeviceGoesOn) {
  NEEDS_GPU();
  const Tensor x = ones({8}).to(kGpu);
  try {
    cuda::Graph g(0, [&] { (void)sum(x).item<float>(); });
    ADD_FAILURE() << "a host read was captured";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("while capturing a graph"), std::string::npos) << e.what();
  }
  EXPECT_EQ(sum(x * 2.0).item<float>(), 16.0f);
  Tensor y;
  cuda::Graph g(0, [&] { y = x * 3.0; });
  g.replay();
  EXPECT_EQ(sum(y).item<float>(), 24.0f);
}

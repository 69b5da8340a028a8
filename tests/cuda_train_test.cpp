// Training and generation on CUDA against the CPU: the same losses from the same seed and data,
// checkpoints that resume on the other device, one host synchronization per step, an index out
// of range raised at the next synchronization; and the command line's --device, which without a
// GPU exits 1 naming why. GPU tests skip with the reason here and fail under SINTER_REQUIRE_GPU=1.
#include <sys/wait.h>

#include <cmath>
#include <fstream>

#include "cuda_test_util.h"
#include "sinter/train.h"
#include "train_util.h"

using namespace sinter;

namespace {

const Device kGpu = Device::cuda(0);

// A text corpus of its own (a device machine may lack Debian's fortunes): 256 KB of numbered lines.
const std::string& corpus() {
  static const std::string path = [] {
    const std::string p = test::temp_dir("cuda_corpus") + "/corpus.txt";
    std::string text;
    const char* words[] = {"the", "model", "reads", "every", "byte", "of", "this", "line", "and", "learns", "its", "order"};
    for (uint32_t i = 0, h = 7; text.size() < (256u << 10); ++i) {
      text += "line " + std::to_string(i) + ":";
      for (int w = 0; w < 9; ++w) {
        h = h * 1103515245u + 12345u;
        text += std::string(" ") + words[(h >> 16) % 12];
      }
      text += ".\n";
    }
    test::write_file(p, text);
    return p;
  }();
  return path;
}

// The default tiny model on that corpus: no validation or checkpoint before the end.
train::Options tiny_run(const std::string& out, const std::string& device, int64_t steps) {
  train::Options o;
  o.data_path = corpus();
  o.out_dir = out, o.device = device, o.steps = steps, o.quiet = true;
  o.val_every = 1 << 20, o.save_every = 1 << 20;
  return o;
}

void expect_same_losses(const std::vector<double>& got, const std::vector<double>& want, size_t from, const std::string& what) {
  ASSERT_EQ(got.size() + from, want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[from + i], 1e-4 * std::abs(want[from + i])) << what << ": step " << from + i + 1;
}

struct Command {
  int rc = -1;
  std::string out;
};
// SINTER_CLI_PATH: where a carried build's command line is (scripts/device/run.sh).
Command run_cli(const std::string& args, const std::string& dir) {
  const char* cli = std::getenv("SINTER_CLI_PATH");
  const std::string cmd = std::string(cli ? cli : SINTER_CLI) + " " + args + " > " + dir + "/out.txt 2>&1";
  const int status = std::system(cmd.c_str());
  std::ifstream f(dir + "/out.txt");
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>())};
}

}  // namespace

TEST(CudaTraining, FiftyStepsMatchTheCpuRunStepByStep) {
  NEEDS_GPU();
  const train::Result cpu = train::run(tiny_run(test::temp_dir("cuda_parity_cpu"), "cpu", 50));
  const train::Result gpu = train::run(tiny_run(test::temp_dir("cuda_parity_gpu"), "cuda", 50));
  expect_same_losses(gpu.losses, cpu.losses, 0, "cuda against cpu");
  EXPECT_NEAR(gpu.val_loss, cpu.val_loss, 1e-4 * cpu.val_loss);
}

TEST(CudaTraining, ACheckpointResumesOnTheOtherDevice) {
  NEEDS_GPU();
  const train::Result whole = train::run(tiny_run(test::temp_dir("cuda_resume_whole"), "cpu", 40));
  for (const auto& [first, second] : {std::pair<std::string, std::string>{"cuda", "cpu"}, {"cpu", "cuda"}}) {
    const std::string dir = test::temp_dir("cuda_resume_" + first);
    train::Options o = tiny_run(dir, first, 40);
    o.stop_after = 20;
    const train::Result a = train::run(o);
    expect_same_losses(a.losses, std::vector<double>(whole.losses.begin(), whole.losses.begin() + 20), 0, first + " first half");
    o.device = second, o.stop_after = 0, o.resume = true;
    const train::Result b = train::run(o);
    expect_same_losses(b.losses, whole.losses, 20, first + " then " + second);
  }
}

TEST(CudaTraining, AStepWaitsForTheDeviceOnceToReadItsLoss) {
  NEEDS_GPU();
  train::Options o = tiny_run(test::temp_dir("cuda_syncs"), "cuda", 100);
  o.batch = 4, o.seq_len = 32;
  train::Trainer t(o);
  t.step();  // the first step allocates what the others reuse
  for (int i = 0; i < 3; ++i) {
    const int64_t before = cuda::host_synchronizations();
    t.step();
    EXPECT_EQ(cuda::host_synchronizations() - before, 1) << "step " << i + 2;
  }
}

TEST(CudaTraining, GreedyGenerationMatchesTheCpuWithAndWithoutTheCache) {
  NEEDS_GPU();
  for (const char* type : {"gpt2", "llama", "llama-window"}) {
    manual_seed(5);
    nn::GPT cpu_model(test::micro_config(type));
    manual_seed(5);
    nn::GPT gpu_model(test::micro_config(type));
    gpu_model.to(kGpu);
    ASSERT_EQ(gpu_model.device(), kGpu);
    const Tensor prompt = tensor<int64_t>({1, 2, 3, 4});
    const train::Sampling greedy{.temperature = 0};
    const std::vector<int64_t> want = train::generate(cpu_model, prompt, 24, greedy).to_vector<int64_t>();
    EXPECT_EQ(train::generate(gpu_model, prompt, 24, greedy, true).to_vector<int64_t>(), want) << type << " with the KV cache";
    EXPECT_EQ(train::generate(gpu_model, prompt, 24, greedy, false).to_vector<int64_t>(), want) << type << " without";
  }
}

TEST(CudaTraining, GreedyDecodingWaitsOncePerToken) {
  NEEDS_GPU();
  manual_seed(5);
  nn::GPT model(test::micro_config("llama"));  // RoPE tables and the cache position read on the device
  model.to(kGpu);
  const train::Sampling greedy{.temperature = 0};
  (void)train::generate(model, tensor<int64_t>({1, 2, 3}), 4, greedy);  // allocations the next run reuses
  const int64_t before = cuda::host_synchronizations();
  (void)train::generate(model, tensor<int64_t>({1, 2, 3}), 16, greedy);
  EXPECT_EQ(cuda::host_synchronizations() - before, 16);
}

// A draw with a temperature reads the drawn index with the largest logit: one wait per token too.
TEST(CudaTraining, SamplingWithATemperatureWaitsOncePerToken) {
  NEEDS_GPU();
  manual_seed(6);
  nn::GPT model(test::micro_config("gpt2"));
  model.to(kGpu);
  const train::Sampling warm{.temperature = 0.8, .seed = 2};
  (void)train::generate(model, tensor<int64_t>({1, 2, 3}), 4, warm);
  const int64_t before = cuda::host_synchronizations();
  const std::vector<int64_t> ids = train::generate(model, tensor<int64_t>({1, 2, 3}), 16, warm).to_vector<int64_t>();
  EXPECT_EQ(cuda::host_synchronizations() - before, 16);
  for (const int64_t id : ids) EXPECT_TRUE(id >= 0 && id < test::micro_config("gpt2").vocab_size) << id;
}

TEST(CudaBackend, WhatAKernelFindsWrongIsRaisedAtTheNextWaitNamingTheOp) {
  NEEDS_GPU();
  // Reading y waits for the device, which raises what its kernel recorded.
  auto expect_raised = [](const Tensor& y, const std::string& text) {
    try {
      (void)y.to(Device::cpu());
      ADD_FAILURE() << "no error; expected " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  const Tensor w = randn({8, 4}).to(kGpu);
  expect_raised(embedding(w, tensor<int64_t>({1, 9, 2}).to(kGpu)), "[embedding] index 9 at position 1 out of range for size 8");
  EXPECT_NO_THROW((void)embedding(w, tensor<int64_t>({7}).to(kGpu)).to(Device::cpu()));  // reported once; the device goes on
  expect_raised(dynamic_slice(w, full({}, 6, DType::i64).to(kGpu), 0, 3), "[dynamic_slice] positions 6..9 out of range for size 8");
  expect_raised(multinomial(tensor<float>({0.5f, -1.0f}).to(kGpu), 1, true),
                "[multinomial] row 0 has a probability that is negative or not finite");
}

TEST(CudaCommandLine, TrainAndGenerateOnCudaOrExitOneNamingWhyNot) {
  const std::string dir = test::temp_dir("cuda_cli");
  const Command train =
      run_cli("train --device cuda --steps 3 --val-every 3 --batch 4 --seq-len 32 --data " + corpus() + " --out " + dir + "/run", dir);
  const Command gen = run_cli("generate --device cuda --checkpoint " + dir + "/run --max-new-tokens 8", dir);
  // `sinter sparsify` then bf16 generation on the GPU: its 2:4 layers through cuSPARSELt or their dense copies.
  const Command sparse = run_cli("sparsify " + dir + "/run --out " + dir + "/sparse --values bf16 --finetune-steps 0", dir);
  const Command sparse_gen = run_cli("generate --device cuda --dtype bf16 --checkpoint " + dir + "/sparse --max-new-tokens 8", dir);
  if (!cuda::available()) {
    if (test::gpu_required()) FAIL() << "SINTER_REQUIRE_GPU=1, but no CUDA device: " << cuda::unavailable_reason();
    for (const Command& c : {train, gen}) {
      EXPECT_EQ(c.rc, 1) << c.out;
      EXPECT_NE(c.out.find("no CUDA device: " + cuda::unavailable_reason()), std::string::npos) << c.out;
    }
    return;
  }
  EXPECT_EQ(train.rc, 0) << train.out;
  EXPECT_NE(train.out.find("done: step 3"), std::string::npos) << train.out;
  EXPECT_EQ(gen.rc, 0) << gen.out;
  EXPECT_NE(gen.out.find("tokens/s"), std::string::npos) << gen.out;
  EXPECT_NE(gen.out.find("decode steps: CUDA graph]"), std::string::npos) << gen.out;
  EXPECT_EQ(sparse.rc, 0) << sparse.out;
  EXPECT_EQ(sparse_gen.rc, 0) << sparse_gen.out;
  EXPECT_NE(sparse_gen.out.find("tokens/s"), std::string::npos) << sparse_gen.out;
  EXPECT_NE(sparse_gen.out.find("decode steps: CUDA graph]"), std::string::npos) << sparse_gen.out;
}

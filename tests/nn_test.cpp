// Models and training: PyTorch parity, exact resume, KV-cache generation, clear errors.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include <sinter/train.h>

#include "core/allocator.h"
#include "test_util.h"
#include "train_util.h"

using namespace sinter;
using test::micro_config, test::read_file, test::temp_dir, test::write_file;
namespace fs = std::filesystem;

namespace {

std::string data_path(const std::string& f) { return std::string(SINTER_TEST_DATA) + "/" + f; }

// Checks every value of `got` against `want` with a relative error bound scaled by the tensor's size.
::testing::AssertionResult rel_close(const Tensor& got, const Tensor& want, double tol) {
  if (got.shape() != want.shape()) return ::testing::AssertionFailure() << "shape " << got.shape() << " vs " << want.shape();
  auto a = to_double_vector(got), b = to_double_vector(want);
  double num = 0, den = 0, worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
    worst = std::max(worst, std::fabs(a[i] - b[i]));
  }
  // Gradients that are zero in exact arithmetic (the key bias: softmax ignores a per-row constant)
  // hold only rounding noise; below a norm of 1e-3 the bound is absolute.
  const double rel = std::sqrt(num) / std::max(std::sqrt(den), 1e-3);
  if (rel <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "relative error " << rel << " > " << tol << " (max abs diff " << worst << ")";
}

struct Parity {
  std::unique_ptr<nn::GPT> model;
  io::SafeTensors weights, ref;
};

Parity load_parity(const std::string& name) {
  Parity p;
  p.weights = io::load_safetensors(data_path(name + "_weights.safetensors"));
  p.ref = io::load_safetensors(data_path(name + "_ref.safetensors"));
  p.model = std::make_unique<nn::GPT>(nn::ModelConfig::from_json(p.weights.metadata.at("config"), name));
  std::map<std::string, Tensor> sd;
  for (auto& [k, t] : p.weights.tensors)
    if (k.rfind("batch.", 0) != 0) sd[k] = t;
  p.model->load_state_dict(sd);
  return p;
}

}  // namespace

class ParityWithPyTorch : public ::testing::TestWithParam<std::string> {};

TEST_P(ParityWithPyTorch, LogitsLossAndEveryGradient) {
  Parity p = load_parity(GetParam());
  Tensor x = p.weights.tensors.at("batch.x"), y = p.weights.tensors.at("batch.y");
  Tensor logits = p.model->forward(x);
  Tensor loss = cross_entropy(logits.reshape({-1, 256}), y.reshape({-1}));
  loss.backward();
  EXPECT_TRUE(rel_close(logits, p.ref.tensors.at("logits"), 1e-4));
  EXPECT_TRUE(rel_close(loss, p.ref.tensors.at("loss"), 1e-4));
  int checked = 0;
  for (auto& [name, t] : p.model->named_parameters()) {
    ASSERT_TRUE(t->grad().defined()) << name;
    EXPECT_TRUE(rel_close(t->grad(), p.ref.tensors.at("grad." + name), 1e-4)) << name;
    ++checked;
  }
  EXPECT_EQ(checked, int(p.weights.tensors.size()) - 2);
}

TEST_P(ParityWithPyTorch, ThreeAdamWSteps) {
  // The optimizer alone: each step gets exactly the gradients PyTorch's step saw (model gradients
  // are checked above; Adam's normalisation would amplify their last-bit differences).
  Parity p = load_parity(GetParam());
  optim::AdamW opt(p.model->named_parameters(), 1e-2, 0.9, 0.95, 1e-8, 0.1);
  for (int k = 1; k <= 3; ++k) {
    for (auto& [name, t] : p.model->named_parameters())
      t->set_grad(p.ref.tensors.at("adamw_grad" + std::to_string(k) + "." + name).clone());
    opt.step();
  }
  for (auto& [name, t] : p.model->named_parameters())
    EXPECT_TRUE(rel_close(*t, p.ref.tensors.at("adamw3." + name), 1e-6)) << name;
}

INSTANTIATE_TEST_SUITE_P(Models, ParityWithPyTorch, ::testing::Values("gpt2", "llama"));

TEST(Training, TwentyStepsEqualTenThenResumeTen) {
  const std::string corpus = temp_dir("resume") + "/corpus.txt";
  std::string text;
  for (int i = 0; i < 400; ++i) text += "the quick brown fox " + std::to_string(i * 7919 % 1000) + " jumps over the lazy dog.\n";
  write_file(corpus, text);
  const std::string cfg = temp_dir("resume_cfg") + "/config.json";
  nn::ModelConfig mc = micro_config("gpt2");
  mc.dropout = 0.1;  // dropout masks must replay exactly after a resume too
  write_file(cfg, mc.to_json());
  train::Options o;
  o.config_path = cfg, o.data_path = corpus, o.steps = 20, o.batch = 4, o.seq_len = 32, o.warmup = 3;
  o.val_every = 5, o.val_batches = 2, o.save_every = 1000, o.quiet = true;
  o.out_dir = temp_dir("straight");
  train::run(o);
  train::Options a = o;
  a.out_dir = temp_dir("split");
  a.stop_after = 10;
  EXPECT_EQ(train::run(a).step, 10);
  a.stop_after = 0;
  a.resume = true;
  EXPECT_EQ(train::run(a).step, 20);
  for (const char* f : {"model.safetensors", "optimizer.safetensors"}) {
    auto x = io::load_safetensors(o.out_dir + "/" + f), y = io::load_safetensors(a.out_dir + "/" + f);
    ASSERT_EQ(x.tensors.size(), y.tensors.size());
    for (auto& [name, t] : x.tensors) {
      const Tensor& u = y.tensors.at(name);
      ASSERT_EQ(t.shape(), u.shape()) << name;
      EXPECT_EQ(0, std::memcmp(t.data_ptr(), u.data_ptr(), size_t(t.numel() * t.element_size()))) << f << ": " << name;
    }
  }
  // The log of the resumed run holds the same rows as the straight one (tokens/s aside).
  std::ifstream l1(o.out_dir + "/log.csv"), l2(a.out_dir + "/log.csv");
  std::string r1, r2;
  int rows = 0;
  while (std::getline(l1, r1) && std::getline(l2, r2)) {
    EXPECT_EQ(r1.substr(0, r1.rfind(',')), r2.substr(0, r2.rfind(','))) << "row " << rows;
    ++rows;
  }
  EXPECT_EQ(rows, 1 + 4);  // header, then a row at every validation (every 5 steps; log_every is 10)
  EXPECT_TRUE(fs::exists(a.out_dir + "/loss.svg"));
}

// Four micro-batches of two sequences against one batch of eight: the same update up to the order
// of the sums (eager and compiled), and a split that does not divide the batch is refused.
TEST(Training, GradientAccumulationGivesTheWholeBatchsUpdate) {
  const std::string corpus = temp_dir("accum") + "/corpus.txt";
  std::string text;
  for (int i = 0; i < 300; ++i) text += "pack my box with five dozen liquor jugs " + std::to_string(i * 7919 % 1000) + ".\n";
  write_file(corpus, text);
  const std::string cfg = temp_dir("accum_cfg") + "/config.json";
  write_file(cfg, micro_config("llama").to_json());
  train::Options o;
  o.config_path = cfg, o.data_path = corpus, o.steps = 6, o.batch = 8, o.seq_len = 32, o.warmup = 2;
  o.val_every = 6, o.val_batches = 1, o.quiet = true;
  const auto run = [&](int64_t accum, bool compiled, const std::string& name) {
    train::Options a = o;
    a.grad_accum = accum, a.compile = compiled, a.out_dir = temp_dir(name);
    const train::Result r = train::run(a);
    return std::make_pair(r, io::load_safetensors(a.out_dir + "/model.safetensors").tensors);
  };
  const auto [whole, w1] = run(1, false, "accum1");
  for (const bool compiled : {false, true}) {
    const auto [parts, w4] = run(4, compiled, compiled ? "accum4c" : "accum4");
    ASSERT_EQ(whole.losses.size(), parts.losses.size());
    for (size_t i = 0; i < whole.losses.size(); ++i) EXPECT_NEAR(whole.losses[i], parts.losses[i], 1e-5 * whole.losses[i]) << "step " << i + 1;
    EXPECT_NEAR(whole.val_loss, parts.val_loss, 1e-5 * whole.val_loss);
    for (auto& [name, t] : w1) {
      const Tensor& u = w4.at(name);
      const double diff = max(abs(t - u)).item<double>(), scale = max(abs(t)).item<double>();
      EXPECT_LE(diff, 1e-5 * scale) << name << (compiled ? " (compiled)" : "");
    }
  }
  train::Options bad = o;
  bad.grad_accum = 3, bad.out_dir = temp_dir("accum3");
  try {
    train::run(bad);
    ADD_FAILURE() << "grad_accum 3 over 8 sequences was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[train] Options::grad_accum 3 does not divide the 8 sequences"), std::string::npos) << e.what();
  }
}

// Blocks under autograd::checkpoint against blocks recorded as usual: the same loss and gradients
// (dropout on, f32 and bf16 autocast, GPT-2 and LLaMA blocks), with fewer bytes held at the peak.
TEST(Training, CheckpointedActivationsGiveTheSameGradientsInLessMemory) {
  for (const char* type : {"gpt2", "llama"})
    for (const DType compute : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(std::string(type) + " " + dtype_name(compute));
      nn::ModelConfig c = micro_config(type);
      c.dropout = 0.1, c.num_hidden_layers = 6, c.hidden_size = 64, c.intermediate_size = 256;  // activations dominate the peak
      nn::GPT model(c);
      model.init_weights(3);
      manual_seed(9);
      const Tensor x = randint(0, c.vocab_size, {8, 64}, DType::i64), y = randint(0, c.vocab_size, {8, 64}, DType::i64);
      double loss[2];
      int64_t peak[2];
      std::vector<Tensor> grads[2];
      for (const bool ckpt : {false, true}) {
        model.checkpoint_activations = ckpt;
        model.zero_grad();
        manual_seed(21);
        cpu_reset_peak();
        const int64_t live = cpu_live_bytes();
        Tensor l;
        {
          AutocastGuard cast(compute);
          const Tensor logits = model.forward(x);
          l = cross_entropy(logits.reshape({-1, logits.size(-1)}), y.reshape({-1}));
        }
        l.backward();
        peak[ckpt] = cpu_peak_bytes() - live;
        loss[ckpt] = l.item<double>();
        for (const Tensor& p : model.parameters()) grads[ckpt].push_back(p.grad());
      }
      EXPECT_EQ(loss[1], loss[0]);
      for (size_t i = 0; i < grads[0].size(); ++i) EXPECT_TRUE(test::all_close(grads[1][i], grads[0][i], 1e-5, 1e-7)) << i;
      EXPECT_LT(peak[1], peak[0] / 2) << peak[1] << " vs " << peak[0] << " bytes";
    }
  train::Options o;
  o.checkpoint_activations = true, o.compile = true, o.steps = 1, o.out_dir = temp_dir("ckpt_compile");
  try {
    train::run(o);
    ADD_FAILURE() << "--checkpoint-activations with --compile was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[train] Options::checkpoint_activations"), std::string::npos) << e.what();
  }
}

TEST(Training, AFolderWithACheckpointIsContinuedReplacedOrRefusedNeverOverwrittenSilently) {
  const std::string corpus = temp_dir("guard_data") + "/corpus.txt", other = temp_dir("guard_data2") + "/corpus.txt";
  std::string text;
  for (int i = 0; i < 300; ++i) text += "a checkpoint is a promise " + std::to_string(i) + "\n";
  write_file(corpus, text);
  write_file(other, text + "and a different tail\n");
  const std::string cfg = temp_dir("guard_cfg") + "/config.json";
  write_file(cfg, micro_config("gpt2").to_json());
  train::Options o;
  o.config_path = cfg, o.data_path = corpus, o.steps = 4, o.batch = 2, o.seq_len = 16, o.warmup = 1;
  o.val_every = 4, o.val_batches = 1, o.save_every = 1000, o.quiet = true;
  o.out_dir = temp_dir("guarded_out");
  // --resume on a folder without a checkpoint: an error, not a fresh start.
  o.resume = true;
  EXPECT_TRUE(test::throws_naming("train", [&] { train::run(o); }));
  o.resume = false;
  EXPECT_EQ(train::run(o).step, 4);
  const std::string weights = read_file(o.out_dir + "/model.safetensors");
  // A plain second run refuses the folder and leaves the checkpoint as it was.
  try {
    train::run(o);
    ADD_FAILURE() << "a second run overwrote the checkpoint";
  } catch (const IOError& e) {
    EXPECT_NE(std::string(e.what()).find("already holds a checkpoint"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Options::overwrite"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_file(o.out_dir + "/model.safetensors"), weights);
  // Resuming past the end has nothing to train: an error naming the step.
  o.resume = true;
  EXPECT_TRUE(test::throws_naming("train", [&] { train::run(o); }));
  // Resuming with another batch, sequence length or data is refused with each difference named.
  o.steps = 8;
  for (int k = 0; k < 3; ++k) {
    train::Options c = o;
    if (k == 0) c.batch = 4;
    if (k == 1) c.seq_len = 12;
    if (k == 2) c.data_path = other;
    try {
      train::run(c);
      ADD_FAILURE() << "resume accepted a change " << k;
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(k == 0 ? "batch: checkpoint 2, now 4" : k == 1 ? "seq_len: checkpoint 16, now 12" : "data"),
                std::string::npos) << e.what();
    }
  }
  train::Options changed = o;
  changed.seq_len = 12, changed.allow_changes = true, changed.steps = 5;
  EXPECT_EQ(train::run(changed).step, 5);  // --allow-changes: fine-tuning on other shapes
  // A corrupt training state: a negative step is refused naming the file.
  write_file(o.out_dir + "/train_state.json", "{\"step\": -50}");
  EXPECT_TRUE(test::throws_naming(o.out_dir + "/train_state.json", [&] { train::run(o); }));
  write_file(o.out_dir + "/train_state.json", "{\"step\": \"five\"}");
  EXPECT_TRUE(test::throws_naming(o.out_dir + "/train_state.json", [&] { train::run(o); }));
  // --overwrite starts over in the same folder.
  o.resume = false, o.overwrite = true, o.steps = 3;
  EXPECT_EQ(train::run(o).step, 3);
  // A leftover temporary file of a killed writer (no such process) goes at the next start.
  write_file(o.out_dir + "/model.safetensors.tmp.999999999.AbC123", "partial");
  o.steps = 4;
  train::run(o);
  EXPECT_FALSE(fs::exists(o.out_dir + "/model.safetensors.tmp.999999999.AbC123"));
  // A damaged log: resume names the file and the line.
  write_file(o.out_dir + "/log.csv", read_file(o.out_dir + "/log.csv") + "3,abc,,1\n");
  o.resume = true, o.overwrite = false, o.steps = 6;
  EXPECT_TRUE(test::throws_naming(o.out_dir + "/log.csv", [&] { train::run(o); }));
}

TEST(Training, NonFiniteWeightsStopTrainingAndGenerationWithAnError) {
  const std::string cfg = temp_dir("nan_cfg") + "/config.json";
  write_file(cfg, micro_config("gpt2").to_json());
  train::Options o;
  o.config_path = cfg, o.steps = 2, o.batch = 2, o.seq_len = 16, o.warmup = 1, o.val_every = 2, o.val_batches = 1, o.quiet = true;
  o.out_dir = temp_dir("nan_out");
  train::run(o);
  // Poison the checkpoint's weights: resuming stops at the first step and saves nothing.
  const std::string committed = o.out_dir + "/model.step-00000002.safetensors";  // what train_state.json names
  io::SafeTensors st = io::load_safetensors(committed);
  std::map<std::string, Tensor> poisoned;
  for (auto& [name, t] : st.tensors) poisoned[name] = t.clone();
  for (auto& [name, t] : poisoned) t.data<float>()[0] = NAN;
  io::save_safetensors(committed, poisoned, {{"format", "sinter"}});
  const std::string state = read_file(o.out_dir + "/train_state.json");
  o.resume = true, o.steps = 4, o.save_every = 1;
  try {
    train::run(o);
    ADD_FAILURE() << "trained on NaN weights";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("stopping without saving"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_file(o.out_dir + "/train_state.json"), state) << "a NaN step saved a checkpoint";
  // Generation from those weights: an error, not NUL bytes; any temperature > 0 samples.
  auto model = train::load_model(o.out_dir);
  EXPECT_TRUE(test::throws_naming("generate", [&] { train::generate(*model, tensor<int64_t>({1, 2, 3}), 4, train::Sampling{}); }));
  nn::GPT fresh(micro_config("gpt2"));
  fresh.init_weights(3);
  train::Sampling tiny;
  tiny.temperature = 1e-40;
  const Tensor ids = train::generate(fresh, tensor<int64_t>({1, 2, 3}), 8, tiny);
  train::Sampling greedy;
  greedy.temperature = 0;
  EXPECT_TRUE(test::all_close(ids, train::generate(fresh, tensor<int64_t>({1, 2, 3}), 8, greedy), 0, 0)) << "a tiny temperature acts greedily";
}

class KVCacheGeneration : public ::testing::TestWithParam<std::string> {};

TEST_P(KVCacheGeneration, GreedyMatchesRecomputingTheContext) {
  manual_seed(1);
  nn::GPT model(micro_config(GetParam()));
  model.init_weights(3);
  {
    // A few steps of training so the distribution is not uniform noise.
    NoGradGuard g;
    for (auto& [n, t] : model.named_parameters()) t->mul_(4.0);
  }
  Tensor prompt = data::encode("Once upon a time");
  train::Sampling greedy;
  greedy.temperature = 0;
  Tensor with = train::generate(model, prompt, 64, greedy, true);
  Tensor without = train::generate(model, prompt, 64, greedy, false);
  EXPECT_EQ(with.numel(), prompt.numel() + 64);
  EXPECT_EQ(with.to_vector<int64_t>(), without.to_vector<int64_t>());
  // Past the model's 128 positions the window slides; both paths slide alike.
  Tensor long_with = train::generate(model, prompt, 200, greedy, true);
  EXPECT_EQ(long_with.to_vector<int64_t>(), train::generate(model, prompt, 200, greedy, false).to_vector<int64_t>());
  const std::vector<int64_t> long_ids = long_with.to_vector<int64_t>();
  EXPECT_EQ(std::vector<int64_t>(long_ids.begin(), long_ids.begin() + with.numel()), with.to_vector<int64_t>());
  // Sampling is reproducible with a seed.
  train::Sampling s;
  s.seed = 9, s.top_k = 20, s.top_p = 0.9;
  EXPECT_EQ(train::generate(model, prompt, 32, s).to_vector<int64_t>(), train::generate(model, prompt, 32, s).to_vector<int64_t>());
}

INSTANTIATE_TEST_SUITE_P(Models, KVCacheGeneration, ::testing::Values("gpt2", "llama", "llama-window"));

TEST(Config, SlidingWindowRoundTripsAndChangesAttention) {
  nn::ModelConfig c = micro_config("llama-window");
  const nn::ModelConfig back = nn::ModelConfig::from_json(c.to_json(), "config.json");
  EXPECT_EQ(back.sliding_window, 8);
  manual_seed(2);
  nn::GPT windowed(c);
  windowed.init_weights(5);
  c.sliding_window = 0;
  nn::GPT full(c);
  full.load_state_dict(windowed.state_dict());
  NoGradGuard g;
  Tensor ids = randint(0, 256, {1, 24});
  Tensor a = windowed.forward(ids), b = full.forward(ids);
  // The first 8 positions see the same keys either way; later ones do not.
  EXPECT_TRUE(test::all_close(a.narrow(1, 0, 8), b.narrow(1, 0, 8), 1e-5, 1e-5));
  EXPECT_FALSE(test::all_close(a.narrow(1, 8, 16), b.narrow(1, 8, 16), 1e-3, 1e-3));
  EXPECT_TRUE(test::throws_naming("config.json", [] {
    nn::ModelConfig::from_json("{\"model_type\": \"llama\", \"sliding_window\": -2}", "config.json");
  }));
}

TEST(Module, StateDictIsStrictAndNamesEveryProblem) {
  nn::GPT model(micro_config("gpt2"));
  auto sd = model.state_dict();
  sd.erase("norm_f.bias");
  sd["extra.weight"] = zeros({2});
  sd["blocks.0.attn.q_proj.weight"] = zeros({3, 3});
  try {
    model.load_state_dict(sd);
    FAIL() << "no error";
  } catch (const ValueError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("missing keys: norm_f.bias"), std::string::npos) << m;
    EXPECT_NE(m.find("unexpected keys: extra.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("blocks.0.attn.q_proj.weight (checkpoint (3, 3) f32, model (32, 32) f32)"), std::string::npos) << m;
  }
  EXPECT_GT(model.num_parameters(), 0);
  model.eval();
  EXPECT_FALSE(model.blocks[0]->attn->is_training());
}

TEST(Module, ModelsBuiltToBeLoadedSkipTheRandomDrawOnTheirThreadOnly) {
  const auto all_zero = [](const Tensor& t) { return max(abs(t)).item<double>() == 0.0; };
  {
    nn::SkipInitGuard skip;
    EXPECT_TRUE(nn::SkipInitGuard::active());
    nn::Linear l(8, 4);
    nn::Embedding e(5, 3);
    EXPECT_TRUE(all_zero(l.weight) && all_zero(l.bias) && all_zero(e.weight));
    bool other_thread_draws = false;
    std::thread([&] { other_thread_draws = !nn::SkipInitGuard::active() && !all_zero(nn::Linear(8, 4).weight); }).join();
    EXPECT_TRUE(other_thread_draws);
  }
  EXPECT_FALSE(nn::SkipInitGuard::active());
  nn::Linear drawn(8, 4);
  EXPECT_FALSE(all_zero(drawn.weight));
  EXPECT_LE(max(abs(drawn.weight)).item<double>(), 1.0 / std::sqrt(8.0));
}

// GPT-2 small, as Hugging Face's gpt2 checkpoint counts it (tied embeddings): 124,439,808.
TEST(Config, TheGpt2124mPresetHasGpt2SmallsParameters) {
  nn::SkipInitGuard skip;
  nn::GPT model(nn::ModelConfig::preset("gpt2-124m"));
  EXPECT_EQ(model.num_parameters(), 124439808);
  EXPECT_EQ(model.config().vocab_size, 50257);
}

TEST(Config, UnknownKeysAreListed) {
  try {
    nn::ModelConfig::from_json(R"({"model_type": "gpt2", "n_embd": 64, "n_layers": 2, "dropuot": 0.1})", "cfg.json");
    FAIL() << "no error";
  } catch (const IOError& e) {
    EXPECT_STREQ(e.what(), "[cfg.json] unknown config keys for gpt2: dropuot, n_layers");
  }
  EXPECT_THROW(nn::ModelConfig::from_json(R"({"model_type": "gpt2", "n_embd": 30, "n_head": 4})", "c"), ValueError);
  auto c = nn::ModelConfig::from_json(micro_config("llama").to_json(), "round trip");
  EXPECT_EQ(c.to_json(), micro_config("llama").to_json());
}

TEST(Optim, SGDWithNesterovMatchesTheFormula) {
  Tensor w = tensor<float>({1.0f, -2.0f}).requires_grad_();
  optim::SGD opt({{"w", &w}}, 0.1, 0.9, true, 0.01);
  std::vector<double> ref{1.0, -2.0}, buf{0, 0};
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    sum(w * w).backward();  // g = 2w
    opt.step();
    for (int i = 0; i < 2; ++i) {
      const double g = 2 * ref[size_t(i)] + 0.01 * ref[size_t(i)];
      buf[size_t(i)] = step == 0 ? g : 0.9 * buf[size_t(i)] + g;
      ref[size_t(i)] -= 0.1 * (g + 0.9 * buf[size_t(i)]);
    }
  }
  EXPECT_TRUE(test::all_close(w.detach(), ref, 1e-6, 1e-6));
}

TEST(Optim, ScheduleAndClipping) {
  EXPECT_DOUBLE_EQ(optim::warmup_cosine(0, 10, 100, 1.0, 0.1), 0.1);
  EXPECT_DOUBLE_EQ(optim::warmup_cosine(9, 10, 100, 1.0, 0.1), 1.0);
  EXPECT_NEAR(optim::warmup_cosine(55, 10, 100, 1.0, 0.1), 0.55, 1e-12);
  EXPECT_DOUBLE_EQ(optim::warmup_cosine(100, 10, 100, 1.0, 0.1), 0.1);
  Tensor a = ones({4}).requires_grad_();
  sum(a * 3.0).backward();  // grad 3 everywhere: norm 6
  EXPECT_NEAR(optim::clip_grad_norm({a}, 1.5).item<double>(), 6.0, 1e-9);
  EXPECT_NEAR(std::sqrt(sum(a.grad() * a.grad()).item<float>()), 1.5, 1e-5);
}

TEST(Errors, BadInputGetsAClearError) {
  const std::string dir = temp_dir("errors");
  EXPECT_TRUE(test::throws_naming(dir + "/missing.txt", [&] { data::ByteDataset::from_file(dir + "/missing.txt"); }));
  write_file(dir + "/empty.txt", "");
  EXPECT_TRUE(test::throws_naming(dir + "/empty.txt", [&] { data::ByteDataset::from_file(dir + "/empty.txt"); }));
  write_file(dir + "/short.txt", "hello");
  train::Options o;
  o.data_path = dir + "/short.txt";
  o.quiet = true;
  EXPECT_TRUE(test::throws_naming(dir + "/short.txt", [&] { train::run(o); }));
  EXPECT_TRUE(test::throws_naming(dir + "/nockpt", [&] { train::load_model(dir + "/nockpt"); }));
  // A checkpoint whose weights belong to another model.
  const std::string ck = dir + "/ckpt";
  nn::GPT model(micro_config("gpt2"));
  train::save_checkpoint(ck, model, {}, "{}");
  nn::ModelConfig other = micro_config("gpt2");
  other.num_hidden_layers = 3;
  // (The committed step's files, which train_state.json names and the plain names link to.)
  const std::string weights = ck + "/model.step-00000000.safetensors", config = ck + "/config.step-00000000.json";
  write_file(config, other.to_json());
  EXPECT_TRUE(test::throws_naming(config, [&] { train::load_model(ck); }));  // "... does not fit the weights in <weights>"
  // A config of a huge model is refused before anything that size is allocated.
  nn::ModelConfig huge = micro_config("gpt2");
  huge.hidden_size = int64_t(1) << 22, huge.intermediate_size = int64_t(1) << 24;
  write_file(config, huge.to_json());
  try {
    train::load_model(ck);
    ADD_FAILURE() << "loaded";
  } catch (const IOError& e) {
    EXPECT_NE(std::string(e.what()).find("does not fit the weights in " + weights), std::string::npos) << e.what();
  }
  write_file(weights, "garbage");
  EXPECT_TRUE(test::throws_naming(weights, [&] { train::load_model(ck); }));
  write_file(config, "{\"n_embd\": 32, \"colour\": 1}");
  EXPECT_TRUE(test::throws_naming(config, [&] { train::load_model(ck); }));
  for (const char* bad : {"{\"n_embd\": \"wide\"}", "{\"model_type\": 2}", "{\"tie_word_embeddings\": \"yes\"}",
                          "{\"n_embd\": 12000000000000000056}", "{\"n_layer\": -9223372036854775808}"}) {
    write_file(config, bad);
    try {
      train::load_model(ck);
      ADD_FAILURE() << bad;
    } catch (const IOError& e) {  // the file, the key and the value
      const std::string m = e.what();
      EXPECT_EQ(m.rfind("[" + config + "] config key ", 0), 0u) << m;
    }
  }
  write_file(config, micro_config("gpt2").to_json());
  fs::remove(weights);
  EXPECT_TRUE(test::throws_naming(ck + "/train_state.json", [&] { train::load_model(ck); }));  // names what is missing
  nn::GPT m2(micro_config("gpt2"));
  EXPECT_TRUE(test::throws_naming("generate", [&] { train::generate(m2, Tensor(zeros({0}, DType::i64)), 10, {}); }));
}

TEST(Errors, TheCommandLineExitsNonZeroWithAMessage) {
  const std::string dir = temp_dir("cli");
  auto run = [&](const std::string& args) {
    const std::string cmd = std::string(SINTER_CLI) + " " + args + " > " + dir + "/out.txt 2>&1";
    const int rc = std::system(cmd.c_str());
    std::ifstream f(dir + "/out.txt");
    std::string out((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    return std::make_pair(rc, out);
  };
  auto [rc1, out1] = run("train --data " + dir + "/nope.txt --out " + dir + "/o");
  EXPECT_NE(rc1, 0);
  EXPECT_NE(out1.find("no such data file"), std::string::npos) << out1;
  auto [rc2, out2] = run("train --steps -5");
  EXPECT_NE(rc2, 0);
  EXPECT_NE(out2.find("--steps"), std::string::npos) << out2;
  auto [rc3, out3] = run("generate --checkpoint " + dir + "/none");
  EXPECT_NE(rc3, 0);
  EXPECT_NE(out3.find("checkpoint folder not found"), std::string::npos) << out3;
  auto [rc4, out4] = run("generate --temperature -1");
  EXPECT_NE(rc4, 0);
  auto [rc5, out5] = run("info " + dir + "/none");
  EXPECT_NE(rc5, 0);
  write_file(dir + "/a_file", "x");
  auto [rc6, out6] = run("train --steps 1 --out " + dir + "/a_file");  // the output folder is a file
  EXPECT_NE(rc6, 0);
  EXPECT_NE(out6.find("cannot create the folder"), std::string::npos) << out6;
  auto [rc7, out7] = run("bench nosuchsuite");
  EXPECT_NE(rc7, 0);
  // The library's errors name Options fields; the command line shows the flags that set them.
  auto [rc8, out8] = run("train --steps 1 --out " + dir + "/o8 --resume --overwrite");
  EXPECT_NE(rc8, 0);
  EXPECT_NE(out8.find("--resume and --overwrite exclude each other"), std::string::npos) << out8;
  EXPECT_EQ(out8.find("Options::"), std::string::npos) << out8;
}

TEST(Attention, BackendsAgreeAndTheChoiceIsExplained) {
  manual_seed(4);
  Tensor q = randn({2, 4, 33, 32}), k = randn({2, 2, 40, 32}), v = randn({2, 2, 40, 32});
  Tensor flash = scaled_dot_product_attention(q, k, v, {}, 0.0, true, {}, true, SDPABackend::flash);
  Tensor math = scaled_dot_product_attention(q, k, v, {}, 0.0, true, {}, true, SDPABackend::math);
  EXPECT_TRUE(test::all_close(flash, math, 1e-5, 1e-5));
  EXPECT_EQ(sdpa_choose(q, k, {}, 0.0).backend, SDPABackend::flash);  // f32: the fast kernel, at any head dim
  const SDPAChoice odd = sdpa_choose(Tensor::symbolic({1, 2, 8, 12}), Tensor::symbolic({1, 2, 8, 12}), {}, 0.0);
  EXPECT_EQ(odd.backend, SDPABackend::flash);
  EXPECT_NE(odd.reason.find("head dims 12/12"), std::string::npos) << odd.reason;
  const SDPAChoice f64 = sdpa_choose(q.to(DType::f64), k.to(DType::f64), {}, 0.0);
  EXPECT_EQ(f64.backend, SDPABackend::math);
  EXPECT_NE(f64.reason.find("f64"), std::string::npos) << f64.reason;
  // A decode step against the first positions of a KV cache: read in place, same result.
  Tensor cache_k = randn({2, 2, 64, 32}), cache_v = randn({2, 2, 64, 32}), q1 = randn({2, 4, 1, 32});
  Tensor kv = cache_k.narrow(2, 0, 40), vv = cache_v.narrow(2, 0, 40);
  EXPECT_TRUE(test::all_close(scaled_dot_product_attention(q1, kv, vv, {}, 0.0, true, {}, true, SDPABackend::flash),
                              scaled_dot_product_attention(q1, kv, vv, {}, 0.0, true, {}, true, SDPABackend::math), 1e-5, 1e-5));
  // Sliding window: both backends agree, forward and backward.
  Tensor qw = q.detach().requires_grad_(), kw = k.detach().requires_grad_();
  Tensor fw = scaled_dot_product_attention(qw, kw, v, {}, 0.0, true, {}, true, SDPABackend::flash, 9);
  Tensor mw = scaled_dot_product_attention(q, k, v, {}, 0.0, true, {}, true, SDPABackend::math, 9);
  EXPECT_TRUE(test::all_close(fw, mw, 1e-5, 1e-5));
  EXPECT_FALSE(test::all_close(fw, flash, 1e-3, 1e-3));  // the window changed something
  auto gq = autograd::grad({sum(fw * fw)}, {qw, kw});
  Tensor qm = q.detach().requires_grad_(), km = k.detach().requires_grad_();
  Tensor mw2 = scaled_dot_product_attention(qm, km, v, {}, 0.0, true, {}, true, SDPABackend::math, 9);
  auto gm = autograd::grad({sum(mw2 * mw2)}, {qm, km});
  EXPECT_TRUE(test::all_close(gq[0], gm[0], 1e-4, 1e-4));
  EXPECT_TRUE(test::all_close(gq[1], gm[1], 1e-4, 1e-4));
  EXPECT_TRUE(test::throws_naming("sdpa", [&] { scaled_dot_product_attention(q, k, v, {}, 0.0, false, {}, true, SDPABackend::math, 4); }));
  EXPECT_EQ(sdpa_choose(q, k, {}, 0.1).backend, SDPABackend::flash);  // dropout runs in the kernel (tests/attention_test.cpp)
}

// A model moved to bf16 (`sinter generate --dtype bf16`) runs each family, RoPE included, and gives
// the f32 model's logits within bf16 rounding through its layers.
TEST(GPT, ABf16ModelOfEachFamilyGivesTheF32ModelsLogits) {
  for (const char* type : {"gpt2", "llama", "llama-window"}) {
    manual_seed(21);
    nn::GPT model(test::micro_config(type));
    model.eval();
    NoGradGuard no_grad;
    const Tensor prompt = tensor<int64_t>({3, 1, 4, 1, 5, 9}).reshape({1, 6});
    const Tensor want = model.forward(prompt).to(DType::f64);
    model.to(DType::bf16);
    const Tensor got = model.forward(prompt);
    ASSERT_EQ(got.dtype(), DType::bf16) << type;
    const double err = max(abs(got.to(DType::f64) - want)).item<double>() / max(abs(want)).item<double>();
    EXPECT_LE(err, std::ldexp(1.0, -6)) << type;  // about 2^-8 here: bf16 rounding through the layers
    const std::vector<int64_t> tokens = train::generate(model, tensor<int64_t>({3, 1, 4}), 5, {.temperature = 0}).to_vector<int64_t>();
    EXPECT_EQ(tokens.size(), 8u) << type;
  }
}

TEST(Autocast, LinearComputesInBf16AndGradientsReachTheF32Weights) {
  manual_seed(3);
  Tensor x = randn({5, 64}), w = (randn({7, 64}) * 0.1).requires_grad_(), b = randn({7}).requires_grad_();
  Tensor y;
  {
    AutocastGuard autocast(DType::bf16);
    EXPECT_EQ(autocast_dtype(), DType::bf16);
    y = linear(x, w, b);
  }
  EXPECT_EQ(autocast_dtype(), DType::f32);
  EXPECT_EQ(y.dtype(), DType::f32);
  // The reference: the bf16-rounded operands multiplied in double, rounded to bf16 like the output.
  auto r = [](const Tensor& t) { return t.detach().to(DType::bf16).to(DType::f64); };
  Tensor ref = linear(r(x), r(w), r(b)).to(DType::bf16).to(DType::f64);
  EXPECT_CLOSE(y.to(DType::f64), ref, 1e-2, 1e-2);
  EXPECT_FALSE(test::all_close(y, linear(x, w.detach(), b.detach()), 1e-6, 1e-6));  // it did round
  Tensor g = randn({5, 7});
  y.backward(g);
  ASSERT_EQ(w.grad().dtype(), DType::f32);
  EXPECT_CLOSE(w.grad(), matmul(g.t(), x), 2e-2, 2e-2);
  EXPECT_CLOSE(b.grad(), sum(g, {0}), 2e-2, 2e-2);
  EXPECT_TRUE(test::throws_naming("autocast", [] { AutocastGuard bad(DType::f16); }));
}

TEST(Training, Bf16AutocastTracksF32) {
  const std::string corpus = temp_dir("bf16") + "/corpus.txt";
  std::string text;
  for (int i = 0; i < 400; ++i) text += "the quick brown fox " + std::to_string(i * 7919 % 1000) + " jumps over the lazy dog.\n";
  write_file(corpus, text);
  const std::string cfg = temp_dir("bf16_cfg") + "/config.json";
  write_file(cfg, micro_config("gpt2").to_json());
  train::Options o;
  o.config_path = cfg, o.data_path = corpus, o.steps = 30, o.batch = 4, o.seq_len = 32, o.warmup = 3, o.lr = 3e-3;
  o.val_every = 30, o.val_batches = 2, o.save_every = 1000, o.quiet = true;
  o.out_dir = temp_dir("f32_run");
  const auto f = train::run(o);
  o.dtype = "bf16";
  o.out_dir = temp_dir("bf16_run");
  const auto h = train::run(o);
  EXPECT_LT(h.val_loss, 0.8 * std::log(256.0));  // it learned
  EXPECT_NEAR(h.val_loss, f.val_loss, 0.05);
  EXPECT_NE(h.val_loss, f.val_loss);  // and it did compute in bf16
  // The checkpoint holds the f32 master weights.
  for (auto& [name, t] : io::load_safetensors(o.out_dir + "/model.safetensors").tensors) EXPECT_EQ(t.dtype(), DType::f32) << name;
  o.dtype = "f16";
  EXPECT_TRUE(test::throws_naming("train", [&] { train::run(o); }));
}

namespace sinter {
namespace {

TEST(SparseWorkflow, PruneFineTuneSaveAndGenerate) {
  // A micro model trained briefly, then: prune to 2:4 (loss rises), fine-tune with the pattern
  // held (loss falls back), save (f32 and int8 values), reload, identical logits, generate.
  const std::string dir = temp_dir("sparse_wf");
  std::string text;
  for (int i = 0; i < 400; ++i) text += "the quick brown fox " + std::to_string(i * 7919 % 1000) + " jumps over the lazy dog.\n";
  write_file(dir + "/corpus.txt", text);
  write_file(dir + "/config.json", micro_config("llama").to_json());
  train::Options o;
  o.config_path = dir + "/config.json", o.data_path = dir + "/corpus.txt", o.steps = 60, o.batch = 8, o.seq_len = 32;
  o.warmup = 5, o.val_every = 60, o.val_batches = 4, o.quiet = true, o.out_dir = dir + "/dense";
  train::run(o);
  for (const std::string values : {"f32", "i8"}) {
    SCOPED_TRACE(values);
    train::SparsifyOptions s;
    s.checkpoint = o.out_dir, s.out_dir = dir + "/sparse_" + values, s.data_path = o.data_path, s.finetune_steps = 40;
    s.batch = 8, s.seq_len = 32, s.val_batches = 4, s.lr = 3e-3, s.values = values, s.quiet = true;
    const auto r = train::sparsify(s);
    EXPECT_GT(r.pruned_val, r.dense_val);          // pruning costs something...
    EXPECT_LT(r.finetuned_val, r.pruned_val);      // ...that fine-tuning wins back
    EXPECT_NEAR(r.saved_val, r.finetuned_val, values == "f32" ? 1e-6 : 0.02);  // int8: quantised once
    EXPECT_LT(r.sparse_bytes, r.dense_bytes * (values == "f32" ? 0.6 : 0.2));
    auto model = train::load_model(s.out_dir);
    // what was written is what was evaluated
    EXPECT_NEAR(train::evaluate(*model, data::ByteDataset::from_file(o.data_path), s.batch, s.seq_len, s.val_batches, s.seed),
                r.saved_val, 1e-6);
    EXPECT_EQ(model->config().sparsity, "2:4");
    for (auto& l : model->block_linears()) {
      ASSERT_TRUE(l->sparse.defined());
      EXPECT_EQ(l->sparse.dtype(), dtype_from_name(values));
      EXPECT_FALSE(l->weight.defined());
    }
    // the sparse model computes what the dense model with the unpacked weights computes
    nn::ModelConfig dc = model->config();
    dc.sparsity.clear();
    nn::GPT dense(dc);
    std::map<std::string, Tensor> sd;
    for (auto& [n, t] : model->state_dict()) {
      const auto at = n.rfind(".weight_");
      if (at == std::string::npos) { sd[n] = t; continue; }
      if (n.compare(at, std::string::npos, ".weight_values") != 0) continue;
      const std::string base = n.substr(0, at);
      sd[base + ".weight"] = SemiStructuredSparse{t, model->state_dict().at(base + ".weight_meta"),
                                                  model->state_dict().at(base + ".weight_scales")}.to_dense().to(DType::f32);
    }
    dense.load_state_dict(sd);
    Tensor idx = randint(0, 256, {2, 16});
    NoGradGuard g;
    EXPECT_TRUE(test::all_close(model->forward(idx), dense.forward(idx), 1e-4, 1e-4));
    Tensor out = train::generate(*model, data::encode("the quick"), 12, train::Sampling{0.0, 0, 1.0, 1});
    EXPECT_EQ(out.numel(), 9 + 12);
  }
  EXPECT_TRUE(test::throws_naming("sparsify", [&] {
    train::SparsifyOptions s;
    s.checkpoint = dir + "/sparse_f32", s.out_dir = dir + "/again", s.data_path = o.data_path, s.seq_len = 32, s.quiet = true;
    train::sparsify(s);
  }));
}

}  // namespace
}  // namespace sinter

TEST(Data, AFileThatShrinksWhileItIsReadIsAnErrorNamingIt) {
  // The data is memory-mapped: a file truncated under a running job must not kill it with SIGBUS.
  const std::string path = temp_dir("shrink") + "/corpus.txt";
  std::string text;
  for (int i = 0; i < 20000; ++i) text += "bytes to be truncated " + std::to_string(i) + "\n";
  write_file(path, text);
  const auto data = data::ByteDataset::from_file(path);
  (void)data.batch(true, 4, 64, 1, 0);
  fs::resize_file(path, 0);
  EXPECT_TRUE(test::throws_naming(path, [&] { (void)data.batch(true, 4, 64, 1, 1); }));
  EXPECT_TRUE(test::throws_naming(path, [&] { (void)data.batch(false, 4, 64, 1, 2); }));  // and again: the handler stays armed
}

namespace {

// `sinter train` on a small model and corpus in `dir`, as a shell command.
struct CrashRun {
  std::string dir;
  explicit CrashRun(const std::string& name) : dir(temp_dir(name)) {
    write_file(dir + "/config.json", micro_config("gpt2").to_json());
    std::string text;
    for (int i = 0; i < 300; ++i) text += "killed mid save " + std::to_string(i * 31 % 97) + "\n";
    write_file(dir + "/data.txt", text);
  }
  std::string cmd(const std::string& out, int64_t steps, const std::string& extra) const {
    return std::string(SINTER_CLI) + " train --config " + dir + "/config.json --data " + dir + "/data.txt --steps " +
           std::to_string(steps) + " --batch 4 --seq-len 32 --warmup 2 --val-every 100000 --save-every 1 --threads 1 --out " + out + " " +
           extra;
  }
};

// Every tensor of the committed model and optimizer state of `a` equals `b`'s, bit for bit.
void expect_same_checkpoint(const std::string& a, const std::string& b) {
  for (const char* f : {"model.safetensors", "optimizer.safetensors"}) {
    auto x = io::load_safetensors(a + "/" + f), y = io::load_safetensors(b + "/" + f);
    ASSERT_EQ(x.tensors.size(), y.tensors.size()) << f;
    for (auto& [name, t] : x.tensors) EXPECT_TRUE(test::all_close(y.tensors.at(name), t, 0, 0)) << f << ": " << name;
  }
}

// The folder holds one whole step: train_state.json names files that exist and the plain names
// are those files; no temporary file is left.
void expect_whole_step(const std::string& out, int64_t step) {
  const std::string state = read_file(out + "/train_state.json");
  EXPECT_NE(state.find("\"step\":" + std::to_string(step) + "}"), std::string::npos) << state;
  char tag[32];
  std::snprintf(tag, sizeof tag, ".step-%08lld", (long long)step);
  for (const char* stem : {"model", "optimizer"}) {
    const std::string committed = out + "/" + stem + tag + ".safetensors";
    EXPECT_NE(state.find(std::string(stem) + tag), std::string::npos) << state;
    EXPECT_TRUE(read_file(committed) == read_file(out + "/" + stem + ".safetensors")) << stem << ": the plain name is not the committed file";
  }
  EXPECT_NO_THROW(train::load_model(out));
}

}  // namespace

TEST(Training, FiftyKillsDuringSavesLeaveWholeStepsAndResumeEndsBitForBitWithAStraightRun) {
  // `sinter train --save-every 1` killed with SIGKILL at 50 random moments (many during saves),
  // resumed after each: every resume finds a whole committed step, and the run ends with the same
  // weights and optimizer state as one never interrupted.
  const CrashRun run("kill");
  const int64_t steps = 1500;
  ASSERT_EQ(std::system((run.cmd(run.dir + "/straight", steps, "") + " > /dev/null 2>&1").c_str()), 0);
  const std::string out = run.dir + "/killed";
  std::mt19937 rng(2026);
  int kills = 0;
  bool finished = false;
  for (int attempt = 0; attempt < 80 && !finished; ++attempt) {
    const bool resume = fs::exists(out + "/train_state.json");
    const std::string cmd = run.cmd(out, steps, resume ? "--resume" : "--overwrite") + " > " + run.dir + "/attempt.txt 2>&1";
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), (char*)nullptr);
      _exit(127);
    }
    int status = 0;
    if (kills < 50) {
      usleep(useconds_t(15000 + rng() % 135000));  // 15-150 ms in
      if (waitpid(pid, &status, WNOHANG) == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        ++kills;
        if (fs::exists(out + "/train_state.json")) {  // what the kill left: a whole step, loadable
          EXPECT_NO_THROW(train::load_model(out)) << "after kill " << kills;
        }
        continue;
      }
    } else {
      waitpid(pid, &status, 0);
    }
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "attempt " << attempt << ": " << read_file(run.dir + "/attempt.txt");
    finished = true;
  }
  ASSERT_TRUE(finished);
  EXPECT_EQ(kills, 50);
  expect_same_checkpoint(run.dir + "/straight", out);
  expect_whole_step(out, steps);
  int step_files = 0;
  for (const auto& e : fs::directory_iterator(out)) {
    const std::string n = e.path().filename().string();
    EXPECT_EQ(n.find(".tmp."), std::string::npos) << n;
    step_files += n.find(".step-") != std::string::npos;
  }
  EXPECT_EQ(step_files, 6);  // model, optimizer and config of the last two steps (--keep 2)
}

TEST(Training, AFailedWriteOrRenameAtAnyPointOfASaveLeavesThePreviousStepAndNamesTheFile) {
  // A full disk, injected at each file operation of a save in turn (SINTER_FAIL_FILE_OP=N fails
  // the Nth write or rename with ENOSPC): the run fails naming the file, the folder still holds
  // step 2 whole and loadable, and resuming without the failure ends as a straight run does.
  const CrashRun run("inject");
  ASSERT_EQ(std::system((run.cmd(run.dir + "/straight", 3, "") + " > /dev/null 2>&1").c_str()), 0);
  const std::string base = run.dir + "/base";
  ASSERT_EQ(std::system((run.cmd(base, 2, "") + " > /dev/null 2>&1").c_str()), 0);
  int failures = 0, after_commit = 0;
  for (int n = 1; n < 400; ++n) {
    const std::string out = run.dir + "/n";
    fs::remove_all(out);
    fs::copy(base, out, fs::copy_options::recursive | fs::copy_options::copy_symlinks);
    const std::string log = run.dir + "/inject.txt";
    const int rc = std::system(("SINTER_FAIL_FILE_OP=" + std::to_string(n) + " " + run.cmd(out, 3, "--resume") + " > " + log + " 2>&1").c_str());
    if (rc == 0) break;  // past the save's last operation
    ++failures;
    const std::string msg = read_file(log);
    EXPECT_NE(msg.find("No space left on device"), std::string::npos) << "operation " << n << ": " << msg;
    EXPECT_NE(msg.find("[" + out + "/"), std::string::npos) << "the error names the file (operation " << n << "): " << msg;
    // Step 2 whole, or step 3 whole when the failure came after its commit (writing the log).
    const bool committed3 = read_file(out + "/train_state.json").find("\"step\":3}") != std::string::npos;
    expect_whole_step(out, committed3 ? 3 : 2);
    after_commit += committed3;
    // The next start clears the failed save's files and finishes the run.
    if (!committed3) {
      ASSERT_EQ(std::system((run.cmd(out, 3, "--resume") + " > " + log + " 2>&1").c_str()), 0) << read_file(log);
    }
    expect_same_checkpoint(run.dir + "/straight", out);
    for (const auto& e : fs::directory_iterator(out)) EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos);
  }
  EXPECT_GT(failures - after_commit, 20);  // every write and rename of the step's files and the state
  EXPECT_GT(after_commit, 0);                // and of the log after the commit
}

// Hugging Face checkpoints: the directories under tests/data/hf were written by transformers'
// save_pretrained (scripts/hf_reference.py: GPT-2 and LLaMA with GQA, f32 and bf16, one sharded),
// with transformers' logits (computed in f32 from the saved weights) and 8 greedy tokens.
#include <cmath>
#include <filesystem>
#include <fstream>

#include <sinter/train.h>

#include "test_util.h"
#include "train_util.h"

using namespace sinter;
namespace fs = std::filesystem;

namespace {

std::string hf_dir(const std::string& name) { return std::string(SINTER_TEST_DATA) + "/hf/" + name; }

double relative_error(const Tensor& got, const Tensor& want) {
  const std::vector<double> a = to_double_vector(got), b = to_double_vector(want);
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
  return std::sqrt(num / den);
}

// A copy of a reference directory whose config.json has `key` set to `value` (JSON text).
std::string with_key(const std::string& name, const std::string& key, const std::string& value) {
  const std::string dir = test::temp_dir("hf_" + name + "_" + key);
  for (const auto& e : fs::directory_iterator(hf_dir(name))) fs::copy(e.path(), dir + "/" + e.path().filename().string());
  std::string cfg = test::read_file(dir + "/config.json");
  const std::string quoted = "\"" + key + "\": ";
  const size_t at = cfg.find(quoted);
  if (at == std::string::npos) {
    cfg.insert(cfg.find('{') + 1, "\n  " + quoted + value + ",");
  } else {
    const size_t from = at + quoted.size();
    size_t end = from;
    for (int depth = 0; end < cfg.size(); ++end) {  // the old value: up to the comma or brace that ends it
      const char ch = cfg[end];
      if (ch == '{' || ch == '[') ++depth;
      if ((ch == '}' || ch == ']') && depth-- == 0) break;
      if (ch == ',' && depth == 0) break;
    }
    cfg.replace(from, end - from, value);
  }
  test::write_file(dir + "/config.json", cfg);
  return dir;
}

}  // namespace

class HuggingFace : public ::testing::TestWithParam<std::string> {};

TEST_P(HuggingFace, LogitsAndGreedyTokensMatchTransformers) {
  const std::string dir = hf_dir(GetParam());
  auto model = nn::GPT::from_pretrained(dir);
  const io::SafeTensors ref = io::load_safetensors(dir + "/ref.safetensors");
  const Tensor& ids = ref.tensors.at("input_ids");
  NoGradGuard no_grad;
  model->eval();
  const Tensor logits = model->forward(ids);
  EXPECT_LE(relative_error(logits, ref.tensors.at("logits")), 1e-5);
  train::Sampling greedy;
  greedy.temperature = 0;
  const Tensor out = train::generate(*model, ids.reshape({-1}), 8, greedy);
  const std::vector<double> got = to_double_vector(out), want = to_double_vector(ref.tensors.at("greedy"));
  ASSERT_EQ(got.size(), ids.numel() + 8);
  EXPECT_EQ(std::vector<double>(got.end() - 8, got.end()), want);
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, HuggingFace, ::testing::Values("gpt2-f32", "gpt2-bf16", "llama-f32", "llama-bf16", "mistral-f32"),
                         [](const auto& info) { std::string s = info.param; for (char& c : s) if (c == '-') c = '_'; return s; });

TEST(HuggingFace, ExportReadsBackBitForBit) {
  for (const char* name : {"gpt2-f32", "llama-f32"}) {
    SCOPED_TRACE(name);
    auto model = nn::GPT::from_pretrained(hf_dir(name));
    const std::string out = test::temp_dir(std::string("hf_export_") + name);
    model->save_pretrained(out);
    auto again = nn::GPT::from_pretrained(out);
    auto a = model->named_parameters(), b = again->named_parameters();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].first, b[i].first);
      EXPECT_TRUE(test::all_close(*b[i].second, *a[i].second, 0, 0)) << a[i].first;
    }
  }
}

TEST(HuggingFace, KeysThatChangeTheMathAreHonoredOrRefused) {
  const Tensor ids = io::load_safetensors(hf_dir("gpt2-f32") + "/ref.safetensors").tensors.at("input_ids");
  NoGradGuard no_grad;
  auto logits = [&](const std::string& dir) { return nn::GPT::from_pretrained(dir)->forward(ids); };
  const Tensor base = logits(hf_dir("gpt2-f32"));
  // Honored: each changes the logits.
  for (auto [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"activation_function", "\"relu\""}, {"activation_function", "\"gelu\""}, {"layer_norm_epsilon", "0.5"}}) {
    SCOPED_TRACE(key + " = " + value);
    EXPECT_GT(relative_error(logits(with_key("gpt2-f32", key, value)), base), 1e-6);  // (gelu against its tanh form: ~1e-4)
  }
  const Tensor lbase = nn::GPT::from_pretrained(hf_dir("llama-f32"))->forward(ids);
  for (auto [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"hidden_act", "\"gelu\""}, {"rms_norm_eps", "0.5"}, {"rope_parameters", "{\"rope_type\": \"default\", \"rope_theta\": 100.0}"},
           {"sliding_window", "4"}, {"tie_word_embeddings", "true"}}) {
    SCOPED_TRACE(key + " = " + value);
    EXPECT_GT(relative_error(nn::GPT::from_pretrained(with_key("llama-f32", key, value))->forward(ids), lbase), 1e-4);
  }
  // Refused, naming the key.
  for (auto [name, key, value] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"gpt2-f32", "activation_function", "\"gelu_fast\""},
           {"gpt2-f32", "scale_attn_weights", "false"},
           {"gpt2-f32", "scale_attn_by_inverse_layer_idx", "true"},
           {"gpt2-f32", "add_cross_attention", "true"},
           {"gpt2-f32", "architectures", "[\"GPT2DoubleHeadsModel\"]"},
           {"gpt2-f32", "n_ctx", "7"},
           {"gpt2-f32", "n_inner", "\"wide\""},
           {"gpt2-f32", "colour", "1"},
           {"llama-f32", "rope_scaling", "{\"type\": \"linear\", \"factor\": 2.0}"},
           {"llama-f32", "rope_parameters", "{\"rope_type\": \"yarn\", \"rope_theta\": 10000.0}"},
           {"llama-f32", "hidden_act", "\"quick_gelu\""},
           {"llama-f32", "attention_bias", "true"},
           {"llama-f32", "mlp_bias", "true"},
           {"llama-f32", "head_dim", "16"}}) {
    SCOPED_TRACE(key + " = " + value);
    const std::string dir = with_key(name, key, value);
    try {
      nn::GPT::from_pretrained(dir);
      ADD_FAILURE() << "accepted";
    } catch (const IOError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(dir + "/config.json"), std::string::npos) << msg;
      EXPECT_NE(msg.find(key), std::string::npos) << msg;
    }
  }
}

TEST(HuggingFace, TheCommandLineDrivesACheckpointByIdsAndSeparatesTextFromStatistics) {
  // generate --ids with transformers' prompt gives transformers' greedy tokens, as JSON on stdout.
  const std::string dir = hf_dir("llama-bf16");
  const io::SafeTensors ref = io::load_safetensors(dir + "/ref.safetensors");
  std::string ids;
  for (double v : to_double_vector(ref.tensors.at("input_ids"))) {
    if (!ids.empty()) ids += ',';
    ids += std::to_string(int64_t(v));
  }
  const std::string out = test::temp_dir("hf_cli");
  auto run = [&](const std::string& args) {
    const int rc = std::system((std::string(SINTER_CLI) + " " + args + " > " + out + "/stdout 2> " + out + "/stderr").c_str());
    return std::make_tuple(rc, test::read_file(out + "/stdout"), test::read_file(out + "/stderr"));
  };
  auto [rc, json, err] = run("generate --checkpoint " + dir + " --temperature 0 --max-new-tokens 8 --format json --ids " + ids);
  ASSERT_EQ(rc, 0) << err;
  std::string want = "\"ids\":[";
  const std::vector<double> greedy = to_double_vector(ref.tensors.at("greedy"));
  for (size_t i = 0; i < greedy.size(); ++i) {
    if (i) want += ',';
    want += std::to_string(int64_t(greedy[i]));
  }
  EXPECT_NE(json.find(want + "]"), std::string::npos) << json;
  EXPECT_NE(err.find("tokens/s"), std::string::npos) << err;
  // Text: stdout holds the prompt and the generated bytes only; the statistics go to stderr.
  auto [rc2, text, err2] = run("generate --checkpoint " + hf_dir("gpt2-f32") + " --temperature 0 --max-new-tokens 5 --prompt Hi");
  ASSERT_EQ(rc2, 0) << err2;
  EXPECT_EQ(text.size(), 2u + 5u + 1u) << text;
  EXPECT_EQ(text.rfind("Hi", 0), 0u);
  EXPECT_EQ(text.find("tokens/s"), std::string::npos);
  EXPECT_NE(err2.find("[5 tokens"), std::string::npos) << err2;
  // A bad id is named.
  auto [rc3, o3, err3] = run("generate --checkpoint " + dir + " --ids 1,x,3");
  EXPECT_NE(rc3, 0);
  EXPECT_NE(err3.find("'x' is not a token id"), std::string::npos) << err3;
  // export-hf of a Sinter checkpoint reads back as the same model.
  auto [rc4, o4, err4] = run("export-hf " + dir + " --out " + out + "/exported");
  ASSERT_EQ(rc4, 0) << err4;
  NoGradGuard no_grad;
  const Tensor a = nn::GPT::from_pretrained(dir)->forward(ref.tensors.at("input_ids"));
  const Tensor b = nn::GPT::from_pretrained(out + "/exported")->forward(ref.tensors.at("input_ids"));
  EXPECT_TRUE(test::all_close(b, a, 0, 0));
}

TEST(HuggingFace, F16WeightsAndTrainingDropoutAreRead) {
  // An f16 copy of the GPT-2 checkpoint loads as the f32 model with f16-rounded weights.
  const std::string dir = test::temp_dir("hf_f16");
  fs::copy(hf_dir("gpt2-f32") + "/config.json", dir + "/config.json");
  std::map<std::string, Tensor> half;
  for (auto& [name, t] : io::load_safetensors(hf_dir("gpt2-f32") + "/model.safetensors").tensors) half[name] = cast(t, DType::f16);
  io::save_safetensors(dir + "/model.safetensors", half, {{"format", "pt"}});
  auto from_half = nn::GPT::from_pretrained(dir);
  auto full = nn::GPT::from_pretrained(hf_dir("gpt2-f32"));
  auto a = from_half->named_parameters(), b = full->named_parameters();
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(test::all_close(*a[i].second, cast(cast(*b[i].second, DType::f16), DType::f32), 0, 0)) << a[i].first;
  // resid_pdrop is the dropout of training: in train mode it changes the logits, in eval mode not.
  const Tensor ids = io::load_safetensors(hf_dir("gpt2-f32") + "/ref.safetensors").tensors.at("input_ids");
  NoGradGuard no_grad;
  auto drop = nn::GPT::from_pretrained(with_key("gpt2-f32", "resid_pdrop", "0.5"));
  EXPECT_TRUE(test::all_close(drop->forward(ids), full->forward(ids), 0, 0));  // from_pretrained: eval mode
  drop->train(), full->train();
  EXPECT_GT(relative_error(drop->forward(ids), full->forward(ids)), 1e-3);
}

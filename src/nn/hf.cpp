// Hugging Face checkpoints: a save_pretrained directory of GPT2LMHeadModel, LlamaForCausalLM or
// MistralForCausalLM (LLaMA's layout and math with a sliding window)
// read as it is (config.json with HF keys, model.safetensors or a sharded
// model.safetensors.index.json, f32 / bf16 / f16 tensors), and written back in the same form.
// GPT-2 stores its projections as Conv1D (in x out, the transpose of a Linear) and q, k, v fused
// in one c_attn; LLaMA's layout is a Linear's, under other names.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "io/atomic_file.h"
#include "sinter/io.h"
#include "sinter/nn.h"
#include "sinter/ops.h"

namespace sinter::nn {

namespace {
using json = nlohmann::json;
namespace fs = std::filesystem;

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  SINTER_CHECK_T(IOError, f.good(), "[", path, "] cannot open it");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Every tensor of the checkpoint by HF name, in f32: one file, or the shards an index names.
std::map<std::string, Tensor> read_weights(const std::string& dir) {
  std::map<std::string, Tensor> all;
  std::vector<std::string> files;
  const std::string index = dir + "/model.safetensors.index.json";
  if (fs::exists(index)) {
    json j;
    try {
      j = json::parse(read_text(index));
    } catch (const json::exception& e) {
      SINTER_THROW(IOError, "[", index, "] not valid JSON: ", e.what());
    }
    SINTER_CHECK_T(IOError, j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), "[", index,
                   "] has no \"weight_map\" object");
    std::set<std::string> shards;
    for (auto& [name, file] : j["weight_map"].items()) {
      SINTER_CHECK_T(IOError, file.is_string() && file.get<std::string>().find('/') == std::string::npos, "[", index, "] ", name,
                     " maps to ", file.dump(), ", not a file name in the folder");
      shards.insert(file.get<std::string>());
    }
    files.assign(shards.begin(), shards.end());
  } else {
    files.push_back("model.safetensors");
  }
  for (const std::string& f : files) {
    const std::string path = dir + "/" + f;
    SINTER_CHECK_T(IOError, fs::exists(path), "[", dir, "] ", f, " is missing (neither model.safetensors nor an index naming it)");
    for (auto& [name, t] : io::load_safetensors(path).tensors) {
      SINTER_CHECK_T(IOError, t.dtype() == DType::f32 || t.dtype() == DType::bf16 || t.dtype() == DType::f16, "[", path, "] ", name,
                     " is ", dtype_name(t.dtype()), "; checkpoints hold f32, bf16 or f16 weights");
      all[name] = t.dtype() == DType::f32 ? t : cast(t, DType::f32);
    }
  }
  return all;
}

// "h.3.attn.c_attn.weight" -> {3, "attn.c_attn.weight"} after `prefix`; {-1, ""} if it is not one.
std::pair<int64_t, std::string> layer_of(const std::string& name, const std::string& prefix) {
  if (name.rfind(prefix, 0) != 0) return {-1, ""};
  const size_t dot = name.find('.', prefix.size());
  if (dot == std::string::npos) return {-1, ""};
  const std::string digits = name.substr(prefix.size(), dot - prefix.size());
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return {-1, ""};
  return {std::stoll(digits), name.substr(dot + 1)};
}

Tensor linear_of_conv1d(const Tensor& w) { return w.t().contiguous(); }  // (in, out) -> (out, in)

std::map<std::string, Tensor> gpt2_to_sinter(std::map<std::string, Tensor> hf, const ModelConfig& c, const std::string& dir) {
  std::map<std::string, Tensor> sd;
  const int64_t C = c.hidden_size;
  for (auto& [raw, t] : hf) {
    const std::string name = raw.rfind("transformer.", 0) == 0 ? raw.substr(12) : raw;
    auto [i, rest] = layer_of(name, "h.");
    const std::string b = "blocks." + std::to_string(i) + ".";
    if (name == "wte.weight") sd["tok_emb.weight"] = t;
    else if (name == "wpe.weight") sd["pos_emb.weight"] = t;
    else if (name == "ln_f.weight" || name == "ln_f.bias") sd["norm_f." + name.substr(5)] = t;
    else if (name == "lm_head.weight") { if (!c.tie_word_embeddings) sd["lm_head.weight"] = t; }
    else if (i < 0) SINTER_THROW(IOError, "[", dir, "] unexpected GPT-2 tensor ", raw);
    else if (rest == "ln_1.weight" || rest == "ln_1.bias") sd[b + "norm1." + rest.substr(5)] = t;
    else if (rest == "ln_2.weight" || rest == "ln_2.bias") sd[b + "norm2." + rest.substr(5)] = t;
    else if (rest == "attn.c_attn.weight" || rest == "attn.c_attn.bias") {
      const bool weight = rest.ends_with("weight");
      const Tensor w = weight ? linear_of_conv1d(t) : t;  // (3C, C) or (3C)
      SINTER_CHECK_T(IOError, w.size(0) == 3 * C, "[", dir, "] ", raw, " has shape ", t.shape(), ", not 3 x ", C, " fused q, k, v");
      const char* parts[] = {"q_proj", "k_proj", "v_proj"};
      for (int k = 0; k < 3; ++k) sd[b + "attn." + parts[k] + (weight ? ".weight" : ".bias")] = w.narrow(0, k * C, C).contiguous();
    } else if (rest == "attn.c_proj.weight") sd[b + "attn.o_proj.weight"] = linear_of_conv1d(t);
    else if (rest == "attn.c_proj.bias") sd[b + "attn.o_proj.bias"] = t;
    else if (rest == "mlp.c_fc.weight") sd[b + "mlp.fc.weight"] = linear_of_conv1d(t);
    else if (rest == "mlp.c_fc.bias") sd[b + "mlp.fc.bias"] = t;
    else if (rest == "mlp.c_proj.weight") sd[b + "mlp.proj.weight"] = linear_of_conv1d(t);
    else if (rest == "mlp.c_proj.bias") sd[b + "mlp.proj.bias"] = t;
    else if (rest == "attn.bias" || rest == "attn.masked_bias") continue;  // causal-mask buffers of older files
    else SINTER_THROW(IOError, "[", dir, "] unexpected GPT-2 tensor ", raw);
  }
  return sd;
}

std::map<std::string, Tensor> llama_to_sinter(std::map<std::string, Tensor> hf, const ModelConfig& c, const std::string& dir) {
  std::map<std::string, Tensor> sd;
  const std::map<std::string, std::string> per_layer{
      {"input_layernorm.weight", "norm1.weight"},        {"post_attention_layernorm.weight", "norm2.weight"},
      {"self_attn.q_proj.weight", "attn.q_proj.weight"}, {"self_attn.k_proj.weight", "attn.k_proj.weight"},
      {"self_attn.v_proj.weight", "attn.v_proj.weight"}, {"self_attn.o_proj.weight", "attn.o_proj.weight"},
      {"mlp.gate_proj.weight", "mlp.gate.weight"},       {"mlp.up_proj.weight", "mlp.up.weight"},
      {"mlp.down_proj.weight", "mlp.down.weight"}};
  for (auto& [name, t] : hf) {
    auto [i, rest] = layer_of(name, "model.layers.");
    if (name == "model.embed_tokens.weight") sd["tok_emb.weight"] = t;
    else if (name == "model.norm.weight") sd["norm_f.weight"] = t;
    else if (name == "lm_head.weight") { if (!c.tie_word_embeddings) sd["lm_head.weight"] = t; }
    else if (i >= 0 && per_layer.count(rest)) sd["blocks." + std::to_string(i) + "." + per_layer.at(rest)] = t;
    else if (i >= 0 && rest == "self_attn.rotary_emb.inv_freq") continue;  // a buffer older files carry
    else SINTER_THROW(IOError, "[", dir, "] unexpected LLaMA tensor ", name);
  }
  return sd;
}

}  // namespace

bool is_pretrained_dir(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(dir + "/train_state.json", ec) || !fs::exists(dir + "/config.json", ec)) return false;
  return fs::exists(dir + "/model.safetensors.index.json", ec) || read_text(dir + "/config.json").find("\"architectures\"") != std::string::npos;
}

std::unique_ptr<GPT> GPT::from_pretrained(const std::string& dir) {
  std::error_code ec;
  SINTER_CHECK_T(IOError, fs::is_directory(dir, ec), "[", dir, "] checkpoint folder not found");
  const std::string cfg_path = dir + "/config.json";
  const ModelConfig c = ModelConfig::from_json(read_text(cfg_path), cfg_path);
  std::map<std::string, Tensor> hf = read_weights(dir);
  std::map<std::string, Tensor> sd = c.llama() ? llama_to_sinter(std::move(hf), c, dir) : gpt2_to_sinter(std::move(hf), c, dir);
  // The weights must fit the config before the model is allocated (a config naming a far larger
  // model would otherwise allocate all of it first).
  auto emb = sd.find("tok_emb.weight");
  if (emb == sd.end() || emb->second.shape() != Shape({c.vocab_size, c.hidden_size})) {
    std::ostringstream os;
    if (emb == sd.end()) os << "it has no token embedding";
    else os << "its token embedding is " << emb->second.shape();
    SINTER_THROW(IOError, "[", cfg_path, "] the config (vocab_size ", c.vocab_size, ", hidden_size ", c.hidden_size,
                 ") does not fit the weights in ", dir, ": ", os.str());
  }
  auto model = [&] {
    SkipInitGuard skip;  // every weight comes from the checkpoint next
    return std::make_unique<GPT>(c);
  }();
  try {
    model->load_state_dict(sd);
  } catch (const Error& e) {
    SINTER_THROW(IOError, "[", dir, "] ", e.what());
  }
  model->eval();  // as transformers' from_pretrained: dropout off until train()
  return model;
}

void GPT::save_pretrained(const std::string& dir) {
  SINTER_CHECK(cfg_.sparsity.empty(), "[save_pretrained] a 2:4 sparse model has no Hugging Face layout; densify it first");
  std::error_code ec;
  fs::create_directories(dir, ec);
  SINTER_CHECK_T(IOError, !ec, "[", dir, "] cannot create it: ", ec.message());
  std::map<std::string, Tensor> hf;
  std::map<std::string, Tensor> sd;
  for (auto& [name, p] : named_parameters()) sd[name] = p->detach().contiguous();
  const bool llama = cfg_.llama();
  for (int64_t i = 0; i < cfg_.num_hidden_layers; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    if (llama) {
      const std::string h = "model.layers." + std::to_string(i) + ".";
      hf[h + "input_layernorm.weight"] = sd.at(b + "norm1.weight");
      hf[h + "post_attention_layernorm.weight"] = sd.at(b + "norm2.weight");
      for (const char* p : {"q_proj", "k_proj", "v_proj", "o_proj"}) hf[h + "self_attn." + p + ".weight"] = sd.at(b + "attn." + p + ".weight");
      for (const char* p : {"gate", "up", "down"}) hf[h + "mlp." + p + "_proj.weight"] = sd.at(b + "mlp." + p + ".weight");
    } else {
      const std::string h = "transformer.h." + std::to_string(i) + ".";
      for (const char* x : {"weight", "bias"}) {
        hf[h + "ln_1." + x] = sd.at(b + "norm1." + x);
        hf[h + "ln_2." + x] = sd.at(b + "norm2." + x);
      }
      hf[h + "attn.c_attn.weight"] = cat({sd.at(b + "attn.q_proj.weight"), sd.at(b + "attn.k_proj.weight"), sd.at(b + "attn.v_proj.weight")}, 0).t().contiguous();
      hf[h + "attn.c_attn.bias"] = cat({sd.at(b + "attn.q_proj.bias"), sd.at(b + "attn.k_proj.bias"), sd.at(b + "attn.v_proj.bias")}, 0);
      hf[h + "attn.c_proj.weight"] = sd.at(b + "attn.o_proj.weight").t().contiguous();
      hf[h + "attn.c_proj.bias"] = sd.at(b + "attn.o_proj.bias");
      hf[h + "mlp.c_fc.weight"] = sd.at(b + "mlp.fc.weight").t().contiguous();
      hf[h + "mlp.c_fc.bias"] = sd.at(b + "mlp.fc.bias");
      hf[h + "mlp.c_proj.weight"] = sd.at(b + "mlp.proj.weight").t().contiguous();
      hf[h + "mlp.c_proj.bias"] = sd.at(b + "mlp.proj.bias");
    }
  }
  if (llama) {
    hf["model.embed_tokens.weight"] = sd.at("tok_emb.weight");
    hf["model.norm.weight"] = sd.at("norm_f.weight");
  } else {
    hf["transformer.wte.weight"] = sd.at("tok_emb.weight");
    hf["transformer.wpe.weight"] = sd.at("pos_emb.weight");
    hf["transformer.ln_f.weight"] = sd.at("norm_f.weight");
    hf["transformer.ln_f.bias"] = sd.at("norm_f.bias");
  }
  if (!cfg_.tie_word_embeddings) hf["lm_head.weight"] = sd.at("lm_head.weight");
  json j = json::parse(cfg_.to_json());
  j["architectures"] = json::array({cfg_.model_type == "mistral" ? "MistralForCausalLM" : llama ? "LlamaForCausalLM" : "GPT2LMHeadModel"});
  j["torch_dtype"] = "float32";
  io::save_safetensors(dir + "/model.safetensors", hf, {{"format", "pt"}});
  io::atomic_write(dir + "/config.json", j.dump(2) + "\n");
}

}  // namespace sinter::nn

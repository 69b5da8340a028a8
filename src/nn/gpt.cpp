// GPT-2-style (learned positions, LayerNorm, GELU MLP, tied embeddings) and LLaMA-style (RoPE,
// RMSNorm, SwiGLU, grouped-query attention) language models from one config.
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "sinter/autograd.h"
#include "sinter/nn.h"
#include "sinter/random.h"

namespace sinter::nn {

namespace {
using json = nlohmann::json;

// Hugging Face config keys (docs/huggingface.md has the table). Honored: read into the config.
// Checked: accepted only with the value that means what Sinter computes, else refused naming the
// key and the value. Ignored: change nothing Sinter computes (metadata, generation defaults,
// dropout Sinter does not apply, a tensor-parallel split that computes the same numbers).
const std::set<std::string> kGptHonored{"model_type", "vocab_size", "n_positions", "n_embd", "n_inner", "n_layer", "n_head",
                                        "layer_norm_epsilon", "tie_word_embeddings", "resid_pdrop", "activation_function",
                                        "sparsity", "sparse_values"};
const std::set<std::string> kLlamaHonored{"model_type", "vocab_size", "max_position_embeddings", "hidden_size",
                                          "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                          "num_key_value_heads", "rms_norm_eps", "rope_theta", "rope_parameters",
                                          "tie_word_embeddings", "sliding_window", "attention_dropout", "hidden_act",
                                          "sparsity", "sparse_values"};
const std::set<std::string> kGptChecked{"architectures", "scale_attn_weights", "scale_attn_by_inverse_layer_idx",
                                        "add_cross_attention", "n_ctx"};
const std::set<std::string> kLlamaChecked{"architectures", "attention_bias", "mlp_bias", "head_dim", "rope_scaling"};
const std::set<std::string> kIgnored{"transformers_version", "torch_dtype", "dtype", "use_cache", "bos_token_id",
                                     "eos_token_id", "pad_token_id", "initializer_range", "_name_or_path",
                                     "summary_activation", "summary_first_dropout", "summary_proj_to_labels",
                                     "summary_type", "summary_use_proj", "reorder_and_upcast_attn", "attn_pdrop",
                                     "embd_pdrop", "pretraining_tp", "output_attentions", "output_hidden_states",
                                     "return_dict", "task_specific_params", "tokenizer_class"};

// Hugging Face activation names -> the op Sinter runs.
std::string activation_from_hf(const std::string& name) {
  if (name == "gelu_new" || name == "gelu_pytorch_tanh") return "gelu_tanh";
  if (name == "gelu") return "gelu";
  if (name == "relu") return "relu";
  if (name == "silu" || name == "swish") return "silu";
  return "";
}
}  // namespace

ModelConfig ModelConfig::from_json(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    SINTER_THROW(IOError, "[", source, "] config is not valid JSON: ", e.what());
  }
  SINTER_CHECK_T(IOError, j.is_object(), "[", source, "] config must be a JSON object");
  ModelConfig c;
  auto get_str = [&](const char* key, const std::string& def) {
    if (!j.contains(key)) return def;
    SINTER_CHECK_T(IOError, j[key].is_string(), "[", source, "] config key ", key, " must be a string, got ", j[key].dump());
    return j[key].get<std::string>();
  };
  auto get_bool = [&](const char* key, bool def) {
    if (!j.contains(key)) return def;
    SINTER_CHECK_T(IOError, j[key].is_boolean(), "[", source, "] config key ", key, " must be true or false, got ", j[key].dump());
    return j[key].get<bool>();
  };
  c.model_type = get_str("model_type", "gpt2");
  SINTER_CHECK_T(IOError, c.model_type == "gpt2" || c.llama(), "[", source, "] unknown model_type '", c.model_type,
                 "' (gpt2, llama or mistral)");
  const auto& honored = c.llama() ? kLlamaHonored : kGptHonored;
  const auto& checked = c.llama() ? kLlamaChecked : kGptChecked;
  std::string unknown;
  for (auto& [k, v] : j.items())
    if (!honored.count(k) && !checked.count(k) && !kIgnored.count(k)) unknown += (unknown.empty() ? "" : ", ") + k;
  SINTER_CHECK_T(IOError, unknown.empty(), "[", source, "] unknown config keys for ", c.model_type, ": ", unknown);
  // A key whose value asks for math Sinter does not do is refused, naming both.
  auto require = [&](const char* key, bool ok, const char* what) {
    SINTER_CHECK_T(IOError, !j.contains(key) || ok, "[", source, "] config key ", key, " is ", j[key].dump(), ": Sinter supports only ", what);
  };
  auto get_int = [&](const char* key, int64_t def) {
    if (!j.contains(key)) return def;
    SINTER_CHECK_T(IOError, j[key].is_number_integer(), "[", source, "] config key ", key, " must be an integer, got ", j[key].dump());
    // Sizes past 2^31 describe no model that fits a machine, and would overflow what is computed from them.
    const bool fits = j[key].is_number_unsigned() ? j[key].get<uint64_t>() <= uint64_t(INT32_MAX)
                                                  : j[key].get<int64_t>() >= -int64_t(INT32_MAX) && j[key].get<int64_t>() <= int64_t(INT32_MAX);
    SINTER_CHECK_T(IOError, fits, "[", source, "] config key ", key, " is ", j[key].dump(), ", beyond any model size (at most 2^31 - 1)");
    return j[key].get<int64_t>();
  };
  auto get_num = [&](const char* key, double def) {
    if (!j.contains(key)) return def;
    SINTER_CHECK_T(IOError, j[key].is_number(), "[", source, "] config key ", key, " must be a number, got ", j[key].dump());
    return j[key].get<double>();
  };
  auto act = [&](const char* key) {
    if (!j.contains(key)) return std::string();
    SINTER_CHECK_T(IOError, j[key].is_string() && !activation_from_hf(j[key].get<std::string>()).empty(), "[", source, "] config key ",
                   key, " is ", j[key].dump(), ": Sinter has gelu_new, gelu_pytorch_tanh, gelu, relu, silu and swish");
    return activation_from_hf(j[key].get<std::string>());
  };
  if (j.contains("architectures")) {
    const char* want = c.model_type == "mistral" ? "MistralForCausalLM" : c.llama() ? "LlamaForCausalLM" : "GPT2LMHeadModel";
    require("architectures", j["architectures"] == json::array({want}), want);
  }
  c.vocab_size = get_int("vocab_size", c.vocab_size);
  if (c.llama()) {
    c.max_position_embeddings = get_int("max_position_embeddings", c.max_position_embeddings);
    c.hidden_size = get_int("hidden_size", c.hidden_size);
    c.intermediate_size = get_int("intermediate_size", c.intermediate_size);
    c.num_hidden_layers = get_int("num_hidden_layers", c.num_hidden_layers);
    c.num_attention_heads = get_int("num_attention_heads", c.num_attention_heads);
    c.num_key_value_heads = get_int("num_key_value_heads", c.num_attention_heads);
    c.norm_eps = get_num("rms_norm_eps", 1e-6);
    c.rope_theta = get_num("rope_theta", c.rope_theta);
    if (j.contains("rope_parameters")) {  // transformers 5: {"rope_type": "default", "rope_theta": ...}
      const json& r = j["rope_parameters"];
      bool plain = r.is_object();
      if (plain)
        for (auto& [k, v] : r.items()) plain = plain && ((k == "rope_type" && v == "default") || (k == "rope_theta" && v.is_number()));
      require("rope_parameters", plain, "{\"rope_type\": \"default\", \"rope_theta\": ...} (no RoPE scaling)");
      if (r.contains("rope_theta")) c.rope_theta = r["rope_theta"].get<double>();
    }
    require("rope_scaling", j.contains("rope_scaling") && j["rope_scaling"].is_null(), "null (no RoPE scaling)");
    require("attention_bias", j.contains("attention_bias") && j["attention_bias"] == false, "false");
    require("mlp_bias", j.contains("mlp_bias") && j["mlp_bias"] == false, "false");
    c.activation = act("hidden_act");
    c.sliding_window = j.contains("sliding_window") && !j["sliding_window"].is_null() ? get_int("sliding_window", 0) : 0;
    c.dropout = get_num("attention_dropout", 0.0);
    c.tie_word_embeddings = get_bool("tie_word_embeddings", false);
    require("head_dim", j.contains("head_dim") && j["head_dim"].is_number_integer() && j["head_dim"].get<int64_t>() * c.num_attention_heads == c.hidden_size,
            "hidden_size / num_attention_heads");
  } else {
    c.max_position_embeddings = get_int("n_positions", c.max_position_embeddings);
    c.hidden_size = get_int("n_embd", c.hidden_size);
    c.num_hidden_layers = get_int("n_layer", c.num_hidden_layers);
    c.num_attention_heads = get_int("n_head", c.num_attention_heads);
    c.num_key_value_heads = c.num_attention_heads;
    c.intermediate_size = j.contains("n_inner") && !j["n_inner"].is_null() ? get_int("n_inner", 0) : 4 * c.hidden_size;
    c.norm_eps = get_num("layer_norm_epsilon", 1e-5);
    c.dropout = get_num("resid_pdrop", 0.0);
    c.tie_word_embeddings = get_bool("tie_word_embeddings", true);
    c.activation = act("activation_function");
    require("scale_attn_weights", j.contains("scale_attn_weights") && j["scale_attn_weights"] == true, "true");
    require("scale_attn_by_inverse_layer_idx", j.contains("scale_attn_by_inverse_layer_idx") && j["scale_attn_by_inverse_layer_idx"] == false, "false");
    require("add_cross_attention", j.contains("add_cross_attention") && j["add_cross_attention"] == false, "false");
    require("n_ctx", j.contains("n_ctx") && j["n_ctx"] == c.max_position_embeddings, "n_ctx = n_positions");
  }
  if (c.activation == (c.llama() ? "silu" : "gelu_tanh")) c.activation.clear();  // the type's own
  if (j.contains("sparsity")) {  // Sinter's own keys: a 2:4 checkpoint (sinter sparsify)
    SINTER_CHECK_T(IOError, j["sparsity"].is_string() && j["sparsity"] == "2:4", "[", source, "] sparsity must be \"2:4\"");
    c.sparsity = "2:4";
    c.sparse_values = get_str("sparse_values", "f32");
    SINTER_CHECK_T(IOError, c.sparse_values == "f32" || c.sparse_values == "bf16" || c.sparse_values == "i8", "[", source,
                   "] sparse_values must be f32, bf16 or i8, got '", c.sparse_values, "'");
  }
  c.validate(source);
  return c;
}

void ModelConfig::validate(const std::string& source) const {
  auto pos = [&](int64_t v, const char* what) {
    SINTER_CHECK(v > 0, "[", source, "] ", what, " must be positive, got ", v);
  };
  pos(vocab_size, "vocab_size");
  pos(max_position_embeddings, "max_position_embeddings");
  pos(hidden_size, "hidden_size");
  pos(intermediate_size, "intermediate_size");
  pos(num_hidden_layers, "num_hidden_layers");
  pos(num_attention_heads, "num_attention_heads");
  pos(num_key_value_heads, "num_key_value_heads");
  SINTER_CHECK(sliding_window >= 0, "[", source, "] sliding_window must be >= 0, got ", sliding_window);
  SINTER_CHECK(hidden_size % num_attention_heads == 0, "[", source, "] hidden size ", hidden_size,
               " is not a multiple of the ", num_attention_heads, " heads");
  SINTER_CHECK(num_attention_heads % num_key_value_heads == 0, "[", source, "] ", num_attention_heads,
               " attention heads are not a multiple of the ", num_key_value_heads, " key/value heads");
  SINTER_CHECK(!llama() || head_dim() % 2 == 0, "[", source, "] RoPE needs an even head dim, got ", head_dim());
  SINTER_CHECK(dropout >= 0 && dropout < 1, "[", source, "] dropout must be in [0, 1), got ", dropout);
  SINTER_CHECK(norm_eps > 0, "[", source, "] norm epsilon must be positive");
}

std::string ModelConfig::to_json() const {
  json j;
  j["model_type"] = model_type;
  j["vocab_size"] = vocab_size;
  j["tie_word_embeddings"] = tie_word_embeddings;
  if (llama()) {
    j["max_position_embeddings"] = max_position_embeddings;
    j["hidden_size"] = hidden_size;
    j["intermediate_size"] = intermediate_size;
    j["num_hidden_layers"] = num_hidden_layers;
    j["num_attention_heads"] = num_attention_heads;
    j["num_key_value_heads"] = num_key_value_heads;
    j["rms_norm_eps"] = norm_eps;
    j["rope_theta"] = rope_theta;
    if (sliding_window > 0) j["sliding_window"] = sliding_window;
    j["attention_dropout"] = dropout;
    j["hidden_act"] = act() == "gelu_tanh" ? "gelu_pytorch_tanh" : act();
  } else {
    j["n_positions"] = max_position_embeddings;
    j["n_embd"] = hidden_size;
    j["n_inner"] = intermediate_size;
    j["n_layer"] = num_hidden_layers;
    j["n_head"] = num_attention_heads;
    j["layer_norm_epsilon"] = norm_eps;
    j["resid_pdrop"] = dropout;
    j["activation_function"] = act() == "gelu_tanh" ? "gelu_new" : act();
  }
  if (!sparsity.empty()) j["sparsity"] = sparsity, j["sparse_values"] = sparse_values;
  return j.dump(2) + "\n";
}

ModelConfig ModelConfig::preset(const std::string& name) {
  ModelConfig c;
  if (name == "tiny") {  // the default: ~0.8M parameters, trains on 2 cores in minutes
    c.hidden_size = 128, c.num_hidden_layers = 4, c.num_attention_heads = 4, c.num_key_value_heads = 4;
    c.intermediate_size = 512, c.max_position_embeddings = 128;  // = the default training seq_len
  } else if (name == "small") {
    c.hidden_size = 256, c.num_hidden_layers = 6, c.num_attention_heads = 8, c.num_key_value_heads = 8;
    c.intermediate_size = 1024, c.max_position_embeddings = 512;
  } else if (name == "llama-tiny") {
    c.model_type = "llama";
    c.hidden_size = 128, c.num_hidden_layers = 4, c.num_attention_heads = 4, c.num_key_value_heads = 2;
    c.intermediate_size = 352, c.max_position_embeddings = 128, c.norm_eps = 1e-6, c.tie_word_embeddings = false;
  } else if (name == "gpt2-124m") {  // GPT-2 small's shape (the GPU benchmark's model)
    c.vocab_size = 50257, c.max_position_embeddings = 1024;
    c.hidden_size = 768, c.num_hidden_layers = 12, c.num_attention_heads = 12, c.num_key_value_heads = 12;
    c.intermediate_size = 3072;
  } else {
    SINTER_THROW(ValueError, "[config] unknown preset '", name, "' (tiny, small, llama-tiny, gpt2-124m)");
  }
  return c;
}

CausalSelfAttention::CausalSelfAttention(const ModelConfig& c)
    : n_head(c.num_attention_heads), n_kv_head(c.num_key_value_heads), head_dim(c.head_dim()), window(c.sliding_window),
      rope(c.llama()) {
  const bool bias = !c.llama();
  const int64_t C = c.hidden_size;
  q_proj = register_module("q_proj", std::make_shared<Linear>(C, n_head * head_dim, bias));
  k_proj = register_module("k_proj", std::make_shared<Linear>(C, n_kv_head * head_dim, bias));
  v_proj = register_module("v_proj", std::make_shared<Linear>(C, n_kv_head * head_dim, bias));
  o_proj = register_module("o_proj", std::make_shared<Linear>(n_head * head_dim, C, bias));
}

Tensor CausalSelfAttention::forward(const Tensor& x, const Tensor& rope_cos, const Tensor& rope_sin, KVCache* cache) {
  // -1 heads: under tensor parallelism each rank holds n_head / tp of them. T from the projections:
  // under sequence parallelism x holds a slice of the sequence and they see all of it.
  Tensor qp = q_proj->forward(x);
  const int64_t B = qp.size(0), T = qp.size(1);
  auto heads = [&](const Tensor& t) { return t.reshape({B, T, -1, head_dim}).transpose(1, 2); };
  Tensor q = heads(qp), k = heads(k_proj->forward(x)), v = heads(v_proj->forward(x));
  if (rope) {
    Tensor c = cache ? dynamic_slice(rope_cos, cache->pos, 0, T) : rope_cos.narrow(0, 0, T);
    Tensor s = cache ? dynamic_slice(rope_sin, cache->pos, 0, T) : rope_sin.narrow(0, 0, T);
    q = rotary_embedding(q, c, s);
    k = rotary_embedding(k, c, s);
  }
  Tensor kv_len;
  if (cache) {  // the new keys and values go in at the cache's position; attention reads its first pos + T
    NoGradGuard g;
    const Tensor end = kv_append_(cache->k, cache->v, k, v, cache->pos, 2);  // one op: both caches, and pos + T
    kv_len = cache->end.defined() ? cache->end : end;
    k = cache->k, v = cache->v;
  }
  // Causal aligns bottom-right, so a one-token decode step sees the whole cache (or its window).
  Tensor y = scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/T > 1 || window > 0, {}, n_kv_head != n_head,
                                          SDPABackend::automatic, window, kv_len);
  return o_proj->forward(y.transpose(1, 2).reshape({B, T, -1}));
}

TransformerBlock::TransformerBlock(const ModelConfig& c) : llama(c.llama()), p_drop(c.dropout) {
  if (llama) {
    norm1 = register_module("norm1", std::make_shared<RMSNorm>(c.hidden_size, c.norm_eps));
    norm2 = register_module("norm2", std::make_shared<RMSNorm>(c.hidden_size, c.norm_eps));
    attn = register_module("attn", std::make_shared<CausalSelfAttention>(c));
    mlp = register_module("mlp", std::make_shared<SwiGLU>(c.hidden_size, c.intermediate_size, c.act()));
  } else {
    norm1 = register_module("norm1", std::make_shared<LayerNorm>(c.hidden_size, c.norm_eps));
    norm2 = register_module("norm2", std::make_shared<LayerNorm>(c.hidden_size, c.norm_eps));
    attn = register_module("attn", std::make_shared<CausalSelfAttention>(c));
    mlp = register_module("mlp", std::make_shared<GeluMLP>(c.hidden_size, c.intermediate_size, c.act()));
  }
}

Tensor TransformerBlock::norm(const std::shared_ptr<Module>& n, const Tensor& x) const {
  return llama ? static_cast<RMSNorm&>(*n).forward(x) : static_cast<LayerNorm&>(*n).forward(x);
}

namespace {
// Runs a module's forward hook around its forward (after() also when the forward throws).
class HookScope {
 public:
  explicit HookScope(Module& m) : m_(m) {
    if (m_.forward_hook) m_.forward_hook->before(m_);
  }
  ~HookScope() {
    if (m_.forward_hook) m_.forward_hook->after(m_);
  }
  HookScope(const HookScope&) = delete;
  HookScope& operator=(const HookScope&) = delete;

 private:
  Module& m_;
};

// The RoPE tables (cos, sin) of c's positions, made in f32 and cast to dtype, on device.
std::pair<Tensor, Tensor> rope_tables(const ModelConfig& c, DType dtype, Device device) {
  NoGradGuard g;
  auto table = [&](bool want_sin) {
    return rope_cos_sin(c.max_position_embeddings, c.head_dim(), c.rope_theta, want_sin).to(dtype).to(device);
  };
  return {table(false), table(true)};
}
}  // namespace

Tensor TransformerBlock::forward(const Tensor& x_in, const Tensor& rope_cos, const Tensor& rope_sin, KVCache* cache) {
  HookScope hooks(*this);
  const Tensor x = prepare_input ? prepare_input(x_in) : x_in;
  // Residual dropout (GPT-2's resid_pdrop, LLaMA's attention_dropout), only while training.
  Tensor h = x + dropout(attn->forward(norm(norm1, x), rope_cos, rope_sin, cache), p_drop, is_training());
  Tensor m = norm(norm2, h);
  m = llama ? static_cast<SwiGLU&>(*mlp).forward(m) : static_cast<GeluMLP&>(*mlp).forward(m);
  return h + dropout(m, p_drop, is_training());
}

GPT::GPT(const ModelConfig& c) : cfg_(c) {
  c.validate("config");
  tok_emb = register_module("tok_emb", std::make_shared<Embedding>(c.vocab_size, c.hidden_size));
  if (!c.llama()) pos_emb = register_module("pos_emb", std::make_shared<Embedding>(c.max_position_embeddings, c.hidden_size));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    blocks.push_back(register_module("blocks." + std::to_string(i), std::make_shared<TransformerBlock>(c)));
  if (c.llama()) norm_f = register_module("norm_f", std::make_shared<RMSNorm>(c.hidden_size, c.norm_eps));
  else norm_f = register_module("norm_f", std::make_shared<LayerNorm>(c.hidden_size, c.norm_eps));
  if (!c.tie_word_embeddings) lm_head = register_module("lm_head", std::make_shared<Linear>(c.hidden_size, c.vocab_size, false));
  if (c.llama()) {
    std::tie(rope_cos_, rope_sin_) = rope_tables(c, DType::f32, Device::cpu());
  }
  if (c.sparsity == "2:4") {  // the packed layout a sparse checkpoint loads into
    cfg_.sparsity.clear();
    sparsify(dtype_from_name(c.sparse_values));
  }
}

std::vector<std::shared_ptr<Linear>> GPT::block_linears() const {
  std::vector<std::shared_ptr<Linear>> out;
  for (const auto& b : blocks) {
    for (const auto& l : {b->attn->q_proj, b->attn->k_proj, b->attn->v_proj, b->attn->o_proj}) out.push_back(l);
    if (auto g = std::dynamic_pointer_cast<GeluMLP>(b->mlp)) out.push_back(g->fc), out.push_back(g->proj);
    if (auto s = std::dynamic_pointer_cast<SwiGLU>(b->mlp)) out.push_back(s->gate), out.push_back(s->up), out.push_back(s->down);
  }
  return out;
}

void GPT::sparsify(DType values_dtype) {
  SINTER_CHECK(cfg_.sparsity.empty(), "[sparsify] the model is already 2:4 sparse");
  for (auto& l : block_linears()) l->sparsify(values_dtype);
  cfg_.sparsity = "2:4";
  cfg_.sparse_values = dtype_name(values_dtype);
}

int64_t GPT::prepack_for_decode(bool replace) {
  int64_t added = 0;
  for (auto& l : block_linears())
    if (l->sparse.defined() && !l->sparse.packed_only() && prepack_helps(l->sparse, tok_emb->weight.dtype(), 1)) {
      const int64_t before = l->sparse.nbytes();
      l->sparse.prepack(replace);
      added += replace ? l->sparse.nbytes() - before : l->sparse.packed.numel();
    }
  return added;
}

void GPT::init_weights(uint64_t seed) {
  manual_seed(seed);
  NoGradGuard g;
  const double resid_scale = 0.02 / std::sqrt(2.0 * double(cfg_.num_hidden_layers));
  for (auto& [name, t] : named_parameters()) {
    const bool is_norm = name.find("norm") != std::string::npos;
    const bool is_bias = name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0;
    if (is_norm) t->fill_(is_bias ? 0.0 : 1.0);
    else if (is_bias) t->zero_();
    else {
      const bool resid = name.find("o_proj") != std::string::npos || name.find("mlp.proj") != std::string::npos ||
                         name.find("mlp.down") != std::string::npos;
      t->copy_(randn(t->shape()) * (resid ? resid_scale : 0.02));
    }
  }
}

std::vector<KVCache> GPT::make_caches(int64_t batch, int64_t max_len) const {
  SINTER_CHECK(max_len <= cfg_.max_position_embeddings, "[generate] ", max_len, " positions exceed the model's ",
               cfg_.max_position_embeddings);
  std::vector<KVCache> caches(size_t(cfg_.num_hidden_layers));
  const Tensor pos = zeros({}, DType::i64, device());
  for (auto& c : caches) {
    c.k = zeros({batch, cfg_.num_key_value_heads, max_len, cfg_.head_dim()}, tok_emb->weight.dtype(), device());
    c.v = zeros({batch, cfg_.num_key_value_heads, max_len, cfg_.head_dim()}, tok_emb->weight.dtype(), device());
    c.pos = pos;
  }
  return caches;
}

void GPT::to(Device device) {
  Module::to(device);
  NoGradGuard g;
  if (rope_cos_.defined()) rope_cos_ = rope_cos_.to(device), rope_sin_ = rope_sin_.to(device);
}

void GPT::to(DType dtype) {
  Module::to(dtype);
  if (rope_cos_.defined() && rope_cos_.dtype() != dtype) std::tie(rope_cos_, rope_sin_) = rope_tables(cfg_, dtype, rope_cos_.device());
}

Device GPT::device() const { return tok_emb->weight.device(); }

Tensor GPT::forward(const Tensor& idx, std::vector<KVCache>* caches) {
  SINTER_CHECK_SHAPE(idx.dim() == 2, "[gpt] token ids must be (B, T), got ", idx.shape());
  const int64_t T = idx.size(1);
  SINTER_CHECK(T <= cfg_.max_position_embeddings, "[gpt] sequence of ", T, " tokens exceeds the model's ",
               cfg_.max_position_embeddings, " positions");
  SINTER_CHECK(!caches || int64_t(caches->size()) == cfg_.num_hidden_layers, "[gpt] need one KV cache per layer");
  HookScope hooks(*this);
  Tensor x = tok_emb->forward(idx);
  // With caches the positions start at the caches' (a tensor: see KVCache); past the model's
  // positions the ops that read them raise an IndexError.
  if (pos_emb) x = x + (caches ? dynamic_slice(pos_emb->weight, (*caches)[0].pos, 0, T) : pos_emb->weight.narrow(0, 0, T));
  if (caches) {  // one kv length for every layer's attention
    const Tensor end = (*caches)[0].pos + double(T);
    for (KVCache& c : *caches) c.end = end;
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (checkpoint_activations && !caches && is_training()) {
      const std::shared_ptr<TransformerBlock> b = blocks[i];
      const Tensor cos = rope_cos_, sin = rope_sin_;
      x = autograd::checkpoint([b, cos, sin](const std::vector<Tensor>& in) { return std::vector<Tensor>{b->forward(in[0], cos, sin, nullptr)}; },
                               {x}, b->parameters())[0];
    } else {
      x = blocks[i]->forward(x, rope_cos_, rope_sin_, caches ? &(*caches)[i] : nullptr);
    }
  }
  if (caches) {
    NoGradGuard g;
    (*caches)[0].pos.add_(double(T));
    for (KVCache& c : *caches) c.end = Tensor();
  }
  x = cfg_.llama() ? static_cast<RMSNorm&>(*norm_f).forward(x) : static_cast<LayerNorm&>(*norm_f).forward(x);
  return head(x);
}

Tensor GPT::head(const Tensor& x) const {
  if (lm_head) return lm_head->forward(x);
  return tok_emb->parallel_style ? tok_emb->parallel_style->project(*tok_emb, x) : linear(x, tok_emb->weight);
}

}  // namespace sinter::nn

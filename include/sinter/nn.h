#pragma once
// nn: modules with named parameters, buffers and children; the layers of a transformer; GPT-2-
// and LLaMA-style language models built from a Hugging Face-style JSON config.
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sinter/attention.h"
#include "sinter/op.h"
#include "sinter/ops.h"
#include "sinter/sparse.h"

namespace sinter {

namespace nn {

class Module;

// Set by the distributed layer (dist::parallelize_module, dist::fully_shard). A layer with a
// parallel style runs the style's forward over its local shards instead of its own; `project` is
// the tied output head (x times the embedding's transpose) of a vocabulary-parallel embedding.
struct ParallelStyle {
  virtual ~ParallelStyle() = default;
  virtual Tensor forward(const Module& m, const Tensor& x) const = 0;
  virtual Tensor project(const Module& m, const Tensor& x) const;
};
// Brackets a module's forward: FSDP gathers the module's parameter shards before and frees the
// gathered copies after.
struct ForwardHook {
  virtual ~ForwardHook() = default;
  virtual void before(Module& m) = 0;
  virtual void after(Module& m) = 0;
};

class Module {
 public:
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  virtual ~Module() = default;

  std::vector<std::pair<std::string, Tensor*>> named_parameters();
  std::vector<Tensor> parameters();
  std::vector<std::pair<std::string, Tensor*>> named_buffers();
  int64_t num_parameters();
  // Parameters and buffers by dotted name ("blocks.0.attn.q_proj.weight").
  std::map<std::string, Tensor> state_dict();
  // Strict by default: every missing, unexpected or shape/dtype-mismatched key is named.
  void load_state_dict(const std::map<std::string, Tensor>& sd, bool strict = true);
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  virtual void to(DType dtype);    // floating parameters and buffers
  virtual void to(Device device);  // every parameter and buffer (gradients are dropped)
  void zero_grad();
  // This module and every descendant by dotted name ("" for this one, "blocks.0.attn", ...).
  std::vector<std::pair<std::string, Module*>> named_modules();

  std::shared_ptr<const ParallelStyle> parallel_style;
  std::shared_ptr<ForwardHook> forward_hook;
  // PrepareModuleInput: applied to a transformer block's input before its forward (sequence
  // parallelism splits the residual stream along the sequence where it enters the first block).
  std::function<Tensor(const Tensor&)> prepare_input;

 protected:
  Tensor& register_parameter(const std::string& name, Tensor& slot, Tensor value);
  Tensor& register_buffer(const std::string& name, Tensor& slot, Tensor value);
  void unregister(const std::string& name);  // drops a parameter or buffer (its slot is untouched)
  template <class M> std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    children_.emplace_back(name, m);
    return m;
  }

 private:
  void collect(const std::string& prefix, bool params, std::vector<std::pair<std::string, Tensor*>>& out);
  std::vector<std::pair<std::string, Tensor*>> params_, buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

// Linear and Embedding layers constructed in this scope (on this thread) start as zeros instead
// of drawing their weights at random: for a model whose every weight comes next from a checkpoint
// (load_model, GPT::from_pretrained), where the draw would take longer than reading the file.
class SkipInitGuard {
 public:
  SkipInitGuard();
  ~SkipInitGuard();
  SkipInitGuard(const SkipInitGuard&) = delete;
  SkipInitGuard& operator=(const SkipInitGuard&) = delete;
  static bool active();

 private:
  bool prev_;
};

class Linear : public Module {
 public:
  Linear(int64_t in, int64_t out, bool bias = true);
  Tensor forward(const Tensor& x) const {
    if (parallel_style) return parallel_style->forward(*this, x);
    return sparse.defined() ? linear(x, sparse, bias) : linear(x, weight, bias);
  }
  // Prunes the weight to 2:4 (magnitude, per group of four inputs) and keeps it packed: the state
  // dict then holds weight_values (a parameter when float: fine-tuning keeps the pattern),
  // weight_meta and weight_scales (buffers) instead of weight.
  void sparsify(DType values_dtype = DType::f32);
  Tensor weight, bias;
  SemiStructuredSparse sparse;  // defined after sparsify()
};

class Embedding : public Module {
 public:
  Embedding(int64_t num, int64_t dim);
  Tensor forward(const Tensor& idx) const { return parallel_style ? parallel_style->forward(*this, idx) : embedding(weight, idx); }
  Tensor weight;
};

class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5);
  Tensor forward(const Tensor& x) const { return parallel_style ? parallel_style->forward(*this, x) : layer_norm(x, weight, bias, eps); }
  Tensor weight, bias;
  double eps;
};

class RMSNorm : public Module {
 public:
  explicit RMSNorm(int64_t dim, double eps = 1e-6);
  Tensor forward(const Tensor& x) const { return parallel_style ? parallel_style->forward(*this, x) : rms_norm(x, weight, eps); }
  Tensor weight;
  double eps;
};

class Dropout : public Module {
 public:
  explicit Dropout(double p) : p(p) {}
  Tensor forward(const Tensor& x) const { return dropout(x, p, is_training()); }
  double p;
};

// fc -> GELU(tanh) -> proj (GPT-2)
// An activation by name: "gelu_tanh", "gelu" (erf), "relu" or "silu".
Tensor activation(const Tensor& x, const std::string& name);

class GeluMLP : public Module {
 public:
  GeluMLP(int64_t dim, int64_t hidden, std::string act = "gelu_tanh");
  Tensor forward(const Tensor& x) const { return proj->forward(activation(fc->forward(x), act)); }
  std::shared_ptr<Linear> fc, proj;
  std::string act;
};

// down(silu(gate x) * up x) (LLaMA)
class SwiGLU : public Module {
 public:
  SwiGLU(int64_t dim, int64_t hidden, std::string act = "silu");
  Tensor forward(const Tensor& x) const {
    const Tensor g = gate->forward(x), u = up->forward(x);
    return down->forward(combine ? call1(*combine, {g, u}) : activation(g, act) * u);
  }
  std::shared_ptr<Linear> gate, up, down;
  std::string act;
  // An op (gate, up) -> act(gate) * up to run instead of the two ops: a user kernel
  // (examples/kernels/swiglu.kernel.cpp).
  const OpDef* combine = nullptr;
};

// Per-layer key/value cache for generation: (B, Hkv, max_len, D), the first `pos` positions
// valid. `pos` (an i64 0-d tensor, one shared by every layer's cache) is read and advanced by ops
// in the forward, so one traced decode step serves every position; zero it to start over.
struct KVCache {
  Tensor k, v;
  Tensor pos;
  Tensor end;  // pos + the tokens of the forward under way (set by GPT::forward)
};

struct ModelConfig {
  std::string model_type = "gpt2";  // "gpt2", "llama", or "mistral" (LLaMA's math with a sliding window)
  int64_t vocab_size = 256;
  int64_t max_position_embeddings = 256;
  int64_t hidden_size = 128;
  int64_t intermediate_size = 512;
  int64_t num_hidden_layers = 4;
  int64_t num_attention_heads = 4;
  int64_t num_key_value_heads = 4;
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  int64_t sliding_window = 0;  // LLaMA/Mistral "sliding_window": each token attends to its last N (0: all)
  bool tie_word_embeddings = true;
  // The MLP's activation: "gelu_tanh" (GPT-2's gelu_new), "gelu", "relu" or "silu" (LLaMA's).
  // Empty: the model type's own.
  std::string activation;
  double dropout = 0.0;
  std::string sparsity;             // "" (dense) or "2:4": the blocks' Linear layers are 2:4 sparse
  std::string sparse_values = "f32";  // their values: f32, bf16 or i8

  bool llama() const { return model_type == "llama" || model_type == "mistral"; }
  std::string act() const { return !activation.empty() ? activation : llama() ? "silu" : "gelu_tanh"; }
  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  // Hugging Face key names (GPT-2: n_embd, n_layer, ...; LLaMA: hidden_size, ...), as
  // save_pretrained writes them. Every key is honored, known to change nothing Sinter computes
  // (ignored; the table is in docs/huggingface.md), or refused naming the key and its value when
  // it asks for math Sinter does not do; unknown keys are refused too. `source` names the file.
  static ModelConfig from_json(const std::string& json, const std::string& source);
  static ModelConfig preset(const std::string& name);  // "tiny", "small", "llama-tiny", "gpt2-124m"
  std::string to_json() const;
  void validate(const std::string& source) const;
};

class CausalSelfAttention : public Module {
 public:
  explicit CausalSelfAttention(const ModelConfig& c);
  // x (B, T, C) at positions [pos0, pos0 + T); with a cache, attends to everything cached so far.
  Tensor forward(const Tensor& x, const Tensor& rope_cos, const Tensor& rope_sin, KVCache* cache);
  std::shared_ptr<Linear> q_proj, k_proj, v_proj, o_proj;
  int64_t n_head, n_kv_head, head_dim, window;
  bool rope;
};

class TransformerBlock : public Module {
 public:
  explicit TransformerBlock(const ModelConfig& c);
  Tensor forward(const Tensor& x, const Tensor& rope_cos, const Tensor& rope_sin, KVCache* cache);
  std::shared_ptr<Module> norm1, norm2, mlp;
  std::shared_ptr<CausalSelfAttention> attn;
  bool llama;
  double p_drop;

 private:
  Tensor norm(const std::shared_ptr<Module>& n, const Tensor& x) const;
};

// Whether dir is a Hugging Face checkpoint (config.json naming its architecture, no train_state.json).
bool is_pretrained_dir(const std::string& dir);

class GPT : public Module {
 public:
  explicit GPT(const ModelConfig& c);
  // idx (B, T) int64 -> logits (B, T, vocab). With caches (one per layer), positions continue
  // from the cache length.
  Tensor forward(const Tensor& idx, std::vector<KVCache>* caches = nullptr);
  // On the model's device (its embedding's).
  std::vector<KVCache> make_caches(int64_t batch, int64_t max_len) const;
  const ModelConfig& config() const { return cfg_; }
  void to(Device device) override;  // the parameters, buffers and the RoPE tables
  // The floating parameters and buffers, and the RoPE tables (made in f32 again, then cast: a bf16
  // model's attention rotates in bf16, as Hugging Face's rotary embedding casts its tables).
  void to(DType dtype) override;
  Device device() const;            // where the weights are (the token embedding's device)
  // Initializes weights as GPT-2 does: N(0, 0.02), residual projections scaled by 1/sqrt(2 L).
  void init_weights(uint64_t seed);
  // A Hugging Face save_pretrained directory of GPT2LMHeadModel or LlamaForCausalLM (src/nn/hf.cpp):
  // HF names and layouts, one file or shards, f32 / bf16 / f16 tensors (converted to f32). The model
  // comes back in eval mode, as transformers' from_pretrained returns it.
  static std::unique_ptr<GPT> from_pretrained(const std::string& dir);
  // Writes dir/config.json and dir/model.safetensors (f32) as transformers' save_pretrained does.
  void save_pretrained(const std::string& dir);
  // Prunes every Linear of the transformer blocks to 2:4 (embeddings and the head stay dense).
  void sparsify(DType values_dtype = DType::f32);
  std::vector<std::shared_ptr<Linear>> block_linears() const;
  // For serving: prepacks the 2:4 layers whose one-token steps read the prepacked layout (int8
  // values; layers small enough to be computed densely excepted); returns the bytes it added.
  // replace: the layout replaces their values + meta (SemiStructuredSparse::prepack(true)): one
  // copy, no gradients, and state_dict() refuses them until unpacked (the bytes added then count
  // the layout less what it replaced).
  int64_t prepack_for_decode(bool replace = false);

  std::shared_ptr<Embedding> tok_emb, pos_emb;
  std::vector<std::shared_ptr<TransformerBlock>> blocks;
  std::shared_ptr<Module> norm_f;
  std::shared_ptr<Linear> lm_head;  // null when tied to tok_emb
  // The output projection (lm_head, or the tied embedding's transpose).
  Tensor head(const Tensor& x) const;
  // Set by tensor parallelism when the logits stay sharded over the vocabulary: the loss that
  // training uses instead of cross_entropy (dist::loss_parallel).
  std::function<Tensor(const Tensor& logits, const Tensor& targets)> parallel_loss;
  // Training with gradients: each block runs under autograd::checkpoint, so its activations are
  // recomputed in the backward instead of kept (`sinter train --checkpoint-activations`).
  bool checkpoint_activations = false;

 private:
  ModelConfig cfg_;
  Tensor rope_cos_, rope_sin_;
};

}  // namespace nn
}  // namespace sinter

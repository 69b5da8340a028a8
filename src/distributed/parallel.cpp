// Tensor parallelism (Megatron-style Linear / Embedding splits, vocabulary-parallel loss) on the
// collective ops, so the backward is ordinary autograd; the parameter layouts it and FSDP
// (fsdp.cpp) attach (layout.h), and what reads them: checkpoints' full parameters and the
// gradient norm that counts each piece once.
#include <map>
#include <cmath>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "autograd/node.h"
#include "distributed/backend.h"
#include "distributed/layout.h"
#include "sinter/autograd.h"
#include "sinter/dist.h"
#include "sinter/op.h"
#include "sinter/optim.h"

namespace sinter::dist {

namespace detail {

namespace {
std::mutex g_mu;
std::unordered_map<const TensorImpl*, Layout> g_layouts;
}  // namespace

void set_layout(const Tensor& p, Layout l) {
  std::lock_guard<std::mutex> lock(g_mu);
  std::erase_if(g_layouts, [](const auto& kv) { return kv.second.impl.expired(); });
  l.impl = p.impl_ptr();
  g_layouts[p.impl_ptr().get()] = std::move(l);
}

std::optional<Layout> get_layout(const Tensor& p) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_layouts.find(p.impl_ptr().get());
  if (it == g_layouts.end() || it->second.impl.lock() != p.impl_ptr()) return std::nullopt;
  return it->second;
}

Tensor piece(const Tensor& full, int64_t dim, int64_t parts, int64_t index) {
  NoGradGuard g;
  const auto [start, len] = shard_range(full.size(dim), parts, index);
  Tensor t = full.detach().narrow(dim, start, len).clone();
  t.requires_grad_(full.requires_grad());
  return t;
}

}  // namespace detail

using detail::get_layout, detail::Layout, detail::piece, detail::set_layout;

namespace {

bool matches(const std::string& pattern, const std::string& name) {
  size_t i = 0, j = 0;
  while (i < pattern.size() && j < name.size()) {
    if (pattern[i] == '*') {
      while (j < name.size() && name[j] != '.') ++j;
      ++i;
    } else if (pattern[i++] != name[j++]) {
      return false;
    }
  }
  return i == pattern.size() && j == name.size();
}

// The replicated input of colwise layers enters through copy_to_group, whose backward sums the
// ranks' gradients. Layers fed the same tensor (q, k and v; gate and up) share one copy, so their
// gradients are summed locally first and reduced once, as a fused qkv projection would be.
// Without a gradient to route the copy is the identity and is skipped.
// With sequence parallelism the input is this rank's slice of the sequence (dim 1): the shared
// step is an all_gather, whose backward reduce-scatters the gradient.
Tensor enter_group(const Tensor& x, ProcessGroup& g, bool sequence_parallel) {
  if (!sequence_parallel && (!grad_enabled() || !x.requires_grad())) return x;
  thread_local std::weak_ptr<TensorImpl> last_in;
  thread_local Tensor last_out;
  thread_local int64_t last_group = -1;
  thread_local bool last_sp = false;
  // A hit only within one graph: the same input tensor fed to a later forward, after a backward
  // released the old copy's node, gets a fresh copy.
  const bool alive = last_out.defined() && !(last_out.grad_fn() && last_out.grad_fn()->released);
  if (alive && last_in.lock() == x.impl_ptr() && last_group == g.id() && last_sp == sequence_parallel) return last_out;
  last_in = x.impl_ptr(), last_group = g.id(), last_sp = sequence_parallel;
  if (!sequence_parallel) return last_out = copy_to_group(x, g);
  return last_out = all_gather(x, g, 1, std::vector<int64_t>(size_t(g.size()), x.size(1)), /*grad_partial=*/true);
}

// A parameter replicated over the group but used on rank-specific tokens: its gradient is summed.
Tensor replicated_param(const Tensor& p, ProcessGroup& g) {
  return p.defined() && grad_enabled() && p.requires_grad() ? copy_to_group(p, g) : p;
}

class Colwise final : public nn::ParallelStyle {
 public:
  Colwise(ProcessGroup& g, bool sp) : g_(g), sp_(sp) {}
  Tensor forward(const nn::Module& m, const Tensor& x) const override {
    auto& l = static_cast<const nn::Linear&>(m);
    return linear(enter_group(x, g_, sp_), l.weight, l.bias);
  }

 private:
  ProcessGroup& g_;
  bool sp_;
};

// Partial sums completed by an all_reduce, or (sequence parallel) by a reduce_scatter that leaves
// each rank its slice of the sequence.
class Rowwise final : public nn::ParallelStyle {
 public:
  Rowwise(ProcessGroup& g, bool sp) : g_(g), sp_(sp) {}
  Tensor forward(const nn::Module& m, const Tensor& x) const override {
    auto& l = static_cast<const nn::Linear&>(m);
    Tensor y = linear(x, l.weight);
    if (!sp_) {
      y = all_reduce(y, g_);
      return l.bias.defined() ? y + l.bias : y;
    }
    y = reduce_scatter(y, g_, 1, std::vector<int64_t>(size_t(g_.size()), y.size(1) / g_.size()));
    return l.bias.defined() ? y + replicated_param(l.bias, g_) : y;
  }

 private:
  ProcessGroup& g_;
  bool sp_;
};

// SequenceParallel: a norm on this rank's slice of the sequence, its (replicated) parameters'
// gradients summed over the group.
class SequenceParallelNorm final : public nn::ParallelStyle {
 public:
  explicit SequenceParallelNorm(ProcessGroup& g) : g_(g) {}
  Tensor forward(const nn::Module& m, const Tensor& x) const override {
    if (auto* ln = dynamic_cast<const nn::LayerNorm*>(&m))
      return layer_norm(x, replicated_param(ln->weight, g_), replicated_param(ln->bias, g_), ln->eps);
    auto& rn = static_cast<const nn::RMSNorm&>(m);
    return rms_norm(x, replicated_param(rn.weight, g_), rn.eps);
  }

 private:
  ProcessGroup& g_;
};

// Ids of a vocabulary split: rows [start, start + len) live on this rank. `index` is the local row
// (clamped into range), `valid` 1 where the id is here and 0 elsewhere, in `dt`.
struct LocalIds {
  Tensor index, valid;
};
LocalIds local_ids(const Tensor& ids, int64_t start, int64_t len, DType dt) {
  Tensor local = ids - full({}, double(start), ids.dtype());
  Tensor valid = ge(local, full({}, 0.0, ids.dtype())).to(dt) * lt(local, full({}, double(len), ids.dtype())).to(dt);
  return {clamp(local, 0.0, double(std::max<int64_t>(len - 1, 0))), valid};
}

// Rows [start, start + len) of the vocabulary live here: ids elsewhere look up zeros, and the sum
// over the group is the full lookup.
class VocabParallelEmbedding final : public nn::ParallelStyle {
 public:
  VocabParallelEmbedding(ProcessGroup& g, int64_t start, int64_t len, bool sp) : g_(g), start_(start), len_(len), sp_(sp) {}
  Tensor forward(const nn::Module& m, const Tensor& ids) const override {
    auto& e = static_cast<const nn::Embedding&>(m);
    const LocalIds l = local_ids(ids, start_, len_, e.weight.dtype());
    return all_reduce(embedding(e.weight, l.index) * l.valid.unsqueeze(-1), g_);
  }
  Tensor project(const nn::Module& m, const Tensor& x) const override {
    return linear(enter_group(x, g_, sp_), static_cast<const nn::Embedding&>(m).weight);
  }

 private:
  ProcessGroup& g_;
  int64_t start_, len_;
  bool sp_;
};

// The layer's own computation, for a PrepareModuleIO wrapper with no parallel style inside.
Tensor plain_forward(const nn::Module& m, const Tensor& x) {
  if (auto* l = dynamic_cast<const nn::Linear*>(&m)) return l->sparse.defined() ? linear(x, l->sparse, l->bias) : linear(x, l->weight, l->bias);
  if (auto* e = dynamic_cast<const nn::Embedding*>(&m)) return embedding(e->weight, x);
  if (auto* n = dynamic_cast<const nn::LayerNorm*>(&m)) return layer_norm(x, n->weight, n->bias, n->eps);
  if (auto* r = dynamic_cast<const nn::RMSNorm*>(&m)) return rms_norm(x, r->weight, r->eps);
  SINTER_THROW(DistError, "[prepare_module_io] takes Linear, Embedding, LayerNorm or RMSNorm layers");
}

Tensor redistribute_local(const Tensor& x, const DeviceMesh& mesh, const Placements& from, const Placements& to) {
  if (from.empty() || from == to) return x;
  // from_local learns the global shape from every rank's piece (uneven shards too).
  return DTensor::from_local(x, mesh, from).redistribute(to).to_local();
}

class PrepareIO final : public nn::ParallelStyle {
 public:
  PrepareIO(std::shared_ptr<const nn::ParallelStyle> inner, DeviceMesh mesh, PrepareModuleIO io)
      : inner_(std::move(inner)), mesh_(std::move(mesh)), io_(std::move(io)) {}
  Tensor forward(const nn::Module& m, const Tensor& x) const override {
    const Tensor in = redistribute_local(x, mesh_, io_.input_layouts, io_.desired_input_layouts);
    const Tensor y = inner_ ? inner_->forward(m, in) : plain_forward(m, in);
    return redistribute_local(y, mesh_, io_.output_layouts, io_.desired_output_layouts);
  }
  Tensor project(const nn::Module& m, const Tensor& x) const override {
    return inner_ ? inner_->project(m, x) : nn::ParallelStyle::project(m, x);
  }

 private:
  std::shared_ptr<const nn::ParallelStyle> inner_;
  DeviceMesh mesh_;
  PrepareModuleIO io_;
};

void shard_param(Tensor& slot, const DeviceMesh& tp, int64_t dim) {
  const int64_t n = tp.size(0), r = tp.coordinate(0);
  Shape global = slot.shape();
  slot = piece(slot, dim, n, r);
  set_layout(slot, {{}, tp, {Placement::Shard(dim)}, global});
}

}  // namespace

void parallelize_module(nn::Module& root, const DeviceMesh& tp, const ParallelizePlan& plan, bool sequence_parallel) {
  SINTER_CHECK_T(DistError, tp.ndim() == 1, "[parallelize_module] takes a 1-D mesh, got ", tp.to_string());
  ProcessGroup& g = tp.group(0);
  std::unordered_set<const TensorImpl*> sharded;
  for (auto& [name, m] : root.named_modules()) {
    for (auto& [pattern, style] : plan) {
      if (!matches(pattern, name)) continue;
      SINTER_CHECK_T(DistError, !m->parallel_style, "[parallelize_module] '", name, "' is already parallel");
      SINTER_CHECK_T(DistError, style != TPStyle::sequence_parallel || dynamic_cast<nn::LayerNorm*>(m) || dynamic_cast<nn::RMSNorm*>(m),
                     "[parallelize_module] '", name, "': SequenceParallel applies to norms");
      if (auto* l = dynamic_cast<nn::Linear*>(m)) {
        SINTER_CHECK_T(DistError, !l->sparse.defined(), "[parallelize_module] '", name, "' is 2:4 sparse; tensor parallelism takes dense layers");
        if (style == TPStyle::colwise) {
          shard_param(l->weight, tp, 0);
          if (l->bias.defined()) shard_param(l->bias, tp, 0), sharded.insert(l->bias.impl_ptr().get());
          l->parallel_style = std::make_shared<Colwise>(g, sequence_parallel);
        } else {
          shard_param(l->weight, tp, 1);
          l->parallel_style = std::make_shared<Rowwise>(g, sequence_parallel);
        }
        sharded.insert(l->weight.impl_ptr().get());
      } else if (auto* e = dynamic_cast<nn::Embedding*>(m); e && style == TPStyle::colwise) {
        // The embedding dimension split: each rank looks up its columns; the output stays Shard(-1).
        shard_param(e->weight, tp, 1);
        sharded.insert(e->weight.impl_ptr().get());
      } else if (auto* e = dynamic_cast<nn::Embedding*>(m)) {
        const auto [start, len] = shard_range(e->weight.size(0), g.size(), g.rank());
        shard_param(e->weight, tp, 0);
        sharded.insert(e->weight.impl_ptr().get());
        e->parallel_style = std::make_shared<VocabParallelEmbedding>(g, start, len, sequence_parallel);
      } else if (dynamic_cast<nn::LayerNorm*>(m) || dynamic_cast<nn::RMSNorm*>(m)) {
        SINTER_CHECK_T(DistError, style == TPStyle::sequence_parallel, "[parallelize_module] norm '", name,
                       "' takes SequenceParallel");
        m->parallel_style = std::make_shared<SequenceParallelNorm>(g);
      } else {
        SINTER_THROW(DistError, "[parallelize_module] '", name, "' is not a Linear, an Embedding or a norm");
      }
    }
  }
  // Everything else is replicated over the group: one copy per tp rank.
  for (auto& [name, p] : root.named_parameters())
    if (!sharded.count(p->impl_ptr().get())) set_layout(*p, {{}, tp, {Placement::Replicate()}, p->shape()});
}

void prepare_module_io(nn::Module& root, const DeviceMesh& tp, const std::string& pattern, const PrepareModuleIO& io) {
  for (const Placements* p : {&io.input_layouts, &io.desired_input_layouts, &io.output_layouts, &io.desired_output_layouts})
    SINTER_CHECK_T(DistError, p->empty() || int64_t(p->size()) == tp.ndim(), "[prepare_module_io] ", p->size(),
                   " placements for ", tp.to_string());
  SINTER_CHECK_T(DistError, io.input_layouts.size() == io.desired_input_layouts.size() &&
                                io.output_layouts.size() == io.desired_output_layouts.size(),
                 "[prepare_module_io] give both layouts of a side, or neither");
  int matched = 0;
  for (auto& [name, m] : root.named_modules()) {
    if (!matches(pattern, name)) continue;
    SINTER_CHECK_T(DistError, dynamic_cast<nn::Linear*>(m) || dynamic_cast<nn::Embedding*>(m) || dynamic_cast<nn::LayerNorm*>(m) ||
                                  dynamic_cast<nn::RMSNorm*>(m),
                   "[prepare_module_io] '", name, "' is not a Linear, Embedding, LayerNorm or RMSNorm layer");
    m->parallel_style = std::make_shared<PrepareIO>(m->parallel_style, tp, io);
    ++matched;
  }
  SINTER_CHECK_T(DistError, matched > 0, "[prepare_module_io] no module matches '", pattern, "'");
}

void parallelize_gpt(nn::GPT& model, const DeviceMesh& tp, bool sequence_parallel) {
  const auto& c = model.config();
  const int64_t n = tp.size(0);
  SINTER_CHECK_T(DistError, c.num_attention_heads % n == 0 && c.num_key_value_heads % n == 0, "[parallelize_gpt] ",
                 c.num_attention_heads, " query and ", c.num_key_value_heads, " key/value heads do not split over tp=", n);
  SINTER_CHECK_T(DistError, c.intermediate_size % n == 0 && c.vocab_size % n == 0, "[parallelize_gpt] intermediate size ",
                 c.intermediate_size, " and vocabulary ", c.vocab_size, " must divide by tp=", n);
  ParallelizePlan plan = {{"blocks.*.attn.q_proj", TPStyle::colwise}, {"blocks.*.attn.k_proj", TPStyle::colwise},
                          {"blocks.*.attn.v_proj", TPStyle::colwise}, {"blocks.*.attn.o_proj", TPStyle::rowwise},
                          {"blocks.*.mlp.fc", TPStyle::colwise},      {"blocks.*.mlp.proj", TPStyle::rowwise},
                          {"blocks.*.mlp.gate", TPStyle::colwise},    {"blocks.*.mlp.up", TPStyle::colwise},
                          {"blocks.*.mlp.down", TPStyle::rowwise},    {"tok_emb", TPStyle::rowwise}};
  if (model.lm_head) plan.push_back({"lm_head", TPStyle::colwise});
  if (sequence_parallel)
    for (const char* norm : {"blocks.*.norm1", "blocks.*.norm2", "norm_f"}) plan.push_back({norm, TPStyle::sequence_parallel});
  parallelize_module(model, tp, plan, sequence_parallel);
  ProcessGroup* g = &tp.group(0);
  if (sequence_parallel)  // PrepareModuleInput: the residual stream splits along the sequence at the first block
    model.blocks.front()->prepare_input = [g](const Tensor& x) {
      SINTER_CHECK_T(DistError, x.size(1) % g->size() == 0, "[sequence_parallel] ", x.size(1),
                     " tokens do not split evenly over tp=", g->size());
      return shard(x, *g, 1);
    };
  const int64_t start = shard_range(c.vocab_size, n, tp.coordinate(0)).first;
  model.parallel_loss = [g, start](const Tensor& logits, const Tensor& targets) {
    return loss_parallel(logits, targets, *g, start);
  };
}

Tensor loss_parallel(const Tensor& local_logits, const Tensor& targets, ProcessGroup& tp, int64_t vocab_start) {
  const int64_t V = local_logits.size(-1);
  SINTER_CHECK_SHAPE(local_logits.numel() / std::max<int64_t>(V, 1) == targets.numel(), "[loss_parallel] logits ",
                     local_logits.shape(), " and targets ", targets.shape(), " differ in the number of rows");
  Tensor z = local_logits.reshape({-1, V});
  Tensor t = targets.reshape({-1});
  Tensor m;
  {
    NoGradGuard g;  // a shift for stability: the loss does not depend on it
    m = all_reduce(max(z.detach(), 1, true).values, tp, ReduceOp::max);
  }
  z = z - m;
  Tensor lse = log(all_reduce(sum(exp(z), {1}), tp));
  const LocalIds l = local_ids(t, vocab_start, V, z.dtype());
  Tensor picked = gather(z, 1, l.index.unsqueeze(1)).squeeze(1) * l.valid;
  return mean(lse - all_reduce(picked, tp));
}

std::optional<DTensor> parameter_layout(const Tensor& param) {
  std::optional<Layout> l = get_layout(param);
  if (!l) return std::nullopt;
  return DTensor(param, l->mesh, l->placements, l->global);
}

Tensor full_parameter(const Tensor& param) {
  std::optional<DTensor> d = parameter_layout(param);
  if (!d) return param;
  NoGradGuard g;
  return DTensor(param.detach(), d->mesh(), d->placements(), d->shape()).full_tensor();
}

Tensor clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  NoGradGuard g;
  const int64_t world_n = world_size();
  // Gradients grouped by how many ranks hold the same piece (the ranks outside its mesh, times its
  // replicated dims): each group's sum of squares counts once overall.
  std::map<int64_t, std::vector<Tensor>> by_copies;
  for (auto& p : params) {
    if (!p.grad().defined()) continue;
    int64_t copies = world_n;
    if (std::optional<Layout> l = get_layout(p)) {
      copies = world_n / l->mesh.size();
      for (int64_t d = 0; d < l->mesh.ndim(); ++d)
        if (l->placements[size_t(d)].is_replicate()) copies *= l->mesh.size(d);
    }
    by_copies[copies].push_back(p.grad());
  }
  Tensor total = zeros({}, DType::f64);
  for (auto& [copies, grads] : by_copies) total = total + sum_squares(grads) / double(copies);
  const Tensor norm = sqrt(all_reduce(total.reshape({1}), *world())).reshape({});
  optim::clip_grads_with_norm(params, max_norm, norm);
  return norm;
}

}  // namespace sinter::dist

// Tensor parallelism (Megatron-style Linear / Embedding splits, vocabulary-parallel loss) and FSDP
// (dim-0 parameter shards gathered around each unit's forward, gradients reduce-scattered), both
// on the collective ops, so the backward is ordinary autograd. Every parameter they touch gets a
// layout (a DTensor description) used to gather it for checkpoints and to count it once in norms.
#include <map>
#include <cmath>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "autograd/node.h"
#include "distributed/backend.h"
#include "sinter/autograd.h"
#include "sinter/dist.h"
#include "sinter/op.h"
#include "sinter/optim.h"

namespace sinter::dist {

namespace {

struct Layout {
  std::weak_ptr<TensorImpl> impl;
  DeviceMesh mesh;
  Placements placements;
  Shape global;
  bool fsdp = false;
};
std::mutex g_mu;
std::unordered_map<const TensorImpl*, Layout> g_layouts;
FSDPStats g_stats;  // FSDP gathers on this rank

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

// A fresh leaf holding this rank's piece of `full` along `dim` (split over `parts`).
Tensor piece(const Tensor& full, int64_t dim, int64_t parts, int64_t index) {
  NoGradGuard g;
  const auto [start, len] = shard_range(full.size(dim), parts, index);
  Tensor t = full.detach().narrow(dim, start, len).clone();
  t.requires_grad_(full.requires_grad());
  return t;
}

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

// FSDP: the unit's parameters live as dim-0 shards in their slots between forwards; the forward
// swaps in gathered copies whose backward reduce-scatters (averages) the gradients into the shards.
// With resharding (the default) nothing keeps the gathered copies after the forward: the
// saved-tensor hook replaces every saved view of them with a function that gathers the parameter
// again when the backward reaches it, and that copy is dropped once the gradient is scattered.
class FSDPUnit final : public nn::ForwardHook {
 public:
  struct Param {
    Tensor* slot;
    Tensor shard;
    std::vector<int64_t> sizes;
    Tensor again;  // gathered again for the backward, until the gradient is reduce-scattered
  };
  FSDPUnit(ProcessGroup& g, std::vector<Param> params, bool reshard);
  ~FSDPUnit() override;
  void before(nn::Module&) override;
  void after(nn::Module&) override;
  Tensor gather_again(size_t i) {
    Param& p = params_[i];
    if (!p.again.defined()) {
      NoGradGuard no_grad;
      p.again = all_gather(p.shard, g_, 0, p.sizes);
      g_stats.backward += 1;
    }
    return p.again;
  }
  void release(size_t i) { params_[i].again = Tensor(); }
  // Starts gathering this unit's parameters (non-blocking): the previous unit calls it as its own
  // forward begins, so the transfer overlaps that unit's work where the library progresses it.
  void prefetch();
  Tensor take_prefetched(size_t i);
  FSDPUnit* next = nullptr;  // the unit whose forward follows this one's

 private:
  struct Pending {
    Work work;
    Tensor buffer;
  };
  void wait_pending() {
    for (auto& q : pending_) q.work.wait();
    pending_.clear();
  }
  ProcessGroup& g_;
  std::vector<Param> params_;
  std::vector<Pending> pending_;
  bool reshard_;
  int64_t id_;
};

struct Gathered {  // a gathered parameter's storage, by address
  std::weak_ptr<Storage> storage;
  int64_t unit;
  size_t index;
};
std::mutex g_fsdp_mu;
std::unordered_map<int64_t, FSDPUnit*> g_units;
std::unordered_map<const Storage*, Gathered> g_gathered;
int64_t g_next_unit = 0;

FSDPUnit* find_unit(int64_t id) {  // null once the unit is destroyed
  std::lock_guard<std::mutex> lock(g_fsdp_mu);
  auto f = g_units.find(id);
  return f == g_units.end() ? nullptr : f->second;
}

std::function<Tensor()> recreate_if_gathered(const Tensor& t) {
  if (t.is_symbolic()) return {};
  std::lock_guard<std::mutex> lock(g_fsdp_mu);
  auto it = g_gathered.find(t.storage().get());
  if (it == g_gathered.end() || it->second.storage.lock() != t.storage()) return {};
  const int64_t id = it->second.unit;
  const size_t i = it->second.index;
  const Shape shape = t.shape(), strides = t.strides();
  const int64_t offset = t.offset();
  const DType dt = t.dtype();
  return [id, i, shape, strides, offset, dt]() {
    FSDPUnit* u = find_unit(id);
    SINTER_CHECK_T(DistError, u, "[fully_shard] the module was destroyed before its backward ran");
    Tensor full = u->gather_again(i);
    return Tensor::from_storage(full.storage(), shape, strides, offset, dt);  // the same view of the new copy
  };
}

Tensor prefetched_buffer(int64_t unit, int64_t index) {
  FSDPUnit* u = find_unit(unit);
  return u ? u->take_prefetched(size_t(index)) : Tensor();
}

void release_again(int64_t unit, int64_t index) {
  if (FSDPUnit* u = find_unit(unit)) u->release(size_t(index));
}

FSDPUnit::FSDPUnit(ProcessGroup& g, std::vector<Param> params, bool reshard) : g_(g), params_(std::move(params)), reshard_(reshard) {
  std::lock_guard<std::mutex> lock(g_fsdp_mu);
  id_ = g_next_unit++;
  g_units[id_] = this;
  if (g_units.size() == 1) {
    autograd::set_saved_tensor_hook(recreate_if_gathered);
    detail::fsdp_release = release_again;
    detail::fsdp_prefetched = prefetched_buffer;
  }
}

FSDPUnit::~FSDPUnit() {
  wait_pending();  // MPI may still be writing into the buffers
  std::lock_guard<std::mutex> lock(g_fsdp_mu);
  g_units.erase(id_);
  std::erase_if(g_gathered, [this](const auto& kv) { return kv.second.unit == id_; });
  if (g_units.empty()) autograd::set_saved_tensor_hook({});
}

void FSDPUnit::prefetch() {
  wait_pending();  // a prefetch whose forward never came
  for (Param& p : params_) {
    int64_t per = 1;  // elements per row along dim 0 (known even when this rank's shard is empty)
    for (int64_t d = 1; d < p.shard.dim(); ++d) per *= p.shard.size(d);
    std::vector<int64_t> counts;
    int64_t total = 0;
    for (int64_t len : p.sizes) counts.push_back(len * per), total += len * per;
    Tensor buffer = Tensor::empty({total}, p.shard.dtype());
    pending_.push_back({g_.all_gather(p.shard.detach().reshape({-1}), buffer, counts), buffer});
  }
}

Tensor FSDPUnit::take_prefetched(size_t i) {
  if (i >= pending_.size() || !pending_[i].buffer.defined()) return {};
  pending_[i].work.wait();
  Tensor b = pending_[i].buffer;
  pending_[i].buffer = Tensor();
  if (i + 1 == pending_.size()) pending_.clear();
  return b;
}

void FSDPUnit::before(nn::Module&) {
  static const OpDef& gather = get_op("dist_all_gather");
  const bool prefetched = !pending_.empty();
  if (next) next->prefetch();
  if (reshard_) {  // copies gathered by earlier forwards are gone by now
    std::lock_guard<std::mutex> lock(g_fsdp_mu);
    std::erase_if(g_gathered, [](const auto& kv) { return kv.second.storage.expired(); });
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& p = params_[i];
    Attrs a{{"group", g_.id()}, {"dim", int64_t(0)}, {"sizes", Shape(p.sizes)}, {"grad_partial", true},
            {"grad_op", std::string("avg")}};
    if (reshard_) a.set("release_unit", id_), a.set("release_index", int64_t(i));
    if (prefetched) a.set("prefetch_unit", id_), a.set("prefetch_index", int64_t(i)), g_stats.prefetched += 1;
    g_stats.forward += 1;
    *p.slot = call1(gather, {p.shard}, a);
    if (reshard_ && grad_enabled() && p.slot->storage()) {
      std::lock_guard<std::mutex> lock(g_fsdp_mu);
      g_gathered[p.slot->storage().get()] = {p.slot->storage(), id_, i};
    }
  }
}

void FSDPUnit::after(nn::Module&) {
  for (auto& p : params_) *p.slot = p.shard;
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

void fully_shard(nn::Module& module, const DeviceMesh& dp, bool reshard_after_forward) {
  SINTER_CHECK_T(DistError, dp.ndim() == 1, "[fully_shard] takes a 1-D mesh, got ", dp.to_string());
  SINTER_CHECK_T(DistError, !module.forward_hook, "[fully_shard] the module is already a unit");
  const int64_t n = dp.size(0), r = dp.coordinate(0);
  std::vector<FSDPUnit::Param> params;
  for (auto& [name, slot] : module.named_parameters()) {
    std::optional<Layout> prev = get_layout(*slot);
    if (prev && prev->fsdp) continue;  // already in a sub-unit
    SINTER_CHECK_T(DistError, slot->dim() > 0, "[fully_shard] parameter '", name, "' is a scalar; dim 0 cannot be split");
    Layout l;
    l.fsdp = true;
    if (prev) {  // a tensor-parallel piece, now split again along dim 0: tp outer, dp inner
      l.mesh = prev->mesh.join(dp);
      l.placements = prev->placements;
      l.placements.push_back(Placement::Shard(0));
      l.global = prev->global;
    } else {
      l.mesh = dp, l.placements = {Placement::Shard(0)}, l.global = slot->shape();
    }
    std::vector<int64_t> sizes = shard_sizes(slot->size(0), n);
    *slot = piece(*slot, 0, n, r);
    set_layout(*slot, l);
    params.push_back({slot, *slot, std::move(sizes), Tensor()});
  }
  module.forward_hook = std::make_shared<FSDPUnit>(dp.group(0), std::move(params), reshard_after_forward);
}

void fully_shard_gpt(nn::GPT& model, const DeviceMesh& dp, bool reshard_after_forward) {
  for (auto& b : model.blocks) fully_shard(*b, dp, reshard_after_forward);
  fully_shard(model, dp, reshard_after_forward);
  // Forward order: the root (embeddings) first, then the blocks; each prefetches the next.
  FSDPUnit* prev = static_cast<FSDPUnit*>(model.forward_hook.get());
  for (auto& b : model.blocks) {
    auto* u = static_cast<FSDPUnit*>(b->forward_hook.get());
    prev->next = u;
    prev = u;
  }
}

FSDPStats fsdp_stats() { return g_stats; }

int64_t fsdp_gathered_bytes() {
  std::lock_guard<std::mutex> lock(g_fsdp_mu);
  int64_t n = 0;
  for (auto& [key, g] : g_gathered)
    if (auto st = g.storage.lock()) n += st->nbytes;
  return n;
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

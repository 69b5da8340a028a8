// FSDP (fully_shard): a unit's parameters live as dim-0 shards between forwards, gathered around
// its forward and, with resharding, again for its backward; gradients reduce-scattered. Built on
// the collective ops, so the backward is ordinary autograd; each shard gets its layout (layout.h).
#include <mutex>
#include <unordered_map>

#include "autograd/node.h"
#include "distributed/backend.h"
#include "distributed/layout.h"
#include "sinter/autograd.h"
#include "sinter/dist.h"
#include "sinter/op.h"

namespace sinter::dist {

using detail::get_layout, detail::Layout, detail::piece, detail::set_layout;

namespace {

FSDPStats g_stats;  // FSDP gathers on this rank

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

}  // namespace sinter::dist

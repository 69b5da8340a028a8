#include <atomic>
#include <cmath>
#include <mutex>
#include <sstream>

#include "sinter/autograd.h"
#include "sinter/nn.h"

namespace sinter::nn {

Tensor& Module::register_parameter(const std::string& name, Tensor& slot, Tensor value) {
  slot = std::move(value);
  if (slot.defined()) {
    slot.requires_grad_(true);
    params_.emplace_back(name, &slot);
  }
  return slot;
}

Tensor& Module::register_buffer(const std::string& name, Tensor& slot, Tensor value) {
  slot = std::move(value);
  if (slot.defined()) buffers_.emplace_back(name, &slot);
  return slot;
}

Tensor ParallelStyle::project(const Module&, const Tensor&) const {
  SINTER_THROW(ValueError, "[parallel] this parallel style has no tied output projection");
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out{{"", this}};
  for (auto& [name, child] : children_)
    for (auto& [sub, m] : child->named_modules()) out.emplace_back(sub.empty() ? name : name + "." + sub, m);
  return out;
}

void Module::unregister(const std::string& name) {
  for (auto* list : {&params_, &buffers_})
    std::erase_if(*list, [&](const auto& p) { return p.first == name; });
}

void Linear::sparsify(DType values_dtype) {
  SINTER_CHECK(!sparse.defined(), "[Linear::sparsify] the layer is already sparse");
  NoGradGuard no_grad;
  sparse = to_sparse_semi_structured(prune_2_4(weight.detach()), values_dtype);
  unregister("weight");
  weight = Tensor();
  if (is_floating(values_dtype)) register_parameter("weight_values", sparse.values, sparse.values);
  else register_buffer("weight_values", sparse.values, sparse.values);
  register_buffer("weight_meta", sparse.meta, sparse.meta);
  register_buffer("weight_scales", sparse.scales, sparse.scales);
}

void Module::collect(const std::string& prefix, bool params, std::vector<std::pair<std::string, Tensor*>>& out) {
  for (auto& [name, t] : params ? params_ : buffers_) out.emplace_back(prefix + name, t);
  for (auto& [name, child] : children_) child->collect(prefix + name + ".", params, out);
}

std::vector<std::pair<std::string, Tensor*>> Module::named_parameters() {
  std::vector<std::pair<std::string, Tensor*>> out;
  collect("", true, out);
  return out;
}

std::vector<Tensor> Module::parameters() {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters()) out.push_back(*t);
  return out;
}

std::vector<std::pair<std::string, Tensor*>> Module::named_buffers() {
  std::vector<std::pair<std::string, Tensor*>> out;
  collect("", false, out);
  return out;
}

int64_t Module::num_parameters() {
  int64_t n = 0;
  for (auto& [name, t] : named_parameters()) n += t->numel();
  return n;
}

std::map<std::string, Tensor> Module::state_dict() {
  std::map<std::string, Tensor> sd;
  for (auto& [n, t] : named_parameters()) sd[n] = t->detach();
  for (auto& [n, t] : named_buffers()) sd[n] = t->detach();
  return sd;
}

void Module::load_state_dict(const std::map<std::string, Tensor>& sd, bool strict) {
  auto slots = named_parameters();
  for (auto& b : named_buffers()) slots.push_back(b);
  std::vector<std::string> missing, mismatched, unexpected;
  std::map<std::string, Tensor*> by_name;
  for (auto& [n, t] : slots) by_name[n] = t;
  for (auto& [n, t] : slots) {
    auto it = sd.find(n);
    if (it == sd.end()) { missing.push_back(n); continue; }
    if (it->second.shape() != t->shape() || it->second.dtype() != t->dtype()) {
      std::ostringstream os;
      os << n << " (checkpoint " << it->second.shape() << " " << it->second.dtype() << ", model " << t->shape() << " "
         << t->dtype() << ")";
      mismatched.push_back(os.str());
    }
  }
  for (auto& [n, t] : sd)
    if (!by_name.count(n)) unexpected.push_back(n);
  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
    return s;
  };
  const bool bad = !mismatched.empty() || (strict && (!missing.empty() || !unexpected.empty()));
  if (bad) {
    std::ostringstream os;
    os << "[load_state_dict] checkpoint does not match the model:";
    if (!missing.empty()) os << " missing keys: " << join(missing) << ";";
    if (!unexpected.empty()) os << " unexpected keys: " << join(unexpected) << ";";
    if (!mismatched.empty()) os << " mismatched: " << join(mismatched) << ";";
    throw ValueError(os.str());
  }
  NoGradGuard g;
  for (auto& [n, t] : slots) {
    auto it = sd.find(n);
    if (it != sd.end()) t->copy_(it->second);
  }
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->train(on);
}

void Module::to(DType dtype) {
  NoGradGuard g;
  for (auto& [n, t] : named_parameters())
    if (is_floating(t->dtype()) && t->dtype() != dtype) { *t = t->to(dtype).detach(); t->requires_grad_(true); }
  for (auto& [n, t] : named_buffers())
    if (is_floating(t->dtype()) && t->dtype() != dtype) *t = t->to(dtype).detach();
}

void Module::zero_grad() {
  for (auto& [n, t] : named_parameters()) t->set_grad({});
}

namespace {
int64_t dense_bytes(const SemiStructuredSparse& s, DType dt) { return s.rows() * s.cols() * dtype_size(dt); }
// The (N, K) matrix of a 2:4 weight in dtype dt; differentiable in the float values (to_dense's
// backward). to_dense gives the values' dtype for float values, f32 for int8.
Tensor dense_as(const SemiStructuredSparse& s, DType dt) {
  const Tensor d = s.to_dense();
  return d.dtype() == dt ? d : d.to(dt);
}
}  // namespace

// The dense copy of a small 2:4 weight (Linear::sparse_forward) in the inputs' dtype, with what
// it was made from: the storages (weakly held: a freed one never matches a new one at the same
// address), data pointers and versions of values, meta and scales.
struct Linear::DenseCopy {
  using Source = SemiStructuredSparse::Source;  // as its prepacked copy tracks values and meta
  std::mutex mu;
  Tensor dense;
  Source from[3];
  int64_t held = 0;  // bytes counted against the budget
  static std::atomic<int64_t>& budget_used() {
    static std::atomic<int64_t> used{0};
    return used;
  }
  ~DenseCopy() { budget_used() -= held; }

  // The dense weight in dtype dt (f32 or bf16), or an undefined tensor when the budget is spent.
  Tensor get(const SemiStructuredSparse& s, DType dt) {
    std::lock_guard lock(mu);
    const Tensor* parts[3] = {&s.values, &s.meta, &s.scales};
    bool same = dense.defined() && dense.dtype() == dt;
    for (int i = 0; i < 3 && same; ++i) same = from[i].same(*parts[i]);
    if (same) return dense;
    const int64_t bytes = dense_bytes(s, dt);
    if (bytes != held) {  // a first copy, or one in another dtype
      if (budget_used().fetch_add(bytes - held) + (bytes - held) > kSparseDenseCopyBudget) {
        budget_used() -= bytes;  // give back this request and the old copy
        held = 0, dense = {};
        return {};
      }
      held = bytes;
    }
    NoGradGuard no_grad;
    dense = dense_as(s, dt);
    for (int i = 0; i < 3; ++i) from[i] = {parts[i]->storage(), parts[i]->data_ptr(), parts[i]->version()};
    return dense;
  }
};

int64_t Linear::sparse_dense_copy_bytes() { return DenseCopy::budget_used().load(); }

bool Linear::sparse_is_small() const { return sparse.defined() && dense_bytes(sparse, DType::f32) <= kSmallSparseBytes; }

Tensor Linear::sparse_forward(const Tensor& x) const {
  const bool f32 = x.dtype() == DType::f32;
  if ((!f32 && x.dtype() != DType::bf16) || x.is_symbolic() || !sparse_is_small()) return linear(x, sparse, bias);
  const bool grads = grad_enabled() && (x.requires_grad() || sparse.values.requires_grad() || (bias.defined() && bias.requires_grad()));
  if (grads) return f32 ? linear(x, dense_as(sparse, DType::f32), bias) : linear(x, sparse, bias);
  const Tensor w = dense_copy_->get(sparse, x.dtype());
  return w.defined() ? linear(x, w, bias) : linear(x, sparse, bias);
}

Linear::Linear(int64_t in, int64_t out, bool bias) : dense_copy_(std::make_shared<DenseCopy>()) {
  const double bound = 1.0 / std::sqrt(double(std::max<int64_t>(in, 1)));
  register_parameter("weight", weight, (rand({out, in}) * 2.0 - 1.0) * bound);
  if (bias) register_parameter("bias", this->bias, (rand({out}) * 2.0 - 1.0) * bound);
}

Embedding::Embedding(int64_t num, int64_t dim) { register_parameter("weight", weight, randn({num, dim})); }

LayerNorm::LayerNorm(int64_t dim, double eps) : eps(eps) {
  register_parameter("weight", weight, ones({dim}));
  register_parameter("bias", bias, zeros({dim}));
}

RMSNorm::RMSNorm(int64_t dim, double eps) : eps(eps) { register_parameter("weight", weight, ones({dim})); }

GeluMLP::GeluMLP(int64_t dim, int64_t hidden) {
  fc = register_module("fc", std::make_shared<Linear>(dim, hidden));
  proj = register_module("proj", std::make_shared<Linear>(hidden, dim));
}

SwiGLU::SwiGLU(int64_t dim, int64_t hidden) {
  gate = register_module("gate", std::make_shared<Linear>(dim, hidden, false));
  up = register_module("up", std::make_shared<Linear>(dim, hidden, false));
  down = register_module("down", std::make_shared<Linear>(hidden, dim, false));
}

}  // namespace sinter::nn

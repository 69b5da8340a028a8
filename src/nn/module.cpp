#include <cmath>
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
  auto add = [&](const std::string& n, const Tensor* t) {
    SINTER_CHECK(!t->defined() || !t->is_symbolic(), "[state_dict] '", n, "' holds no data: a 2:4 weight kept only in its prepacked "
                                                     "layout (prepack(replace=true)); unpack() it first");
    sd[n] = t->detach();
  };
  for (auto& [n, t] : named_parameters()) add(n, t);
  for (auto& [n, t] : named_buffers()) add(n, t);
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

void Module::to(Device device) {
  NoGradGuard g;
  for (auto& [n, t] : named_parameters())
    if (t->device() != device) {
      const bool grad = t->requires_grad();
      *t = t->to(device).detach();
      if (grad) t->requires_grad_(true);
    }
  for (auto& [n, t] : named_buffers())
    if (t->device() != device) *t = t->to(device).detach();
}

void Module::zero_grad() {
  for (auto& [n, t] : named_parameters()) t->set_grad({});
}

namespace {
thread_local bool skip_init = false;
}
SkipInitGuard::SkipInitGuard() : prev_(skip_init) { skip_init = true; }
SkipInitGuard::~SkipInitGuard() { skip_init = prev_; }
bool SkipInitGuard::active() { return skip_init; }

// PyTorch's defaults: U(-1/sqrt(in), 1/sqrt(in)) for Linear, N(0, 1) for Embedding.
Linear::Linear(int64_t in, int64_t out, bool bias) {
  const double bound = 1.0 / std::sqrt(double(std::max<int64_t>(in, 1)));
  const auto draw = [&](Shape s) { return skip_init ? zeros(s) : (rand(s) * 2.0 - 1.0) * bound; };
  register_parameter("weight", weight, draw({out, in}));
  if (bias) register_parameter("bias", this->bias, draw({out}));
}

Embedding::Embedding(int64_t num, int64_t dim) { register_parameter("weight", weight, skip_init ? zeros({num, dim}) : randn({num, dim})); }

LayerNorm::LayerNorm(int64_t dim, double eps) : eps(eps) {
  register_parameter("weight", weight, ones({dim}));
  register_parameter("bias", bias, zeros({dim}));
}

RMSNorm::RMSNorm(int64_t dim, double eps) : eps(eps) { register_parameter("weight", weight, ones({dim})); }

Tensor activation(const Tensor& x, const std::string& name) {
  if (name == "gelu_tanh") return gelu(x, true);
  if (name == "gelu") return gelu(x, false);
  if (name == "relu") return relu(x);
  if (name == "silu") return silu(x);
  SINTER_THROW(ValueError, "[activation] unknown activation '", name, "' (gelu_tanh, gelu, relu or silu)");
}

GeluMLP::GeluMLP(int64_t dim, int64_t hidden, std::string act) : act(std::move(act)) {
  fc = register_module("fc", std::make_shared<Linear>(dim, hidden));
  proj = register_module("proj", std::make_shared<Linear>(hidden, dim));
}

SwiGLU::SwiGLU(int64_t dim, int64_t hidden, std::string act) : act(std::move(act)) {
  gate = register_module("gate", std::make_shared<Linear>(dim, hidden, false));
  up = register_module("up", std::make_shared<Linear>(dim, hidden, false));
  down = register_module("down", std::make_shared<Linear>(hidden, dim, false));
}

}  // namespace sinter::nn

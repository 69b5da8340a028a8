#include "sinter/optim.h"

#include <cmath>

#include "sinter/op.h"
#include "sinter/autograd.h"
#include "sinter/ops.h"

namespace sinter::optim {

namespace {
// Where the learning rate and step count live: beside the parameters, so an update reads them
// there (on a GPU: no copy per parameter and step).
Device device_of(const NamedParams& params) { return params.empty() ? Device::cpu() : params.front().second->device(); }
}  // namespace

Optimizer::Optimizer(NamedParams params, double lr)
    : params_(std::move(params)), lr_(full({}, lr, DType::f64, device_of(params_))), step_(zeros({}, DType::i64, device_of(params_))),
      lr_value_(lr) {}

void Optimizer::zero_grad() {
  for (auto& [n, p] : params_) p->set_grad({});
}

void Optimizer::set_lr(double lr) {
  NoGradGuard g;
  lr_.fill_(lr);
  lr_value_ = lr;
}

int64_t Optimizer::steps() const { return step_.item<int64_t>(); }

namespace {
void check_param(const std::string& name, const Tensor& p) {
  SINTER_CHECK_DTYPE(p.dtype() == DType::f32 && p.is_contiguous(), "[optim] parameter ", name,
                     " must be contiguous f32 (master weights), got ", p.dtype());
}
Tensor state_like(const Tensor& p) { return zeros(p.shape(), DType::f32, p.device()); }
void load_state(const std::map<std::string, Tensor>& sd, const std::string& key, Tensor& into, const Shape& shape) {
  auto it = sd.find(key);
  SINTER_CHECK(it != sd.end(), "[optim] optimizer state is missing '", key, "'");
  SINTER_CHECK_SHAPE(it->second.shape() == shape && it->second.dtype() == DType::f32, "[optim] state '", key, "' has shape ",
                     it->second.shape(), " ", it->second.dtype(), ", want ", shape, " f32");
  NoGradGuard g;
  if (into.defined()) into.copy_(it->second.to(into.device()));  // in place: what a compiled step holds stays current
  else into = it->second.contiguous().clone().detach();
}
void load_step(const std::map<std::string, Tensor>& sd, Tensor& step) {
  auto it = sd.find("step");
  SINTER_CHECK(it != sd.end() && it->second.numel() == 1, "[optim] optimizer state is missing 'step'");
  NoGradGuard g;
  step.copy_(it->second.reshape({}));
}
}  // namespace

SGD::SGD(NamedParams params, double lr, double momentum, bool nesterov, double weight_decay)
    : Optimizer(std::move(params), lr), momentum_(momentum), weight_decay_(weight_decay), nesterov_(nesterov) {
  SINTER_CHECK(lr >= 0 && momentum >= 0 && weight_decay >= 0, "[sgd] lr, momentum and weight_decay must be >= 0");
  SINTER_CHECK(!nesterov || momentum > 0, "[sgd] Nesterov momentum needs momentum > 0");
  for (auto& [n, p] : params_) {
    check_param(n, *p);
    if (momentum_ != 0) buf_[n] = state_like(*p);
  }
}

void SGD::step() {
  NoGradGuard g;
  step_.add_(1.0);
  static const OpDef& plain = get_op("sgd_update");
  static const OpDef& with_momentum = get_op("sgd_momentum_update");
  for (auto& [name, p] : params_) {
    const Tensor grad = p->grad();
    if (!grad.defined()) continue;
    if (momentum_ == 0) {
      call(plain, {*p, grad, lr_}, {{"weight_decay", weight_decay_}});
    } else {
      call(with_momentum, {*p, grad, buf_.at(name), lr_},
           {{"momentum", momentum_}, {"nesterov", nesterov_}, {"weight_decay", weight_decay_}});
    }
  }
}

std::map<std::string, Tensor> SGD::state_dict() const {
  std::map<std::string, Tensor> sd{{"step", step_}};
  for (auto& [n, b] : buf_) sd["momentum." + n] = b;
  return sd;
}

void SGD::load_state_dict(const std::map<std::string, Tensor>& sd) {
  load_step(sd, step_);
  for (auto& [n, p] : params_)
    if (sd.count("momentum." + n)) load_state(sd, "momentum." + n, buf_[n], p->shape());
}

AdamW::AdamW(NamedParams params, double lr, double beta1, double beta2, double eps, double weight_decay)
    : Optimizer(std::move(params), lr), beta1_(beta1), beta2_(beta2), eps_(eps), weight_decay_(weight_decay) {
  SINTER_CHECK(lr >= 0 && eps > 0 && weight_decay >= 0, "[adamw] needs lr >= 0, eps > 0, weight_decay >= 0");
  SINTER_CHECK(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1, "[adamw] betas must be in [0, 1), got ", beta1, ", ",
               beta2);
  for (auto& [n, p] : params_) {
    check_param(n, *p);
    m_[n] = state_like(*p);
    v_[n] = state_like(*p);
  }
}

void AdamW::step() {
  NoGradGuard g;
  step_.add_(1.0);
  static const OpDef& op = get_op("adamw_update");
  for (auto& [name, p] : params_) {
    const Tensor grad = p->grad();
    if (!grad.defined()) continue;
    call(op, {*p, grad, m_.at(name), v_.at(name), lr_, step_},
         {{"beta1", beta1_}, {"beta2", beta2_}, {"eps", eps_}, {"weight_decay", p->dim() >= 2 ? weight_decay_ : 0.0}});
  }
}

std::map<std::string, Tensor> AdamW::state_dict() const {
  std::map<std::string, Tensor> sd{{"step", step_}};
  for (auto& [n, t] : m_) sd["exp_avg." + n] = t;
  for (auto& [n, t] : v_) sd["exp_avg_sq." + n] = t;
  return sd;
}

void AdamW::load_state_dict(const std::map<std::string, Tensor>& sd) {
  load_step(sd, step_);
  for (auto& [n, p] : params_) {
    load_state(sd, "exp_avg." + n, m_[n], p->shape());
    load_state(sd, "exp_avg_sq." + n, v_[n], p->shape());
  }
}

double warmup_cosine(int64_t step, int64_t warmup, int64_t total, double max_lr, double min_lr) {
  if (warmup > 0 && step < warmup) return max_lr * double(step + 1) / double(warmup);
  if (step >= total) return min_lr;
  const double t = double(step - warmup) / double(std::max<int64_t>(total - warmup, 1));
  return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + std::cos(M_PI * t));
}

Tensor clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  NoGradGuard g;
  std::vector<Tensor> grads;
  for (auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return zeros({}, DType::f64);
  Tensor norm = sqrt(sum_squares(grads));
  clip_grads_with_norm(params, max_norm, norm);
  return norm;
}

void clip_grads_with_norm(const std::vector<Tensor>& params, double max_norm, const Tensor& norm) {
  NoGradGuard g;
  const Tensor scale = clamp(full({}, max_norm, DType::f64) / (norm + 1e-6), std::nullopt, 1.0);
  for (auto& p : params)
    if (p.grad().defined()) p.grad().mul_(scale);
}

}  // namespace sinter::optim

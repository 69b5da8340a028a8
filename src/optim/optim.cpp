#include "sinter/optim.h"

#include <cmath>

#include "core/parallel.h"
#include "sinter/autograd.h"
#include "sinter/ops.h"

namespace sinter::optim {

void Optimizer::zero_grad() {
  for (auto& [n, p] : params_) p->set_grad({});
}

namespace {
void check_param(const std::string& name, const Tensor& p) {
  SINTER_CHECK_DTYPE(p.dtype() == DType::f32 && p.is_contiguous(), "[optim] parameter ", name,
                     " must be contiguous f32 (master weights), got ", p.dtype());
}
Tensor state_like(const Tensor& p) { return zeros(p.shape(), DType::f32); }
void load_state(const std::map<std::string, Tensor>& sd, const std::string& key, Tensor& into, const Shape& shape) {
  auto it = sd.find(key);
  SINTER_CHECK(it != sd.end(), "[optim] optimizer state is missing '", key, "'");
  SINTER_CHECK_SHAPE(it->second.shape() == shape && it->second.dtype() == DType::f32, "[optim] state '", key, "' has shape ",
                     it->second.shape(), " ", it->second.dtype(), ", want ", shape, " f32");
  into = it->second.contiguous().clone().detach();
}
int64_t load_step(const std::map<std::string, Tensor>& sd) {
  auto it = sd.find("step");
  SINTER_CHECK(it != sd.end() && it->second.numel() == 1, "[optim] optimizer state is missing 'step'");
  return it->second.item<int64_t>();
}
}  // namespace

SGD::SGD(NamedParams params, double lr, double momentum, bool nesterov, double weight_decay)
    : Optimizer(std::move(params), lr), momentum_(momentum), weight_decay_(weight_decay), nesterov_(nesterov) {
  SINTER_CHECK(lr >= 0 && momentum >= 0 && weight_decay >= 0, "[sgd] lr, momentum and weight_decay must be >= 0");
  SINTER_CHECK(!nesterov || momentum > 0, "[sgd] Nesterov momentum needs momentum > 0");
  for (auto& [n, p] : params_) check_param(n, *p);
}

void SGD::step() {
  NoGradGuard g;
  ++step_;
  for (auto& [name, p] : params_) {
    if (!p->grad().defined()) continue;
    Tensor d = p->grad();
    if (weight_decay_ != 0) d = d + *p * weight_decay_;
    if (momentum_ != 0) {
      auto it = buf_.find(name);
      if (it == buf_.end()) it = buf_.emplace(name, d.clone()).first;
      else it->second.mul_(momentum_).add_(d);
      d = nesterov_ ? d + it->second * momentum_ : it->second;
    }
    p->add_(d, -lr);
  }
}

std::map<std::string, Tensor> SGD::state_dict() const {
  std::map<std::string, Tensor> sd{{"step", scalar_tensor(double(step_), DType::i64)}};
  for (auto& [n, b] : buf_) sd["momentum." + n] = b;
  return sd;
}

void SGD::load_state_dict(const std::map<std::string, Tensor>& sd) {
  step_ = load_step(sd);
  buf_.clear();
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
  ++step_;
  const double bc1 = 1.0 - std::pow(beta1_, double(step_)), bc2 = 1.0 - std::pow(beta2_, double(step_));
  const float step_size = float(lr / bc1), bc2_sqrt = float(std::sqrt(bc2));
  const float b1 = float(beta1_), b2 = float(beta2_), eps = float(eps_);
  for (auto& [name, p] : params_) {
    Tensor g = p->grad();
    if (!g.defined()) continue;
    g = g.contiguous();
    SINTER_CHECK_DTYPE(g.dtype() == DType::f32, "[adamw] gradient of ", name, " is ", g.dtype(), ", want f32");
    const float decay = p->dim() >= 2 ? float(1.0 - lr * weight_decay_) : 1.0f;
    float* w = p->data<float>();
    float* m = m_.at(name).data<float>();
    float* v = v_.at(name).data<float>();
    const float* gp = g.data<float>();
    parallel_for(0, p->numel(), 1 << 15, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {  // PyTorch's order: decay, moments, then the step
        w[i] *= decay;
        m[i] = b1 * m[i] + (1 - b1) * gp[i];
        v[i] = b2 * v[i] + (1 - b2) * gp[i] * gp[i];
        w[i] -= step_size * m[i] / (std::sqrt(v[i]) / bc2_sqrt + eps);
      }
    });
    ++p->storage()->version;
  }
}

std::map<std::string, Tensor> AdamW::state_dict() const {
  std::map<std::string, Tensor> sd{{"step", scalar_tensor(double(step_), DType::i64)}};
  for (auto& [n, t] : m_) sd["exp_avg." + n] = t;
  for (auto& [n, t] : v_) sd["exp_avg_sq." + n] = t;
  return sd;
}

void AdamW::load_state_dict(const std::map<std::string, Tensor>& sd) {
  step_ = load_step(sd);
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

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  NoGradGuard g;
  double total = 0;
  for (auto& p : params)
    if (p.grad().defined()) total += sum(p.grad().to(DType::f64) * p.grad().to(DType::f64)).item<double>();
  const double norm = std::sqrt(total);
  clip_grads_with_norm(params, max_norm, norm);
  return norm;
}

void clip_grads_with_norm(const std::vector<Tensor>& params, double max_norm, double norm) {
  if (!(norm > max_norm && norm > 0)) return;
  NoGradGuard g;
  const double s = max_norm / (norm + 1e-6);
  for (auto& p : params)
    if (p.grad().defined()) p.grad().mul_(s);
}

}  // namespace sinter::optim

#pragma once
// Optimizers over named parameters (names key their state in state_dict), a warmup + cosine
// schedule, and gradient clipping.
#include <map>
#include <string>
#include <vector>

#include "sinter/tensor.h"

namespace sinter::optim {

using NamedParams = std::vector<std::pair<std::string, Tensor*>>;

// Each step is one fused update op per parameter (adamw_update, sgd_update, ...). The learning
// rate and the step count live in 0-d tensors that those ops read: a compiled training step sees
// a new learning rate without being traced again (set it with set_lr between steps).
class Optimizer {
 public:
  Optimizer(NamedParams params, double lr);
  virtual ~Optimizer() = default;
  virtual void step() = 0;
  void zero_grad();
  // Every state tensor by name, plus "step" (int64 scalar).
  virtual std::map<std::string, Tensor> state_dict() const = 0;
  virtual void load_state_dict(const std::map<std::string, Tensor>& sd) = 0;
  int64_t steps() const;
  void set_lr(double lr);
  double lr() const { return lr_value_; }

 protected:
  NamedParams params_;
  Tensor lr_;    // f64, 0-d, on the parameters' device
  Tensor step_;  // i64, 0-d: steps taken, on the parameters' device
  double lr_value_;
};

// SGD with momentum, Nesterov momentum and L2 weight decay (PyTorch's formulation).
class SGD : public Optimizer {
 public:
  SGD(NamedParams params, double lr, double momentum = 0.0, bool nesterov = false, double weight_decay = 0.0);
  void step() override;
  std::map<std::string, Tensor> state_dict() const override;
  void load_state_dict(const std::map<std::string, Tensor>& sd) override;

 private:
  double momentum_, weight_decay_;
  bool nesterov_;
  std::map<std::string, Tensor> buf_;  // momentum buffers (zeros until the first step)
};

// AdamW: decoupled weight decay (applied to parameters with 2 or more dims, as GPT training does),
// bias-corrected moments, exactly PyTorch's update order.
class AdamW : public Optimizer {
 public:
  AdamW(NamedParams params, double lr, double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8,
        double weight_decay = 0.01);
  void step() override;
  std::map<std::string, Tensor> state_dict() const override;
  void load_state_dict(const std::map<std::string, Tensor>& sd) override;

 private:
  double beta1_, beta2_, eps_, weight_decay_;
  std::map<std::string, Tensor> m_, v_;
};

// Linear warmup to max_lr over `warmup` steps, then cosine decay to min_lr at `total`.
double warmup_cosine(int64_t step, int64_t warmup, int64_t total, double max_lr, double min_lr);

// Scales gradients so their global L2 norm is at most max_norm (by min(1, max_norm / (norm + 1e-6)),
// as PyTorch); returns the norm before clipping, a 0-d f64 tensor. All of it runs as ops
// (sum_squares, sqrt, mul_), with no read of the norm on the host: it traces and compiles.
Tensor clip_grad_norm(const std::vector<Tensor>& params, double max_norm);
// The scaling step alone, given the norm (computed elsewhere, e.g. across ranks).
void clip_grads_with_norm(const std::vector<Tensor>& params, double max_norm, const Tensor& norm);

}  // namespace sinter::optim

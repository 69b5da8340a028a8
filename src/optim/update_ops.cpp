// The optimizers' updates as ops, each one pass over parameter, gradient and state, writing the
// parameter and the state in place (OpDef::mutates). The learning rate and the step count are 0-d
// tensors (f64 and i64) the kernels read, so a traced or compiled step sees new values without
// being traced again. CPU kernels: src/cpu/op_optim.cpp.
//   adamw_update(param, grad, exp_avg, exp_avg_sq, lr, step) -> (param, exp_avg, exp_avg_sq)
//       attrs beta1, beta2, eps, weight_decay (decoupled; 0 for parameters it skips)
//   sgd_update(param, grad, lr) -> param                                  attr weight_decay
//   sgd_momentum_update(param, grad, buf, lr) -> (param, buf)             attrs momentum, nesterov, weight_decay
#include "ops/common.h"

namespace sinter::detail {
namespace {

void check_update(const char* op, std::span<const TensorMeta> in, size_t lr_at, std::initializer_list<size_t> like_param) {
  const TensorMeta& p = in[0];
  SINTER_CHECK_DTYPE(p.dtype == DType::f32, "[", op, "] parameters must be f32 (master weights), got ", p.dtype);
  for (size_t i : like_param)
    SINTER_CHECK_SHAPE(in[i].shape == p.shape && in[i].dtype == DType::f32, "[", op, "] input ", i, " is ", in[i].shape, " ",
                       in[i].dtype, ", want ", p.shape, " f32 like the parameter");
  SINTER_CHECK(in[lr_at].shape.empty() && in[lr_at].dtype == DType::f64, "[", op, "] the learning rate must be a 0-d f64 tensor, got ",
               in[lr_at].shape, " ", in[lr_at].dtype);
}

void add_update(const char* name, int num_inputs, uint32_t mutates, InferFn check) {
  OpDef d;
  d.name = name;
  d.num_inputs = num_inputs;
  d.num_outputs = std::popcount(mutates);
  d.mutates = mutates;
  d.infer = [check = std::move(check), mutates](std::span<const TensorMeta> in, const Attrs& a) {
    check(in, a);
    std::vector<TensorMeta> out;
    for (size_t i = 0; i < in.size(); ++i)
      if (mutates >> i & 1u) out.push_back(in[i]);
    return out;
  };
  add_op(std::move(d));
}

}  // namespace

void register_optimizer_ops() {
  add_update("adamw_update", 6, 0b1101, [](std::span<const TensorMeta> in, const Attrs& a) {
    check_update("adamw_update", in, 4, {1, 2, 3});
    SINTER_CHECK(in[5].shape.empty() && in[5].dtype == DType::i64, "[adamw_update] the step must be a 0-d i64 tensor, got ",
                 in[5].shape, " ", in[5].dtype);
    SINTER_CHECK(a.f("eps") > 0 && a.f("beta1") >= 0 && a.f("beta1") < 1 && a.f("beta2") >= 0 && a.f("beta2") < 1,
                 "[adamw_update] needs eps > 0 and betas in [0, 1), got eps ", a.f("eps"), ", betas ", a.f("beta1"), ", ", a.f("beta2"));
    return std::vector<TensorMeta>{};
  });
  add_update("sgd_update", 3, 0b1, [](std::span<const TensorMeta> in, const Attrs& a) {
    check_update("sgd_update", in, 2, {1});
    a.f("weight_decay");
    return std::vector<TensorMeta>{};
  });
  add_update("sgd_momentum_update", 4, 0b101, [](std::span<const TensorMeta> in, const Attrs& a) {
    check_update("sgd_momentum_update", in, 3, {1, 2});
    SINTER_CHECK(a.f("momentum") >= 0, "[sgd_momentum_update] momentum must be >= 0, got ", a.f("momentum"));
    return std::vector<TensorMeta>{};
  });
}

}  // namespace sinter::detail

// Activation checkpointing (autograd::checkpoint in sinter/autograd.h): one autograd node whose
// backward runs the function again with its graph recorded and differentiates that graph.
#include <algorithm>
#include <memory>

#include "autograd/node.h"
#include "sinter/autograd.h"
#include "sinter/ops.h"
#include "sinter/random.h"

namespace sinter::autograd {

std::vector<Tensor> checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs, const std::vector<Tensor>& params) {
  const auto wants_grad = [](const std::vector<Tensor>& v) {
    return std::any_of(v.begin(), v.end(), [](const Tensor& t) { return t.defined() && t.requires_grad(); });
  };
  // A trace records the ops themselves (the compiler chooses what its backward recomputes).
  if (!grad_enabled() || tracing() || !(wants_grad(inputs) || wants_grad(params))) return fn(inputs);
  const Generator before = default_generator();  // the draws fn makes (dropout), replayed by the backward
  const DType autocast = autocast_dtype();
  std::vector<Tensor> outs;
  {
    NoGradGuard no_grad;
    outs = fn(inputs);
  }
  std::vector<Tensor> leaves;
  std::vector<TensorMeta> meta;
  for (const std::vector<Tensor>* v : {&inputs, &params})
    for (const Tensor& t : *v) {
      SINTER_CHECK(t.defined(), "[checkpoint] an input or parameter is undefined");
      leaves.push_back(t);
      meta.push_back({t.shape(), t.dtype(), t.device()});
    }
  const std::vector<Tensor> kept = inputs;  // read by the backward
  const size_t n_inputs = inputs.size();
  auto op = std::make_shared<OpDef>();
  op->name = "checkpoint";
  op->num_inputs = int(leaves.size());
  op->num_outputs = int(outs.size());
  op->save_inputs = 0;  // the backward below keeps the inputs; the parameters are the live leaves
  op->backward = [fn, kept, params, before, autocast, n_inputs](BackwardCtx& ctx) {
    const bool create_graph = grad_enabled();  // the engine records the backward itself (higher order)
    std::vector<Tensor> in, targets;
    std::vector<size_t> target_of;  // leaf index of each target
    for (size_t i = 0; i < kept.size(); ++i) {
      // A fresh leaf, or while the backward is itself recorded, a view of the input that keeps
      // the recomputed graph connected to it (for the next order of derivatives).
      Tensor x = create_graph && kept[i].requires_grad() ? kept[i].view(kept[i].shape()) : kept[i].detach();
      if (ctx.needs_grad[i] && !x.requires_grad()) x.requires_grad_(true);
      if (ctx.needs_grad[i]) targets.push_back(x), target_of.push_back(i);
      in.push_back(x);
    }
    for (size_t i = 0; i < params.size(); ++i)
      if (ctx.needs_grad[n_inputs + i]) targets.push_back(params[i]), target_of.push_back(n_inputs + i);
    std::vector<Tensor> again;
    {
      Generator& g = default_generator();
      const Generator now = g;
      g = before;
      EnableGradGuard grad_on;
      AutocastGuard cast(autocast);
      again = fn(in);
      g = now;
    }
    std::vector<Tensor> roots, grads;
    for (size_t k = 0; k < again.size(); ++k)
      if (again[k].requires_grad()) roots.push_back(again[k]), grads.push_back(ctx.grads[k]);
    std::vector<Tensor> out(ctx.needs_grad.size());
    if (roots.empty() || targets.empty()) return out;
    const std::vector<Tensor> g = grad(roots, targets, grads, false, create_graph, true);
    for (size_t t = 0; t < targets.size(); ++t) out[target_of[t]] = g[t];
    return out;
  };
  std::vector<Tensor> diff;
  for (Tensor& o : outs)
    if (is_floating(o.dtype())) diff.push_back(o);
  SINTER_CHECK(diff.size() == outs.size(), "[checkpoint] every output must be a floating-point tensor");
  attach(*op, {}, leaves, meta, diff);
  for (const Tensor& d : diff)
    if (d.grad_fn()) d.grad_fn()->owner = op;  // the node keeps its op (and the kept inputs) alive
  return diff;
}

}  // namespace sinter::autograd

#pragma once
#include <functional>
#include <vector>

#include "sinter/tensor.h"

namespace sinter {

bool grad_enabled();

// Scoped switches of grad mode (thread-local), as torch.no_grad() / torch.enable_grad().
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;
 private:
  bool prev_;
};
class EnableGradGuard {
 public:
  EnableGradGuard();
  ~EnableGradGuard();
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;
 private:
  bool prev_;
};

namespace autograd {

// Saved-tensor hook (process-wide, like torch.autograd.graph.saved_tensors_hooks): for each input
// an op saves for its backward, the hook may return a function that recreates that tensor; the
// graph then keeps the function instead of the tensor and calls it when the backward needs it.
// FSDP uses it to free gathered weights after the forward and gather them again in the backward.
using SavedTensorHook = std::function<std::function<Tensor()>(const Tensor&)>;
void set_saved_tensor_hook(SavedTensorHook hook);  // empty: none

// Accumulates d(sum of outputs·grad_outputs)/d(leaf) into every leaf's .grad().
void backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs = {},
              bool retain_graph = false, bool create_graph = false);

// Returns d(outputs)/d(inputs) without touching .grad(); undefined where an input is unreachable
// (allow_unused) or an error naming the input otherwise.
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {}, bool retain_graph = false,
                         bool create_graph = false, bool allow_unused = false);

// Activation checkpointing (as torch.utils.checkpoint): runs fn on `inputs` without recording its
// graph, so its intermediate tensors are freed as it goes, and records one node over the inputs
// and `params` (the leaves fn reads besides its inputs: a module's parameters). The node's
// backward runs fn again with its graph recorded (the random generator and autocast as they were
// in the first run, so dropout draws the same masks) and differentiates it. It keeps the inputs
// instead of fn's intermediates and pays a second forward in the backward. Outside grad mode, and
// while tracing (a compiled function chooses its own recomputation), fn simply runs. Outputs are
// floating point; fn must compute the same function both times (no in-place updates of inputs).
using CheckpointFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
std::vector<Tensor> checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs, const std::vector<Tensor>& params);
}  // namespace autograd
}  // namespace sinter

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

}  // namespace autograd
}  // namespace sinter

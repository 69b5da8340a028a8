#pragma once
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

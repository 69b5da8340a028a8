#pragma once
// sinter::compile: traces a function of tensors once through the op table, fuses it into generated
// C++ (g++, a disk cache) and from then on runs that program; guards on the inputs, grad mode and
// autocast are checked at every call. Sizes are parameters of the generated code: new sizes trace
// again and reuse the program. Outputs that require grad get a compiled backward. An op that needs
// data (`item`) breaks the graph: the function then runs lazily, in compiled pieces (with
// fullgraph, a CompileError naming the op). Past the recompile limit it runs eagerly, with one
// warning (sinter::warn). docs/compiler.md has the details.
//   auto f = sinter::compile([](const std::vector<Tensor>& in) { return std::vector<Tensor>{gelu(in[0] + in[1])}; });
#include <cstdint>
#include <climits>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sinter/tensor.h"

namespace sinter {

// A dim whose size varies from call to call (a sequence length), with the range it may take.
// Every size is a parameter of the generated code anyway (a new size traces again and reuses the
// program); declaring a dim states the contract: a size outside its range is an error naming it.
struct DynamicDim {
  int input = 0, dim = 0;
  int64_t min = 0, max = INT64_MAX;
};

struct CompileOptions {
  std::vector<DynamicDim> dynamic = {};
  bool fullgraph = false;     // a graph break is a CompileError
  int recompile_limit = 8;    // new programs (or graph breaks) per function before it runs eagerly
  bool recompute = true;      // a compiled backward computes views and cheap arithmetic (no exp,
                              // no division) of values it has again, instead of the forward keeping them
  std::string name = "fn";    // in messages, debug dumps and generated code
};

using TensorFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

// What explain() reports about a compiled function's current state.
struct Explanation {
  int graphs = 0;                  // traces made (one per guard set); lazily, the last call's pieces
  int compiles = 0;                // programs compiled (or loaded): traces at new sizes reuse one
  int breaks = 0;
  std::vector<std::string> break_reasons;  // "item: the output needs the input's data"
  int fused_kernels = 0;           // in the latest graph
  int library_calls = 0;           // kernels of the op table the wrapper calls
  std::vector<std::string> kernels;  // each fused kernel with its ops
  std::vector<std::string> library;  // each library call: its op, a GEMM with its epilogue
                                     // ("linear_fused: bias + gelu_tanh + residual")
  std::vector<std::string> user_kernels;  // each user kernel called, with each key bucket's config
                                          // ("swiglu: 2 config(s); bucket (64, 512): config 1")
  std::vector<std::string> guards;   // of the latest graph
  double guard_check_us = 0;       // finding the compiled code for these inputs (guards), per call
  int64_t planned_bytes = 0;       // intermediate buffers after reuse
  int64_t unplanned_bytes = 0;     // the same without reuse
  int64_t saved_bytes = 0;         // with a compiled backward: forward values kept for it
  int recomputed = 0;              // forward nodes the backward computes again instead
  std::vector<std::string> warnings;  // what the function warned about (also sent to sinter::warn)
  std::vector<std::string> notes;     // what the passes removed that a reader may wonder about
                                      // ("dropped copy_ (node 3): it writes a buffer nothing reads afterwards")
  std::string text;                // all of the above, readable
};

class CompiledFunction {
 public:
  CompiledFunction(TensorFn fn, CompileOptions opts);
  ~CompiledFunction();
  CompiledFunction(CompiledFunction&&) noexcept;
  CompiledFunction& operator=(CompiledFunction&&) noexcept;
  std::vector<Tensor> operator()(const std::vector<Tensor>& inputs);
  // Traces and compiles for these inputs if needed (running nothing), then reports.
  Explanation explain(const std::vector<Tensor>& inputs);
  int compiles() const;  // programs compiled (or loaded from the disk cache) so far
  int traces() const;    // traces made so far (a trace at new sizes may reuse a program)

  struct State;
 private:
  std::unique_ptr<State> s_;
};

CompiledFunction compile(TensorFn fn, CompileOptions opts = {});
// A module's forward compiled (any module whose forward takes one tensor: nn::GPT, nn::Linear,
// an MLP): what torch.compile(model) is to PyTorch. The module is read by reference, so training
// it between calls is seen.
//   auto f = sinter::compile_forward(model);  Tensor logits = f({idx})[0];
template <class M> CompiledFunction compile_forward(M& module, CompileOptions opts = {}) {
  if (opts.name == "fn") opts.name = "forward";
  return compile([&module](const std::vector<Tensor>& in) { return std::vector<Tensor>{module.forward(in[0])}; }, std::move(opts));
}
Explanation explain(CompiledFunction& f, const std::vector<Tensor>& inputs);

}  // namespace sinter

#pragma once
// sinter::compile: runs a function once on symbolic tensors to trace its op calls into a graph,
// fuses elementwise chains into generated C++ kernels, compiles them with the system C++ compiler
// (g++; SINTER_CXX overrides) into a cached shared object, and from then on calls a wrapper that
// runs the fused kernels and the library's kernels on preplanned buffers, with no per-op dispatch.
//
//   auto f = sinter::compile([](const std::vector<Tensor>& in) {
//     return std::vector<Tensor>{gelu(in[0] * 1.5 + in[1]) * sigmoid(in[0]) + in[0] * 0.5};
//   });
//   std::vector<Tensor> y = f({x, b});
//
// Sizes are not part of the generated code: its kernels read sizes, strides and offsets as
// parameters, so a call with new sizes (a new sequence length, a new batch) traces the function
// again (milliseconds) and runs the program already compiled; only a new structure (another dtype,
// layout or branch taken) compiles another. compiles() counts programs, traces() traces.
//
// Outputs that require grad (grad mode on, an input or captured parameter requiring grad) come
// back with an autograd node: the function's backward is traced with its forward, the two are split
// where the output gradients enter, and the backward runs as a second compiled program on the
// forward values it reads (returned by the forward beside the outputs). `compile_forward(model)`
// then trains: loss.backward() reaches the parameters through compiled code.
//
// The trace is specialised to what the function read besides its inputs, as torch.jit.trace is:
// C++ values (ints, doubles, branches) become constants of the graph; tensors the function
// captures (parameters, buffers, caches) are read by reference at every call, so updates to them
// are seen. Guards on the inputs (shapes, dtypes, strides, requires_grad) and on grad mode and
// autocast are checked on every call; a miss traces again. Traces that need a new program count
// toward a recompile limit past which the function runs eagerly (with one warning naming the
// guard that kept failing). An op whose output
// needs data (`item`) cannot be traced past: with `fullgraph` it is a CompileError naming the op.
// Without it the graph splits there: the function runs lazily from then on, every call recording
// its op calls into pieces that end where the host reads a value; each piece (its outputs: the
// tensors still referenced) is compiled once per structure, and C++ branches on the value simply
// lead to other pieces. explain() then reports the last call's pieces and breaks.
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
  std::vector<std::string> guards;   // of the latest graph
  double guard_check_us = 0;       // finding the compiled code for these inputs (guards), per call
  int64_t planned_bytes = 0;       // intermediate buffers after reuse
  int64_t unplanned_bytes = 0;     // the same without reuse
  int64_t saved_bytes = 0;         // with a compiled backward: forward values kept for it
  int recomputed = 0;              // forward nodes the backward computes again instead
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

#pragma once
// Tracing: runs a function on symbolic stand-ins of its inputs under a tracing observer, so every
// op call becomes a node (compiler/graph.h). Real tensors the calls read are captured by
// reference. A data-dependent op (OpDef::data_dependent) or a read of a traced tensor's data stops
// the trace: with fullgraph that is a CompileError naming the op. Random draws are nodes whose
// counters are kept relative to the generator's state at the start (Node::random_offset); the
// trace leaves the generator as it found it.
#include <functional>

#include "compiler/graph.h"
#include "sinter/compile.h"

namespace sinter::compiler {

// The traced backward of outputs that require grad (when grad mode is on): graph.nodes[0,
// forward_nodes) are the forward, the rest the backward, which reads the output gradients (graph
// inputs numbered after the function's) and makes `grads`, one value per leaf (-1: none flowed).
struct TracedBackward {
  int forward_nodes = -1;         // -1: no backward traced
  std::vector<int> outputs;       // which of the function's outputs are differentiated
  struct Leaf {
    bool input;                   // a function input (else a captured tensor)
    int index;                    // its input or captured number
  };
  std::vector<Leaf> leaves;
  std::vector<int> grads;
};

// A gradient a traced function's own backward leaves on a leaf: a captured tensor, or input
// `input` (the caller's tensor of each call).
struct LeafGrad {
  Tensor leaf;
  int input = -1;
  bool cleared = false;  // the function cleared the leaf's gradient first (zero_grad()): each call sets it
  bool read = false;     // a node of the graph reads it (an optimizer step)
};

struct TraceResult {
  Graph graph;
  TracedBackward backward;
  bool broke = false;
  std::string break_op, break_reason;  // where and why the trace stopped
  // Leaves (captured tensors) the function's own backward left gradients on: graph outputs after
  // the function's, in this order; and leaves it cleared (set_grad({})) that end with none.
  std::vector<LeafGrad> leaf_grads;
  std::vector<Tensor> leaves_cleared;
};

TraceResult trace(const TensorFn& fn, const std::vector<Tensor>& inputs, const CompileOptions& opts);

// Lazy tracing, for a function whose trace breaks: each call runs `fn` on its real inputs under a
// tracer that records op calls into a piece; a read of a traced tensor's data (item, printing, a
// branch on a value) and the function's return hand the piece to `run_piece`, with its outputs
// set to the values still referenced outside the tracer. run_piece computes them (the generator's
// offset when the piece began is `random_base`; the piece's draws are already reserved) and
// returns them in the order of graph.outputs; the tracer makes those tensors real and records
// the next piece. Returns fn's outputs, real.
using RunPiece = std::function<std::vector<Tensor>(Graph& piece, uint64_t random_base, const std::string& reason)>;
std::vector<Tensor> trace_lazily(const TensorFn& fn, const std::vector<Tensor>& inputs, const CompileOptions& opts,
                                 const RunPiece& run_piece);

}  // namespace sinter::compiler

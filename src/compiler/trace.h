#pragma once
// Tracing: runs a function on symbolic stand-ins of its inputs under a tracing observer, so every
// op call becomes a node (compiler/graph.h). Real tensors the calls read are captured by
// reference. A data-dependent op (OpDef::data_dependent) or a read of a traced tensor's data stops
// the trace: with fullgraph that is a CompileError naming the op. Random draws are nodes whose
// counters are kept relative to the generator's state at the start (Node::random_offset); the
// trace leaves the generator as it found it.
#include "compiler/graph.h"
#include "sinter/compile.h"

namespace sinter::compiler {

struct TraceResult {
  Graph graph;
  bool broke = false;
  std::string break_op, break_reason;  // where and why the trace stopped
};

TraceResult trace(const TensorFn& fn, const std::vector<Tensor>& inputs, const CompileOptions& opts);

}  // namespace sinter::compiler

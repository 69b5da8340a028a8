#pragma once
// The backward graph: one Node per op call that needs a gradient, with edges to the nodes (or
// leaves) that produced its inputs.
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "sinter/op.h"

namespace sinter::autograd {

struct Node;

struct Edge {
  std::shared_ptr<Node> fn;             // producer of the input, or
  int output_nr = 0;
  std::shared_ptr<TensorImpl> leaf;     // the leaf to accumulate into
  bool valid() const { return fn || leaf; }
};

struct Node : std::enable_shared_from_this<Node> {
  const OpDef* op = nullptr;
  Attrs attrs;
  std::vector<Tensor> saved_inputs, saved_outputs;   // outputs saved detached (no cycle)
  std::vector<std::function<Tensor()>> saved_thunks;  // inputs the saved-tensor hook took over
  std::vector<uint64_t> input_versions, output_versions;
  std::vector<TensorMeta> input_meta, output_meta;
  std::vector<Edge> next;                            // one per input
  bool released = false;
  std::shared_ptr<const void> owner;  // an op made for this call alone (a compiled backward), kept alive with the node
};

// Records the op call on its outputs (called by sinter::call when grad mode is on).
void attach(const OpDef& op, const Attrs& attrs, std::span<const Tensor> inputs, std::span<const TensorMeta> in_meta,
            std::span<Tensor> outputs);

}  // namespace sinter::autograd

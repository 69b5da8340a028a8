// The forward/backward partition of a joint trace (a function whose outputs require grad, traced
// with its backward): the forward program returns the outputs and what the backward reads; the
// backward program takes those and the output gradients and returns the leaves' gradients.
#include "compiler/compiled.h"

namespace sinter::compiler {

void split_backward(Entry& e, TraceResult& r, size_t num_inputs, bool recompute) {
  const Graph& g = r.graph;
  const TracedBackward& b = r.backward;
  const size_t nf = size_t(b.forward_nodes);
  std::vector<int> saved;
  std::vector<bool> is_saved(g.values.size(), false);
  auto need = [&](int v) {
    const Value& x = g.values[size_t(v)];
    const bool forward = (x.kind == ValueKind::node && size_t(x.node) < nf) || (x.kind == ValueKind::input && size_t(x.index) < num_inputs);
    if (forward && !is_saved[size_t(v)]) is_saved[size_t(v)] = true, saved.push_back(v);
  };
  for (size_t n = nf; n < g.nodes.size(); ++n)
    for (int v : g.nodes[n].inputs) need(v);
  for (int v : b.grads)
    if (v >= 0) need(v);
  // Cheap values the backward computes again from what it has anyway, instead of the forward
  // keeping them alive until the backward runs.
  std::vector<size_t> backward_nodes;
  if (recompute) backward_nodes = choose_recomputation(g, nf, is_saved, cpp_target());
  const size_t recomputed = backward_nodes.size();
  std::erase_if(saved, [&](int v) { return !is_saved[size_t(v)]; });
  for (size_t n = nf; n < g.nodes.size(); ++n) backward_nodes.push_back(n);
  const std::vector<int> fn_inputs(g.inputs.begin(), g.inputs.begin() + long(num_inputs));
  std::vector<int> forward_out = g.outputs;
  forward_out.insert(forward_out.end(), saved.begin(), saved.end());
  std::vector<int> backward_in = saved, backward_out;
  backward_in.insert(backward_in.end(), g.inputs.begin() + long(num_inputs), g.inputs.end());
  auto part = std::make_shared<BackwardPart>();
  for (int v : b.grads) {
    part->grad_of_leaf.push_back(v < 0 ? -1 : int(backward_out.size()));
    if (v >= 0) backward_out.push_back(v);
  }
  part->entry = std::make_shared<Entry>();
  part->entry->graph = extract(g, backward_nodes, backward_in, backward_out);
  part->recomputed = recomputed;
  for (int v : saved)
    if (g.values[size_t(v)].kind == ValueKind::node) part->saved_bytes += g.values[size_t(v)].meta.shape.numel() * dtype_size(g.values[size_t(v)].meta.dtype);
  part->outputs = g.outputs.size();
  part->differentiated = b.outputs;
  part->leaves = b.leaves;
  for (const TracedBackward::Leaf& l : b.leaves) {
    Tensor t;
    if (!l.input)
      for (int v : g.captured)
        if (g.values[size_t(v)].index == l.index) t = g.values[size_t(v)].captured;
    part->captured_leaves.push_back(t);
  }
  Graph forward = extract(g, 0, nf, fn_inputs, forward_out);
  forward.random_blocks = g.random_blocks;
  e.graph = std::move(forward);
  e.backward = std::move(part);
}

}  // namespace sinter::compiler

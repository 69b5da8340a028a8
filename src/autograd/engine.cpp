// The backward engine: topological order over the nodes reachable from the outputs, gradients
// summed per (node, output), broadcasting and dtype undone centrally, leaves accumulated.
#include <functional>
#include <algorithm>
#include <deque>
#include <unordered_map>
#include <unordered_set>

#include "autograd/node.h"
#include "sinter/autograd.h"
#include "sinter/ops.h"

namespace sinter {
namespace detail {
// Set by a compiler trace: called when a traced backward adds to a leaf's real gradient.
std::function<void(const Tensor&)> g_accumulate_traced;
}  // namespace detail

static thread_local bool t_grad_enabled = true;

bool grad_enabled() { return t_grad_enabled; }
NoGradGuard::NoGradGuard() : prev_(t_grad_enabled) { t_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { t_grad_enabled = prev_; }
EnableGradGuard::EnableGradGuard() : prev_(t_grad_enabled) { t_grad_enabled = true; }
EnableGradGuard::~EnableGradGuard() { t_grad_enabled = prev_; }

namespace {
struct GradModeScope {
  bool prev;
  explicit GradModeScope(bool on) : prev(t_grad_enabled) { t_grad_enabled = on; }
  ~GradModeScope() { t_grad_enabled = prev; }
};
}  // namespace

namespace autograd {

namespace {
SavedTensorHook& saved_hook() {
  static SavedTensorHook h;
  return h;
}
}  // namespace

void set_saved_tensor_hook(SavedTensorHook hook) { saved_hook() = std::move(hook); }

void attach(const OpDef& op, const Attrs& attrs, std::span<const Tensor> inputs, std::span<const TensorMeta> in_meta,
            std::span<Tensor> outputs) {
  auto node = std::make_shared<Node>();
  node->op = &op;
  node->attrs = attrs;
  node->input_meta.assign(in_meta.begin(), in_meta.end());
  node->saved_inputs.resize(inputs.size());
  node->input_versions.resize(inputs.size());
  node->next.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (i < 32 && (op.save_inputs >> i & 1u)) {
      if (saved_hook() && t.defined())
        if (std::function<Tensor()> thunk = saved_hook()(t)) {
          node->saved_thunks.resize(inputs.size());
          node->saved_thunks[i] = std::move(thunk);
        }
      if (node->saved_thunks.empty() || !node->saved_thunks[i]) {
        node->saved_inputs[i] = t;
        node->input_versions[i] = t.version();
      }
    }
    if (t.requires_grad()) {
      if (t.grad_fn()) node->next[i] = Edge{t.grad_fn(), t.impl().output_nr, nullptr};
      else node->next[i] = Edge{nullptr, 0, t.impl_ptr()};
    }
  }
  node->saved_outputs.resize(outputs.size());
  node->output_versions.resize(outputs.size());
  for (size_t k = 0; k < outputs.size(); ++k) {
    Tensor& o = outputs[k];
    node->output_meta.push_back({o.shape(), o.dtype(), o.device()});
    if (k < 32 && (op.save_outputs >> k & 1u)) {
      node->saved_outputs[k] = o.detach();
      node->output_versions[k] = o.version();
    }
    if (is_floating(o.dtype())) {
      o.impl().requires_grad = true;
      o.impl().grad_fn = node;
      o.impl().output_nr = int(k);
    }
  }
}

namespace {

void check_version(const Node& n, const Tensor& t, uint64_t v, const char* what, size_t i) {
  if (t.defined() && t.version() != v)
    SINTER_THROW(AutogradError, "[", n.op->name, "] ", what, " ", i, " (shape ", t.shape(),
                 ") was modified in place after it was saved for backward (version ", v, " -> ", t.version(),
                 "); clone it before modifying");
}

// Makes a gradient fit the input it belongs to: sum over broadcast dims, cast to its dtype.
Tensor fit_grad(const Node& n, size_t i, Tensor g) {
  const TensorMeta& m = n.input_meta[i];
  if (g.shape() != m.shape) g = sum_to(g, m.shape);
  if (g.dtype() != m.dtype) g = cast(g, m.dtype);
  SINTER_ASSERT(g.shape() == m.shape, "[", n.op->name, "] backward gave input ", i, " a gradient of shape ", g.shape());
  return g;
}

Tensor accumulate(const Tensor& a, const Tensor& b) { return a.defined() ? add(a, b) : b; }

struct Run {
  bool retain_graph = false;
  bool create_graph = false;
  // autograd::grad: capture gradients here instead of accumulating into leaves.
  bool capture_mode = false;
  std::unordered_map<const TensorImpl*, size_t> capture_leaf;
  std::unordered_map<const Node*, std::vector<std::pair<int, size_t>>> capture_node;
  std::vector<Tensor> captured;

  void deliver_leaf(const std::shared_ptr<TensorImpl>& leaf, const Tensor& g) {
    if (capture_mode) {
      auto it = capture_leaf.find(leaf.get());
      if (it != capture_leaf.end()) captured[it->second] = accumulate(captured[it->second], g);
      return;
    }
    Tensor grad = create_graph ? g : g.detach();
    Tensor old = leaf->grad ? Tensor(leaf->grad) : Tensor();
    // Traced (a symbolic gradient) onto a gradient the leaf already holds: a compiled function
    // cannot keep that tensor from call to call, so the tracer stops here (compiler/trace.cpp).
    if (old.defined() && !old.is_symbolic() && grad.is_symbolic() && detail::g_accumulate_traced) detail::g_accumulate_traced(old);
    if (old.defined()) {
      GradModeScope mode(create_graph);
      grad = add(old, grad);
    }
    leaf->grad = grad.impl_ptr();
  }

  void execute(const std::vector<Tensor>& roots, const std::vector<Tensor>& root_grads) {
    std::unordered_map<Node*, std::vector<Tensor>> buffers;
    std::vector<Node*> starts;
    for (size_t i = 0; i < roots.size(); ++i) {
      const Tensor& r = roots[i];
      if (!r.grad_fn()) { deliver_leaf(r.impl_ptr(), root_grads[i]); continue; }
      Node* n = r.grad_fn().get();
      auto& buf = buffers[n];
      buf.resize(n->output_meta.size());
      buf[size_t(r.impl().output_nr)] = accumulate(buf[size_t(r.impl().output_nr)], root_grads[i]);
      starts.push_back(n);
    }
    // Dependency counts over the reachable graph.
    std::unordered_map<Node*, int> deps;
    std::unordered_set<Node*> seen;
    std::vector<Node*> stack(starts.begin(), starts.end());
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      if (!seen.insert(n).second) continue;
      for (auto& e : n->next)
        if (e.fn) { ++deps[e.fn.get()]; stack.push_back(e.fn.get()); }
    }
    std::deque<Node*> ready;
    for (Node* n : seen)
      if (deps[n] == 0) ready.push_back(n);
    while (!ready.empty()) {
      Node* n = ready.front();
      ready.pop_front();
      run_node(n, buffers, deps, ready);
    }
  }

  void run_node(Node* n, std::unordered_map<Node*, std::vector<Tensor>>& buffers, std::unordered_map<Node*, int>& deps,
                std::deque<Node*>& ready) {
    auto release_edges = [&] {
      for (auto& e : n->next)
        if (e.fn && --deps[e.fn.get()] == 0) ready.push_back(e.fn.get());
    };
    auto bit = buffers.find(n);
    if (bit == buffers.end()) { release_edges(); return; }  // no gradient reached this node
    std::vector<Tensor> grads = std::move(bit->second);
    buffers.erase(bit);
    grads.resize(n->output_meta.size());
    std::vector<bool> flowed(grads.size());
    for (size_t k = 0; k < grads.size(); ++k) {
      const TensorMeta& m = n->output_meta[k];
      flowed[k] = grads[k].defined();
      if (!grads[k].defined() && is_floating(m.dtype)) grads[k] = zeros(m.shape, m.dtype, m.device);
    }
    if (auto it = capture_node.find(n); it != capture_node.end())
      for (auto [k, slot] : it->second) captured[slot] = accumulate(captured[slot], grads[size_t(k)]);

    SINTER_CHECK_T(AutogradError, !n->released, "[", n->op->name,
                   "] trying to run backward through the graph a second time; its saved tensors were freed "
                   "(pass retain_graph=true the first time)");
    for (size_t i = 0; i < n->saved_thunks.size(); ++i)  // recreated now (FSDP gathers them again)
      if (n->saved_thunks[i]) n->saved_inputs[i] = n->saved_thunks[i](), n->input_versions[i] = n->saved_inputs[i].version();
    for (size_t i = 0; i < n->saved_inputs.size(); ++i) check_version(*n, n->saved_inputs[i], n->input_versions[i], "input", i);
    for (size_t k = 0; k < n->saved_outputs.size(); ++k)
      check_version(*n, n->saved_outputs[k], n->output_versions[k], "output", k);

    std::vector<Tensor> outs = n->saved_outputs;
    if (create_graph) {  // re-link saved outputs to this node so higher-order grads see them
      for (size_t k = 0; k < outs.size(); ++k) {
        if (!outs[k].defined() || !is_floating(outs[k].dtype())) continue;
        outs[k] = outs[k].detach();
        outs[k].impl().requires_grad = true;
        outs[k].impl().grad_fn = n->shared_from_this();
        outs[k].impl().output_nr = int(k);
      }
    }
    BackwardCtx ctx{*n->op, n->attrs, n->saved_inputs, outs, std::move(grads), n->input_meta, {}, std::move(flowed)};
    ctx.needs_grad.resize(n->next.size());
    for (size_t i = 0; i < n->next.size(); ++i) ctx.needs_grad[i] = n->next[i].valid();
    std::vector<Tensor> in_grads;
    {
      GradModeScope mode(create_graph);
      ProfileScope scope(n->op->name);
      in_grads = n->op->backward(ctx);
    }
    SINTER_ASSERT(in_grads.size() == n->next.size(), "[", n->op->name, "] backward returned ", in_grads.size(),
                  " gradients for ", n->next.size(), " inputs");
    if (!retain_graph) {
      n->released = true;
      n->saved_inputs.assign(n->saved_inputs.size(), Tensor());
      n->saved_outputs.assign(n->saved_outputs.size(), Tensor());
      n->saved_thunks.clear();
    }
    for (size_t i = 0; i < n->next.size(); ++i) {
      Edge& e = n->next[i];
      if (!e.valid() || !in_grads[i].defined()) continue;
      Tensor g;
      {
        GradModeScope mode(create_graph);
        g = fit_grad(*n, i, in_grads[i]);
      }
      if (e.leaf) {
        deliver_leaf(e.leaf, g);
      } else {
        auto& buf = buffers[e.fn.get()];
        buf.resize(e.fn->output_meta.size());
        GradModeScope mode(create_graph);
        buf[size_t(e.output_nr)] = accumulate(buf[size_t(e.output_nr)], g);
      }
    }
    release_edges();
  }
};

std::vector<Tensor> root_grads_for(const char* op, const std::vector<Tensor>& outputs,
                                   const std::vector<Tensor>& grad_outputs) {
  SINTER_CHECK_T(AutogradError, grad_outputs.empty() || grad_outputs.size() == outputs.size(), "[", op, "] got ",
                 grad_outputs.size(), " gradients for ", outputs.size(), " outputs");
  std::vector<Tensor> g(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& o = outputs[i];
    SINTER_CHECK_T(AutogradError, o.requires_grad(), "[", op, "] output ", i, " (shape ", o.shape(),
                   ") does not require grad and has no grad_fn");
    if (!grad_outputs.empty() && grad_outputs[i].defined()) {
      SINTER_CHECK_SHAPE(grad_outputs[i].shape() == o.shape(), "[", op, "] gradient of shape ", grad_outputs[i].shape(),
                         " for output ", i, " of shape ", o.shape());
      g[i] = grad_outputs[i];
    } else {
      SINTER_CHECK_T(AutogradError, o.numel() == 1, "[", op, "] a gradient can be implied only for one-element outputs; output ",
                     i, " has shape ", o.shape(), ": pass a gradient");
      g[i] = ones_like(o);
    }
  }
  return g;
}

}  // namespace

void backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs, bool retain_graph,
              bool create_graph) {
  Run run;
  run.retain_graph = retain_graph || create_graph;
  run.create_graph = create_graph;
  run.execute(outputs, root_grads_for("backward", outputs, grad_outputs));
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, bool retain_graph, bool create_graph,
                         bool allow_unused) {
  Run run;
  run.retain_graph = retain_graph || create_graph;
  run.create_graph = create_graph;
  run.capture_mode = true;
  run.captured.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    SINTER_CHECK_T(AutogradError, t.requires_grad(), "[grad] input ", i, " (shape ", t.shape(), ") does not require grad");
    if (t.grad_fn()) run.capture_node[t.grad_fn().get()].push_back({t.impl().output_nr, i});
    else run.capture_leaf[t.impl_ptr().get()] = i;
  }
  run.execute(outputs, root_grads_for("grad", outputs, grad_outputs));
  for (size_t i = 0; i < inputs.size(); ++i) {
    SINTER_CHECK_T(AutogradError, allow_unused || run.captured[i].defined(), "[grad] input ", i, " (shape ",
                   inputs[i].shape(), ") is not reachable from the outputs (pass allow_unused=true)");
    if (run.captured[i].defined() && !create_graph) run.captured[i] = run.captured[i].detach();
  }
  return run.captured;
}

}  // namespace autograd

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  autograd::backward({*this}, gradient.defined() ? std::vector<Tensor>{gradient} : std::vector<Tensor>{}, retain_graph);
}

}  // namespace sinter

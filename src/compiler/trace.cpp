// The tracer: an OpObserver that turns every top-level op call into a graph node.
#include "compiler/trace.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <unordered_map>

#include "sinter/autograd.h"
#include "sinter/random.h"

namespace sinter {
namespace detail {
extern std::function<void(const Tensor&)> g_materialize;  // core/tensor.cpp: reading a symbolic tensor's data
extern std::function<void(const Tensor&)> g_accumulate_traced;  // autograd/engine.cpp: a backward adding to a real .grad
extern std::function<void(const Tensor&)> g_grad_cleared;       // core/tensor.cpp: set_grad({}) (zero_grad)
}

namespace compiler {
namespace {

// Thrown through the traced function where the trace cannot go on (and fullgraph is off).
struct Break {
  std::string op, reason;
};

class Tracer : public OpObserver {
 public:
  explicit Tracer(const CompileOptions& o, const RunPiece* run_piece = nullptr)
      : start_(default_generator()), opts_(o), run_piece_(run_piece) {}
  bool tracing() const override { return true; }

  Tensor add_input(const Tensor& t, int index) {
    Tensor s = Tensor::symbolic(t.shape(), t.dtype(), t.device(), &t.strides(), t.offset());
    if (t.requires_grad()) s.requires_grad_(true);  // its gradient is traced too (TraceResult::backward)
    const int v = new_value(ValueKind::input, s);
    g.values[size_t(v)].index = index;
    g.inputs.push_back(v);
    remember(s, v);
    return s;
  }

  void stop(const std::string& op, const std::string& reason) {
    SINTER_CHECK_T(CompileError, !opts_.fullgraph, "[compile] ", opts_.name, ": graph break at ", op, ": ", reason,
                   " (fullgraph is set)");
    throw Break{op, reason};
  }

  void before(const OpDef& op, std::span<const Tensor>, const Attrs&) override {
    if (op.data_dependent && !run_piece_) stop(op.name, "its output needs the input's data");
    if (op.data_dependent) pending_read_ = op.name;  // lazily: the read that follows is this op's
  }

  void after(const OpDef& op, std::span<const Tensor> inputs, const Attrs& attrs, std::span<const Tensor> outputs) override {
    Node n;
    n.op = &op;
    n.attrs = attrs;
    if (attrs.has("seed") && attrs.has("counter")) {  // a random draw: its counter becomes relative
      if (uint64_t(attrs.i("seed")) == start_.seed) n.random_offset = attrs.i("counter") - int64_t(start_.offset);
      else if (!run_piece_) stop(op.name, "the function reseeds the generator (manual_seed) before this draw");
      // (lazily, a reseeded draw keeps its seed and counter as constants of its piece)
    }
    for (const Tensor& t : inputs) n.inputs.push_back(value_of(t));
    const int node = int(g.nodes.size());
    for (size_t k = 0; k < outputs.size(); ++k) {
      const Tensor& o = outputs[k];
      const int v = new_value(ValueKind::node, o);
      Value& x = g.values[size_t(v)];
      x.node = node, x.output = int(k);
      const Effect e = op.view ? Effect{} : op.effects[k];
      if (e.kind != Effect::Kind::fresh) {  // written in place (a new version) or aliased: the input's buffer
        const int in = n.inputs[size_t(e.input)];
        x.base = g.buffer_of(in), x.offset = g.values[size_t(in)].offset;
        if (e.kind == Effect::Kind::writes) x.strides = g.values[size_t(in)].strides;
      } else if (op.view) {
        x.base = g.buffer_of(n.inputs[0]);
      }
      n.outputs.push_back(v);
      remember(o, v);
    }
    g.nodes.push_back(std::move(n));
  }

  // The value a tensor stands for: one the trace made or was given, a detached copy of one, or a
  // real tensor read for the first time (captured by reference).
  int value_of(const Tensor& t) {
    if (auto it = by_impl_.find(t.impl_ptr().get()); it != by_impl_.end()) return it->second;
    if (auto it = by_storage_.find(t.storage().get()); it != by_storage_.end())
      for (int v : it->second) {
        const Value& x = g.values[size_t(v)];
        if (x.meta.shape == t.shape() && x.strides == t.strides() && x.offset == t.offset() && x.meta.dtype == t.dtype()) {
          by_impl_[t.impl_ptr().get()] = v;
          keep_.emplace(t.impl_ptr().get(), t);  // as remember(): its address must not come back as another tensor's
          return v;
        }
      }
    if (t.is_symbolic())
      SINTER_THROW(CompileError, "[compile] ", opts_.name, ": a symbolic tensor of shape ", t.shape(),
                   " that the trace did not make (one made outside the function, or a view built by hand)");
    const int v = new_value(ValueKind::captured, t);
    g.values[size_t(v)].captured = t;
    g.values[size_t(v)].index = int(g.captured.size());
    g.captured.push_back(v);
    remember(t, v);
    return v;
  }

  // Lazy tracing: computes the values of the piece recorded so far that are still referenced
  // outside the tracer (by the function's variables, autograd's saved tensors, gradients), makes
  // those tensors real, and starts the next piece. `reason` names what needed the data.
  void flush(const std::string& reason) {
    // A buffer is live when a tensor the tracer made is referenced outside it, or when its storage
    // is: autograd saves outputs as detached copies, other tensors over the same storage.
    std::unordered_map<const Storage*, long> held;  // the tracer's own references to each storage
    for (auto& [impl, t] : keep_) ++held[t.storage().get()];
    std::map<int, std::shared_ptr<Storage>> live;  // a value in each live buffer -> its storage
    std::set<const Storage*> seen;
    for (auto& [impl, t] : keep_) {
      const int v = by_impl_.at(impl);
      if (!t.is_symbolic() || g.values[size_t(v)].kind != ValueKind::node) continue;
      const std::shared_ptr<Storage>& st = t.storage();
      const bool outside = t.impl_ptr().use_count() > 1 || st.use_count() > held[st.get()];
      if (outside && seen.insert(st.get()).second) live.emplace(v, st);
    }
    std::vector<std::shared_ptr<Storage>> storages;
    for (auto& [v, st] : live) g.outputs.push_back(v), storages.push_back(st);  // value order: equal pieces look equal
    if (!g.nodes.empty()) {
      g.random_blocks = default_generator().offset - start_.offset;
      verify(g);
      const std::vector<Tensor> computed = (*run_piece_)(g, start_.offset, reason);
      for (size_t i = 0; i < storages.size(); ++i) {
        Storage& s = *storages[i];
        s.data = computed[i].storage()->data;  // the whole buffer: the tensors' offsets are into it
        s.nbytes = computed[i].storage()->nbytes;
        s.symbolic = false;
        s.deleter = [keep = computed[i].storage()](void*) {};  // the computed buffer lives as long as this storage
      }
    }
    g = Graph{};
    pending_read_.clear();
    by_impl_.clear(), by_storage_.clear(), keep_.clear();
    start_ = default_generator();
  }
  bool lazy() const { return run_piece_ != nullptr; }

  Graph g;
  Generator start_;  // the generator's state when the trace (or lazily, the piece) began
  std::string pending_read_;  // lazily: a data-dependent op of this piece (item), for the break's reason

 private:
  int new_value(ValueKind kind, const Tensor& t) {
    Value x;
    x.kind = kind;
    x.meta = {t.shape(), t.dtype(), t.device()};
    x.strides = t.strides();
    x.offset = t.offset();
    g.values.push_back(std::move(x));
    return int(g.values.size()) - 1;
  }
  void remember(const Tensor& t, int v) {
    by_impl_[t.impl_ptr().get()] = v;
    keep_.emplace(t.impl_ptr().get(), t);  // keeps the impl alive, so its address is not reused during the trace
    by_storage_[t.storage().get()].push_back(v);
  }

  const CompileOptions& opts_;
  const RunPiece* run_piece_;  // lazy tracing: computes a piece (null: one whole trace)
  std::unordered_map<const TensorImpl*, int> by_impl_;
  std::unordered_map<const Storage*, std::vector<int>> by_storage_;
  std::unordered_map<const TensorImpl*, Tensor> keep_;  // one reference per tensor the trace saw
};

// While tracing, reading a traced tensor's data stops the trace; lazily, it computes the piece
// recorded so far.
struct DataReadsBreak {
  explicit DataReadsBreak(Tracer& t) : prev(detail::g_materialize) {
    detail::g_materialize = [&t](const Tensor& x) {
      if (!t.lazy()) t.stop("data read", "the function reads a traced tensor's values (shape " + shape_text(x) + ")");
      t.flush(!t.pending_read_.empty() ? t.pending_read_ + ": the function reads its output's value"
                                       : "data read: the function reads a tensor's values (shape " + shape_text(x) + ")");
    };
  }
  ~DataReadsBreak() { detail::g_materialize = prev; }
  static std::string shape_text(const Tensor& x) {
    std::ostringstream os;
    os << x.shape();
    return os.str();
  }
  std::function<void(const Tensor&)> prev;
};

// Outputs that require grad: their backward is traced too, from symbolic output gradients (graph
// inputs after the function's own) to the gradients of every input and captured tensor that
// requires grad. A function that already ran its backward (a training step) has released that
// graph: then nothing is added and its outputs stay detached.
void trace_backward(Tracer& t, const std::vector<Tensor>& stand_ins, const std::vector<Tensor>& outs, TraceResult& r) {
  std::vector<Tensor> diff;
  for (size_t k = 0; k < outs.size(); ++k)
    if (outs[k].requires_grad() && outs[k].grad_fn()) diff.push_back(outs[k]), r.backward.outputs.push_back(int(k));
  if (diff.empty()) return;
  std::vector<Tensor> leaves;
  for (size_t i = 0; i < stand_ins.size(); ++i)
    if (stand_ins[i].requires_grad()) leaves.push_back(stand_ins[i]), r.backward.leaves.push_back({true, int(i)});
  for (int v : t.g.captured)
    if (t.g.values[size_t(v)].captured.requires_grad())
      leaves.push_back(t.g.values[size_t(v)].captured), r.backward.leaves.push_back({false, t.g.values[size_t(v)].index});
  if (leaves.empty()) return r.backward.outputs.clear();
  const size_t nodes = t.g.nodes.size(), values = t.g.values.size();
  std::vector<Tensor> grad_outs;
  for (size_t k = 0; k < diff.size(); ++k) {
    const Tensor go = Tensor::symbolic(diff[k].shape(), diff[k].dtype(), diff[k].device());
    grad_outs.push_back(t.add_input(go, int(stand_ins.size() + k)));
  }
  std::vector<Tensor> grads;
  try {
    grads = autograd::grad(diff, leaves, grad_outs, false, false, /*allow_unused=*/true);
  } catch (const AutogradError&) {  // released by the function's own backward
    t.g.nodes.resize(nodes), t.g.values.resize(values), t.g.inputs.resize(stand_ins.size());
    r.backward = {};
    return;
  }
  r.backward.forward_nodes = int(nodes);
  for (const Tensor& gr : grads) r.backward.grads.push_back(gr.defined() ? t.value_of(gr) : -1);
}

}  // namespace

// A backward the function runs (loss.backward()) leaves gradients on captured leaves (the
// parameters): each becomes an output after the function's own, and each call hands it to its
// leaf (CompiledFunction::operator()): set, where the function cleared the leaf's gradient first
// (zero_grad() inside), else added to what the leaf holds then, as eager's backward does. A
// backward adding to a gradient the leaf held when traced stops the trace: the function then
// runs in pieces. Leaves the function clears and leaves without a gradient are cleared by each
// call too.
struct LeafGradients {
  explicit LeafGradients(Tracer& t) : prev_accumulate(detail::g_accumulate_traced), prev_cleared(detail::g_grad_cleared) {
    detail::g_accumulate_traced = [&t](const Tensor&) {
      if (!t.lazy()) t.stop("backward", "it adds to a gradient a parameter already holds (zero_grad() inside the function avoids it)");
    };
    detail::g_grad_cleared = [this](const Tensor& leaf) {
      cleared.emplace(leaf.impl_ptr().get(), leaf);
    };
  }
  ~LeafGradients() { detail::g_accumulate_traced = prev_accumulate, detail::g_grad_cleared = prev_cleared; }
  std::function<void(const Tensor&)> prev_accumulate, prev_cleared;
  std::map<const void*, Tensor> cleared;  // the leaves the function called set_grad({}) on
};

void add_leaf_gradients(Tracer& t, const std::vector<Tensor>& stand_ins, const LeafGradients& seen, TraceResult& r) {
  std::set<const void*> handed;
  auto hand = [&](const Tensor& leaf, LeafGrad g) {  // leaf: a captured tensor, or an input's stand-in
    if (!leaf.grad().defined() || !leaf.grad().is_symbolic()) return;
    const int v = t.value_of(leaf.grad());
    g.cleared = seen.cleared.count(leaf.impl_ptr().get()) > 0;
    for (const Node& n : t.g.nodes)
      if (std::find(n.inputs.begin(), n.inputs.end(), v) != n.inputs.end()) g.read = true;
    r.leaf_grads.push_back(g);
    t.g.outputs.push_back(v);
    handed.insert(leaf.impl_ptr().get());
  };
  for (int v : t.g.captured) hand(t.g.values[size_t(v)].captured, {t.g.values[size_t(v)].captured});
  for (size_t i = 0; i < stand_ins.size(); ++i) hand(stand_ins[i], {.leaf = {}, .input = int(i)});
  for (const auto& [impl, leaf] : seen.cleared)
    if (!handed.count(impl) && !leaf.is_symbolic()) r.leaves_cleared.push_back(leaf);
}

TraceResult trace(const TensorFn& fn, const std::vector<Tensor>& inputs, const CompileOptions& opts) {
  Tracer t(opts);
  std::vector<Tensor> stand_ins;
  for (size_t i = 0; i < inputs.size(); ++i) {
    SINTER_CHECK(inputs[i].defined(), "[compile] ", opts.name, ": input ", i, " is an undefined tensor");
    stand_ins.push_back(t.add_input(inputs[i], int(i)));
  }
  TraceResult r;
  std::vector<Tensor> outs;
  {
    ObserveScope scope(&t);
    DataReadsBreak reads(t);
    LeafGradients leaf_grads(t);
    try {
      outs = fn(stand_ins);
      for (const Tensor& o : outs) t.g.outputs.push_back(t.value_of(o));
      if (grad_enabled()) trace_backward(t, stand_ins, outs, r);
      add_leaf_gradients(t, stand_ins, leaf_grads, r);
      if (!r.leaf_grads.empty() && r.backward.forward_nodes >= 0)
        t.stop("backward", "it leaves gradients on parameters and returns outputs that require grad");
    } catch (const Break& b) {
      r.broke = true, r.break_op = b.op, r.break_reason = b.reason;
    }
  }
  // Tracing reserved the draws of one call; the calls themselves reserve them (compiled.cpp).
  t.g.random_blocks = default_generator().offset - t.start_.offset;
  default_generator() = t.start_;
  // A traced backward leaves symbolic gradients on the tensors it captured: not for the caller.
  for (int v : t.g.captured) {
    Tensor& c = t.g.values[size_t(v)].captured;
    if (c.grad().defined() && c.grad().is_symbolic()) c.set_grad({});
  }
  r.graph = std::move(t.g);
  if (!r.broke) verify(r.graph);
  return r;
}

std::vector<Tensor> trace_lazily(const TensorFn& fn, const std::vector<Tensor>& inputs, const CompileOptions& opts,
                                 const RunPiece& run_piece) {
  Tracer t(opts, &run_piece);
  std::vector<Tensor> outs;
  {
    ObserveScope scope(&t);
    DataReadsBreak reads(t);
    outs = fn(inputs);
    t.flush("");
  }
  return outs;
}

}  // namespace compiler
}  // namespace sinter

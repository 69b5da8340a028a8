// CompiledFunction: guards, tracing on a miss, the compile pipeline, and calls of the wrapper on
// preplanned buffers. Library kernels run through the op table's CPU kernel of their node, called
// with tensors built once over per-slot storages whose addresses are set at each call.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <unordered_map>

#include "compiler/codegen.h"
#include "compiler/jit.h"
#include "compiler/passes.h"
#include "compiler/trace.h"
#include "autograd/node.h"
#include "sinter/autograd.h"
#include "sinter/compile.h"
#include "sinter/ops.h"
#include "sinter/random.h"

namespace sinter {

namespace compiler {
namespace {

// What a trace depended on, for one input.
struct InputGuard {
  Shape shape, strides;
  int64_t offset;
  DType dtype;
  Device device;
  bool requires_grad;
};

struct BackwardPart;

struct Entry {
  std::vector<InputGuard> guards;
  bool grad_mode;
  DType autocast;
  // Eager when the compiler failed (and fullgraph is off); lazy when the trace broke: each call
  // then traces lazily and runs the pieces between data reads compiled (State::pieces).
  bool eager = false, lazy = false;
  std::string break_op, break_reason;
  Graph graph;
  Plan plan;
  Slots slots;
  std::shared_ptr<JitModule> module;
  std::vector<int64_t> params;      // sizes, strides and offsets the generated code reads
  std::vector<std::shared_ptr<Storage>> slot_storage;  // non-owning: addresses set at each call
  struct ExternCall {
    const OpDef* op;
    const KernelFn* kernel;
    std::vector<Tensor> in, out;
    const Attrs* attrs;
  };
  std::vector<ExternCall> externs;  // by step (empty for fused steps)
  // Under op profiling (SINTER_PROFILE=1): library calls are listed as "op < compiled NAME", the
  // rest of the program's time as "fused kernels < compiled NAME".
  std::string profile_name;
  double extern_seconds = 0;
  std::vector<int> random_nodes;    // nodes whose seed and counter each call sets
  std::vector<std::string> guard_text;
  // Outputs that require grad: `graph` is the forward, returning the function's outputs and then
  // what the backward reads; each call attaches an autograd node that runs the backward program.
  std::shared_ptr<BackwardPart> backward;
};

struct BackwardPart {
  std::shared_ptr<Entry> entry;             // the backward program: (saved..., output grads...) -> leaf grads
  size_t outputs = 0;                       // the function's outputs (the forward returns more: the saved)
  std::vector<int> differentiated;          // which of them the backward takes gradients of
  std::vector<TracedBackward::Leaf> leaves;
  std::vector<Tensor> captured_leaves;      // by leaf: the captured tensor (undefined for an input)
  std::vector<int> grad_of_leaf;            // by leaf: its gradient among the backward's outputs, or -1
  std::shared_ptr<Tensor> arena = std::make_shared<Tensor>();
  int64_t saved_bytes = 0;                  // forward values kept for the backward (not inputs)
  size_t recomputed = 0;                    // forward nodes the backward computes again instead
};

// Splits a trace with a traced backward into the forward program's graph (in e.graph) and the
// backward's: the backward reads the forward values and inputs its nodes use (saved, returned by
// the forward after the function's outputs) and the output gradients; with `recompute`, cheap
// forward values are computed again by the backward instead (choose_recomputation).
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
  if (recompute) backward_nodes = choose_recomputation(g, nf, is_saved);
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


std::string guard_mismatch(const Entry& e, const std::vector<Tensor>& in) {
  if (in.size() != e.guards.size()) return std::to_string(in.size()) + " inputs, traced with " + std::to_string(e.guards.size());
  if (grad_enabled() != e.grad_mode) return "grad mode";
  if (autocast_dtype() != e.autocast) return "autocast dtype";
  for (size_t i = 0; i < in.size(); ++i) {
    const InputGuard& g = e.guards[i];
    const Tensor& t = in[i];
    std::ostringstream os;
    if (t.dtype() != g.dtype) os << "input " << i << " dtype " << t.dtype() << " (traced " << g.dtype << ")";
    else if (t.shape() != g.shape) os << "input " << i << " shape " << t.shape() << " (traced " << g.shape << ")";
    else if (t.strides() != g.strides || t.offset() != g.offset) os << "input " << i << " layout: strides " << t.strides() << " (traced " << g.strides << ")";
    else if (!(t.device() == g.device)) os << "input " << i << " device";
    else if (t.requires_grad() != g.requires_grad) os << "input " << i << " requires_grad";
    if (!os.str().empty()) return os.str();
  }
  return "";
}

bool guards_hold(const Entry& e, const std::vector<Tensor>& in) {
  if (in.size() != e.guards.size() || grad_enabled() != e.grad_mode || autocast_dtype() != e.autocast) return false;
  for (size_t i = 0; i < in.size(); ++i) {
    const InputGuard& g = e.guards[i];
    const TensorImpl& t = in[i].impl();
    if (t.dtype != g.dtype || t.offset != g.offset || t.shape != g.shape || t.strides != g.strides || !(t.device == g.device) ||
        t.requires_grad != g.requires_grad)
      return false;
  }
  return true;
}

Tensor over_slot(const Entry& e, const Graph& g, int v) {
  const Value& x = g.values[size_t(v)];
  int64_t offset = x.offset;
  const int64_t arena_at = e.plan.arena_offset[size_t(g.buffer_of(v))];
  if (arena_at >= 0) offset += arena_at / dtype_size(x.meta.dtype);  // arena offsets are 64-byte aligned
  return Tensor::from_storage(e.slot_storage[size_t(e.slots.of_value[size_t(v)])], x.meta.shape, x.strides, offset, x.meta.dtype);
}

void build(Entry& e, const CompileOptions& opts) {
  Graph& g = e.graph;
  const std::string name = opts.name + "_" + std::to_string(g.nodes.size());
  if (e.profile_name.empty()) e.profile_name = "compiled " + opts.name;
  debug_write(opts.name + ".graph.txt", dump(g));
  eliminate_common_subexpressions(g);  // (dead code too)
  fuse_gemm_epilogues(g);
  fuse_sibling_linears(g);
  absorb_layout_copies(g);
  verify(g);
  debug_write(opts.name + ".passes.txt", dump(g));
  e.plan = plan(g);
  e.slots = assign_slots(g, e.plan);
  const Generated code = generate_cpp(g, e.plan, e.slots, opts.name);
  debug_write(opts.name + ".cpp", code.source);
  e.module = jit_load(code.source, opts.name);
  e.params = code.params;
  for (int i = 0; i < e.slots.count; ++i) {
    auto s = std::make_shared<Storage>();
    s->device = Device{};
    e.slot_storage.push_back(s);
  }
  e.externs.resize(e.plan.steps.size());
  for (size_t i = 0; i < e.plan.steps.size(); ++i) {
    const Step& st = e.plan.steps[i];
    if (st.group >= 0) continue;
    const Node& n = g.nodes[size_t(st.node)];
    if (n.random_offset >= 0) e.random_nodes.push_back(st.node);
    Entry::ExternCall& c = e.externs[i];
    c.op = n.op;
    c.kernel = &n.op->kernels[size_t(DeviceType::cpu)];
    SINTER_CHECK_T(CompileError, *c.kernel != nullptr, "[compile] ", n.op->name, " has no CPU kernel");
    c.attrs = &n.attrs;
    for (int v : n.inputs) c.in.push_back(over_slot(e, g, v));
    for (int v : n.outputs) c.out.push_back(over_slot(e, g, v));
  }
}

void call_extern(void* ctx, int step) {
  Entry& e = *static_cast<Entry*>(ctx);
  Entry::ExternCall& c = e.externs[size_t(step)];
  if (op_profiling()) {
    const auto t0 = std::chrono::steady_clock::now();
    (*c.kernel)(c.in, c.out, *c.attrs);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    record_op_time(c.op->name + " < " + e.profile_name, s);
    e.extern_seconds += s;
  } else {
    (*c.kernel)(c.in, c.out, *c.attrs);
  }
  if (c.op->mutates)
    for (Tensor& t : c.out) ++t.storage()->version;
}

// `arena` is the function's, shared by its entries (one call at a time) and grown to the largest.
// A lazily traced piece passes its captured tensors (by captured number) and the generator offset
// its draws were reserved at.
std::vector<Tensor> run(Entry& e, const std::vector<Tensor>& inputs, Tensor& arena, const std::vector<Tensor>* captured = nullptr,
                        const uint64_t* random_base = nullptr) {
  auto captured_tensor = [&](const Value& x) -> const Tensor& { return captured ? (*captured)[size_t(x.index)] : x.captured; };
  const Graph& g = e.graph;
  std::vector<char*> slots(size_t(e.slots.count), nullptr);
  std::vector<Tensor> fresh(size_t(e.slots.count));
  auto set = [&](int slot, void* p, int64_t nbytes) {
    slots[size_t(slot)] = static_cast<char*>(p);
    e.slot_storage[size_t(slot)]->data = p;
    e.slot_storage[size_t(slot)]->nbytes = nbytes;
  };
  for (int v : g.inputs) {
    const Tensor& t = inputs[size_t(g.values[size_t(v)].index)];
    set(e.slots.of_value[size_t(v)], t.storage()->data, t.storage()->nbytes);
  }
  for (int v : g.captured) {
    const Tensor& t = captured_tensor(g.values[size_t(v)]);
    set(e.slots.of_value[size_t(v)], t.storage()->data, t.storage()->nbytes);
  }
  for (size_t v = 0; v < g.values.size(); ++v) {
    const Value& x = g.values[v];
    if (!e.plan.fresh[v]) continue;
    const int slot = e.slots.of_value[v];
    if (fresh[size_t(slot)].defined()) continue;
    fresh[size_t(slot)] = Tensor::empty({x.meta.shape.numel() * dtype_size(x.meta.dtype)}, DType::u8);
    set(slot, fresh[size_t(slot)].storage()->data, fresh[size_t(slot)].storage()->nbytes);
  }
  // Random draws take this call's seed and counters, as eager calls would.
  if (g.random_blocks > 0) {
    Generator& gen = default_generator();
    const uint64_t at = random_base ? *random_base : gen.reserve(g.random_blocks);
    for (int n : e.random_nodes) {
      Attrs& a = e.graph.nodes[size_t(n)].attrs;
      a.set("seed", int64_t(gen.seed));
      a.set("counter", int64_t(at) + e.graph.nodes[size_t(n)].random_offset);
    }
  }
  if (e.plan.arena_bytes > 0 && (!arena.defined() || arena.numel() < e.plan.arena_bytes))
    arena = Tensor::empty({e.plan.arena_bytes}, DType::u8);
  if (e.slots.arena >= 0) set(e.slots.arena, e.plan.arena_bytes > 0 ? arena.storage()->data : nullptr, e.plan.arena_bytes);
  if (op_profiling()) {
    e.extern_seconds = 0;
    const auto t0 = std::chrono::steady_clock::now();
    e.module->run(slots.data(), e.params.data(), call_extern, &e);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    record_op_time("fused kernels < " + e.profile_name, s - e.extern_seconds);
  } else {
    e.module->run(slots.data(), e.params.data(), call_extern, &e);
  }
  std::vector<Tensor> out;
  for (int v : g.outputs) {
    const Value& x = g.values[size_t(v)];
    const int b = g.buffer_of(v);
    const Value& base = g.values[size_t(b)];
    std::shared_ptr<Storage> storage = base.kind == ValueKind::input      ? inputs[size_t(base.index)].storage()
                                       : base.kind == ValueKind::captured ? captured_tensor(base).storage()
                                                                          : fresh[size_t(e.slots.of_value[size_t(b)])].storage();
    out.push_back(Tensor::from_storage(storage, x.meta.shape, x.strides, x.offset, x.meta.dtype));
  }
  return out;
}

// Runs the forward and attaches the backward: one autograd node per call, owning the op that runs
// the backward program on this call's saved tensors.
std::vector<Tensor> run_with_backward(Entry& e, const std::vector<Tensor>& inputs, Tensor& arena, const std::string& name) {
  std::vector<Tensor> all = run(e, inputs, arena);
  const std::shared_ptr<BackwardPart> part = e.backward;
  std::vector<Tensor> outs(all.begin(), all.begin() + long(part->outputs));
  auto saved = std::make_shared<std::vector<Tensor>>(all.begin() + long(part->outputs), all.end());
  std::vector<Tensor> leaves;
  std::vector<TensorMeta> meta;
  for (size_t i = 0; i < part->leaves.size(); ++i) {
    leaves.push_back(part->leaves[i].input ? inputs[size_t(part->leaves[i].index)] : part->captured_leaves[i]);
    meta.push_back({leaves.back().shape(), leaves.back().dtype(), leaves.back().device()});
  }
  auto op = std::make_shared<OpDef>();
  op->name = "compiled backward of " + name;
  op->num_inputs = int(leaves.size());
  op->num_outputs = int(part->differentiated.size());
  op->save_inputs = 0;
  op->backward = [part, saved](BackwardCtx& ctx) {
    std::vector<Tensor> in = *saved;
    for (const Tensor& g : ctx.grads) in.push_back(g.contiguous());
    const std::vector<Tensor> grads = run(*part->entry, in, *part->arena);
    std::vector<Tensor> out;
    for (int k : part->grad_of_leaf) out.push_back(k < 0 ? Tensor() : grads[size_t(k)]);
    return out;
  };
  std::vector<Tensor> diff;
  for (int k : part->differentiated) diff.push_back(outs[size_t(k)]);
  autograd::attach(*op, {}, leaves, meta, diff);
  for (const Tensor& d : diff)
    if (d.grad_fn()) d.grad_fn()->owner = op;  // the node keeps its op (and the saved tensors) alive
  return outs;
}

// A piece run op by op through the op table (its compile failed, or the function is past its
// recompile limit): what eager execution does, on the piece's recorded calls.
std::vector<Tensor> interpret(const Graph& g) {
  ObserveScope plain(nullptr);
  NoGradGuard no_grad;  // autograd was recorded as nodes of the trace
  std::vector<Tensor> val(g.values.size());
  for (int v : g.captured) val[size_t(v)] = g.values[size_t(v)].captured;
  for (const Node& n : g.nodes) {
    std::vector<Tensor> in;
    for (int v : n.inputs) in.push_back(val[size_t(v)]);
    std::vector<Tensor> out = call(*n.op, std::move(in), n.attrs);
    for (size_t k = 0; k < out.size(); ++k) val[size_t(n.outputs[k])] = out[k];
  }
  std::vector<Tensor> out;
  for (int v : g.outputs) out.push_back(val[size_t(v)]);
  return out;
}

// What makes two lazily traced pieces the same program: ops, attributes (a draw's seed and
// counter aside: each call sets them), wiring, and every value's dtype and layout.
std::string piece_key(const Graph& g) {
  std::string k;
  auto put = [&k](const auto& x) { k.append(reinterpret_cast<const char*>(&x), sizeof x); };
  auto layout = [&](const Value& x) {
    put(x.meta.dtype), put(x.offset), put(x.meta.shape.size());
    for (size_t i = 0; i < x.meta.shape.size(); ++i) put(x.meta.shape[i]), put(x.strides[i]);
  };
  for (int v : g.captured) put(v), layout(g.values[size_t(v)]);
  for (const Node& n : g.nodes) {
    put(n.op), put(n.random_offset);
    if (n.random_offset >= 0) {
      Attrs a = n.attrs;
      a.set("seed", int64_t(0)), a.set("counter", int64_t(0));
      put(a.hash());
    } else {
      put(n.attrs.hash());
    }
    for (int v : n.inputs) put(v);
    for (int v : n.outputs) put(v), layout(g.values[size_t(v)]);
  }
  for (int v : g.outputs) put(v);
  return k;
}

}  // namespace
}  // namespace compiler

struct CompiledFunction::State {
  TensorFn fn;
  CompileOptions opts;
  std::vector<std::unique_ptr<compiler::Entry>> entries;
  int traces = 0;
  // Traces that made new code or broke: what the recompile limit counts. A trace at new sizes
  // whose code is already loaded (the generated source does not depend on sizes) costs only the
  // trace, so it does not count; kMaxEntries bounds those.
  int specializations = 0;
  static constexpr size_t kMaxEntries = 1024;
  std::vector<const compiler::JitModule*> programs;  // distinct compiled programs
  compiler::Entry* last_hit = nullptr;
  Tensor arena;  // the entries' intermediate buffers (one call at a time)
  bool warned = false;
  std::string last_miss;
  // A function whose trace broke runs lazily: its pieces, by structure, and what the last call ran.
  std::unordered_map<std::string, std::unique_ptr<compiler::Entry>> pieces;
  std::vector<const compiler::Entry*> last_pieces;  // null: run op by op
  std::vector<std::string> last_breaks;

  // Compiles a new program where the recompile limit allows, warning once when it does not.
  bool may_compile() {
    if (specializations < opts.recompile_limit && entries.size() + pieces.size() < kMaxEntries) return true;
    if (!warned)
      std::fprintf(stderr, "sinter::compile: '%s' reached its recompile limit (%d); running %s eagerly from now on%s%s\n",
                   opts.name.c_str(), opts.recompile_limit, pieces.empty() ? "it" : "its new pieces",
                   last_miss.empty() ? "" : " (guard that kept failing: ", last_miss.empty() ? "" : (last_miss + ")").c_str());
    warned = true;
    return false;
  }
  void count_program(const compiler::Entry& e) {
    const bool new_program = !e.eager && std::find(programs.begin(), programs.end(), e.module.get()) == programs.end();
    if (new_program) programs.push_back(e.module.get());
    if (new_program || e.eager) ++specializations;
  }
  // Builds an entry's program; a failing compiler makes it eager (or, with fullgraph, throws).
  void build(compiler::Entry& e) {
    try {
      compiler::build(e, opts);
    } catch (const CompileError& err) {
      if (opts.fullgraph) throw;
      std::fprintf(stderr, "sinter::compile: %s: %s\nsinter::compile: running '%s' eagerly\n", opts.name.c_str(), err.what(),
                   opts.name.c_str());
      e.eager = true, e.break_reason = "the compiler failed";
    }
  }

  std::vector<Tensor> run_piece(compiler::Graph& g, uint64_t random_base, const std::string& reason) {
    // A piece of scalars only (the host reading a second value the previous piece computed) runs
    // op by op: no program, and no break between the pieces that do the work.
    bool scalars = true;
    for (const compiler::Node& n : g.nodes)
      for (int v : n.outputs) scalars = scalars && g.values[size_t(v)].meta.shape.numel() <= 1;
    if (scalars) return compiler::interpret(g);
    if (!reason.empty()) last_breaks.push_back(reason);
    const std::string key = compiler::piece_key(g);
    compiler::Entry* e = nullptr;
    if (auto it = pieces.find(key); it != pieces.end()) {
      e = it->second.get();
    } else if (may_compile()) {
      auto en = std::make_unique<compiler::Entry>();
      en->graph = g;
      build(*en);
      for (int v : en->graph.captured) en->graph.values[size_t(v)].captured = Tensor();  // this call's, not every call's
      count_program(*en);
      e = pieces.emplace(key, std::move(en)).first->second.get();
    }
    last_pieces.push_back(e);
    if (!e || e->eager) return compiler::interpret(g);
    std::vector<Tensor> captured(g.captured.size());
    for (int v : g.captured) captured[size_t(g.values[size_t(v)].index)] = g.values[size_t(v)].captured;
    return compiler::run(*e, {}, arena, &captured, &random_base);
  }

  std::vector<Tensor> run_lazily(const std::vector<Tensor>& in) {
    last_pieces.clear(), last_breaks.clear();
    return compiler::trace_lazily(fn, in, opts, [this](compiler::Graph& g, uint64_t base, const std::string& reason) {
      return run_piece(g, base, reason);
    });
  }

  compiler::Entry* find(const std::vector<Tensor>& in) {
    if (last_hit && compiler::guards_hold(*last_hit, in)) return last_hit;
    for (auto& e : entries)
      if (compiler::guards_hold(*e, in)) return last_hit = e.get();
    if (!entries.empty()) last_miss = compiler::guard_mismatch(*entries.back(), in);
    return nullptr;
  }

  compiler::Entry* make(const std::vector<Tensor>& in) {
    auto e = std::make_unique<compiler::Entry>();
    for (const Tensor& t : in) e->guards.push_back({t.shape(), t.strides(), t.offset(), t.dtype(), t.device(), t.requires_grad()});
    e->grad_mode = grad_enabled();
    e->autocast = autocast_dtype();
    for (size_t i = 0; i < in.size(); ++i) {
      std::ostringstream os;
      os << "input " << i << ": " << in[i].dtype() << in[i].shape() << " strides " << in[i].strides()
         << (in[i].requires_grad() ? " requires_grad" : "");
      e->guard_text.push_back(os.str());
    }
    e->guard_text.push_back(std::string("grad mode ") + (e->grad_mode ? "on" : "off") + ", autocast " + dtype_name(e->autocast));
    if (!last_miss.empty()) compiler::debug_write(opts.name + ".guard_miss.txt", "recompiling: guard failed on " + last_miss + "\n");
    ++traces;
    compiler::TraceResult r = compiler::trace(fn, in, opts);
    if (r.broke) {
      e->lazy = true, e->break_op = r.break_op, e->break_reason = r.break_reason;
    } else {
      if (r.backward.forward_nodes >= 0) compiler::split_backward(*e, r, in.size(), opts.recompute);
      else e->graph = std::move(r.graph);
      build(*e);
      count_program(*e);
      if (e->backward && !e->eager) {
        e->backward->entry->profile_name = "compiled " + opts.name + " (backward)";
        build(*e->backward->entry);
        count_program(*e->backward->entry);
        if (e->backward->entry->eager) e->eager = true;  // the function runs eagerly, autograd and all
      }
    }
    entries.push_back(std::move(e));
    return last_hit = entries.back().get();
  }
};

CompiledFunction::CompiledFunction(TensorFn fn, CompileOptions opts) : s_(std::make_unique<State>()) {
  s_->fn = std::move(fn);
  s_->opts = std::move(opts);
}
CompiledFunction::~CompiledFunction() = default;
CompiledFunction::CompiledFunction(CompiledFunction&&) noexcept = default;
CompiledFunction& CompiledFunction::operator=(CompiledFunction&&) noexcept = default;

int CompiledFunction::compiles() const { return int(s_->programs.size()); }
int CompiledFunction::traces() const { return s_->traces; }

namespace {
void check_dynamic(const CompileOptions& o, const std::vector<Tensor>& in) {
  for (const DynamicDim& d : o.dynamic) {
    SINTER_CHECK_T(ValueError, d.input >= 0 && size_t(d.input) < in.size(), "[compile] ", o.name, ": dynamic dim names input ", d.input,
                   " of ", in.size());
    const Tensor& t = in[size_t(d.input)];
    SINTER_CHECK_T(ValueError, d.dim >= 0 && d.dim < t.dim(), "[compile] ", o.name, ": dynamic dim ", d.dim, " of input ", d.input,
                   ", which has shape ", t.shape());
    SINTER_CHECK_T(ValueError, t.size(d.dim) >= d.min && t.size(d.dim) <= d.max, "[compile] ", o.name, ": input ", d.input,
                   " dim ", d.dim, " is ", t.size(d.dim), ", outside its declared range [", d.min, ", ", d.max, "]");
  }
}
}  // namespace

std::vector<Tensor> CompiledFunction::operator()(const std::vector<Tensor>& inputs) {
  check_dynamic(s_->opts, inputs);
  compiler::Entry* e = s_->find(inputs);
  if (!e) {
    if (!s_->may_compile()) return s_->fn(inputs);
    e = s_->make(inputs);
  }
  if (e->lazy) return s_->run_lazily(inputs);
  if (e->eager) return s_->fn(inputs);
  if (e->backward) return compiler::run_with_backward(*e, inputs, s_->arena, s_->opts.name);
  return compiler::run(*e, inputs, s_->arena);
}

Explanation CompiledFunction::explain(const std::vector<Tensor>& inputs) {
  check_dynamic(s_->opts, inputs);
  compiler::Entry* e = s_->find(inputs);
  if (!e) e = s_->make(inputs);
  Explanation x;
  x.graphs = s_->traces;
  x.compiles = int(s_->programs.size());
  {  // What each call spends choosing its compiled code: the guard checks, timed over many calls.
    const int reps = 2000;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) e = s_->find(inputs);
    x.guard_check_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps;
  }
  for (auto& en : s_->entries)
    if (en->lazy) ++x.breaks, x.break_reasons.push_back(en->break_op + ": " + en->break_reason);
  x.guards = e->guard_text;
  for (const DynamicDim& d : s_->opts.dynamic)
    x.guards.push_back("input " + std::to_string(d.input) + " dim " + std::to_string(d.dim) + " dynamic in [" + std::to_string(d.min) + ", " +
                       (d.max == INT64_MAX ? std::string("inf") : std::to_string(d.max)) + "]");
  // A lazily run function: the pieces of its last call, each with its kernels.
  std::vector<const compiler::Entry*> shown{e};
  if (e->lazy && !s_->last_pieces.empty()) {
    shown = s_->last_pieces;
    x.graphs = int(shown.size());
    if (!s_->last_breaks.empty()) x.breaks = int(s_->last_breaks.size()), x.break_reasons = s_->last_breaks;
  }
  std::ostringstream os;
  os << "compiled function '" << s_->opts.name << "': " << x.graphs << (e->lazy ? " piece(s) in its last call" : " graph(s) traced")
     << ", " << x.compiles << " program(s) compiled, " << x.breaks << " graph break(s)\n";
  for (const std::string& b : x.break_reasons) os << "  break at " << b << "\n";
  if (e->lazy && s_->last_pieces.empty()) {
    os << "  runs lazily, in pieces between data reads: call it to see them\n";
    shown.clear();
  }
  for (size_t i = 0; i < shown.size(); ++i) {
    const compiler::Entry* p = shown[i];
    if (e->lazy) os << "  piece " << i + 1 << ":";
    if (!p || p->eager) {
      os << (e->lazy ? " " : "  ") << "runs eagerly" << (p && !p->break_reason.empty() ? ": " + p->break_reason : std::string()) << "\n";
      continue;
    }
    if (e->lazy) os << "\n";
    const compiler::Graph& g = p->graph;
    int fused = int(p->plan.groups.size()), library = 0;
    for (const compiler::Step& st : p->plan.steps) {
      if (st.group >= 0) continue;
      ++library;
      const compiler::Node& n = g.nodes[size_t(st.node)];
      // A GEMM's epilogue: "linear_fused: bias + gelu_tanh + residual", "sparse24_linear: bias + silu".
      std::string what = n.op->name, parts;
      auto add = [&](const std::string& q) { parts += (parts.empty() ? "" : " + ") + q; };
      if (n.op->name == "linear_fused" || n.op->name == "sparse24_linear") {
        const std::string& act = n.attrs.str(n.op->name == "linear_fused" ? "act" : "activation");
        if (n.attrs.b("bias")) add("bias");
        if (act != "none") add(act);
        if (n.attrs.b_or("residual", false)) add("residual");
      }
      if (!parts.empty()) {
        what += ": " + parts;
        os << "    GEMM epilogue: " << what << "\n";
      }
      x.library.push_back(what);
    }
    for (const compiler::Group& gr : p->plan.groups) x.kernels.push_back(gr.ops), os << "    fused: " << gr.ops << "\n";
    x.fused_kernels += fused, x.library_calls += library;
    x.planned_bytes += p->plan.arena_bytes;
    x.unplanned_bytes += p->plan.unplanned_bytes;
    os << "  " << g.nodes.size() << " nodes -> " << fused << " fused kernels + " << library << " library calls\n";
    os << "  buffers: " << p->plan.arena_bytes << " bytes planned (" << p->plan.unplanned_bytes << " without reuse)\n";
    os << "  code: " << p->module->path << (p->module->from_cache ? " (from the cache)" : "") << "\n";
  }
  if (!e->lazy && e->backward) {
    x.saved_bytes = e->backward->saved_bytes, x.recomputed = int(e->backward->recomputed);
    os << "  backward: " << x.saved_bytes << " bytes of forward values kept for it, " << x.recomputed << " node(s) recomputed instead\n";
  }
  os << "  guards (checked in " << x.guard_check_us << " us per call):\n";
  for (const std::string& g : x.guards) os << "    " << g << "\n";
  x.text = os.str();
  return x;
}

CompiledFunction compile(TensorFn fn, CompileOptions opts) { return CompiledFunction(std::move(fn), std::move(opts)); }
Explanation explain(CompiledFunction& f, const std::vector<Tensor>& inputs) { return f.explain(inputs); }

}  // namespace sinter

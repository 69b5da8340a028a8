// Building a program (passes, plan, code, the JIT, the library calls bound to planned buffers) and
// running it: library kernels run through the op table's CPU kernel of their node, called with
// tensors built once over per-slot storages whose addresses are set at each call.
#include <chrono>
#include <future>
#include <set>

#include "compiler/compiled.h"
#include "compiler/user_kernel.h"
#include "autograd/node.h"
#include "sinter/autograd.h"
#include "sinter/random.h"

namespace sinter::compiler {

int64_t slot_offset(const Entry& e, int v) {
  const Value& x = e.graph.values[size_t(v)];
  const int64_t arena_at = e.plan.arena_offset[size_t(e.graph.buffer_of(v))];
  return x.offset + (arena_at >= 0 ? arena_at / dtype_size(x.meta.dtype) : 0);  // arena offsets are 64-byte aligned
}

namespace {
Tensor over_slot(const Entry& e, const Graph& g, int v) {
  const Value& x = g.values[size_t(v)];
  return Tensor::from_storage(e.slot_storage.storage[size_t(e.slots.of_value[size_t(v)])], x.meta.shape, x.strides, slot_offset(e, v),
                              x.meta.dtype);
}
}  // namespace

// Runs the passes the environment leaves on, then plans and generates the program.
Generated prepare(Entry& e, const CompileOptions& opts, const Target& t) {
  Graph& g = e.graph;
  const PassSet on = enabled_passes();
  const std::string& name = e.debug_name.empty() ? opts.name : e.debug_name;
  debug_write(name + ".graph.txt", dump(g));
  if (on.cse) eliminate_common_subexpressions(g);  // (dead code too)
  else eliminate_dead_code(g);
  if (on.epilogues) fuse_gemm_epilogues(g), fuse_user_epilogues(g);
  if (on.siblings) fuse_sibling_linears(g);
  if (on.layouts) absorb_layout_copies(g);
  verify(g);
  debug_write(name + ".passes.txt", dump(g));
  e.plan = plan(g, t, on.fuse);
  e.slots = assign_slots(g, e.plan);
  Generated code = generate(g, e.plan, e.slots, opts.name, t);
  debug_write(name + ".cpp", code.source);
  return code;
}

namespace {

// Prepares the program, then compiles it (and the user kernels it calls, side by side).
void compile_graph(Entry& e, const CompileOptions& opts, const Target& t) {
  const Generated code = prepare(e, opts, t);
  const Graph& g = e.graph;
  const std::string& name = e.debug_name.empty() ? opts.name : e.debug_name;
  // The user kernels the program calls compile in translation units of their own, beside its own.
  std::set<UserKernel*> kernels;
  for (const Node& n : g.nodes)
    if (UserKernel* k = user_kernel_of(n.op)) kernels.insert(k);
  std::vector<std::future<void>> pending;
  for (UserKernel* k : kernels) pending.push_back(std::async(std::launch::async, [k] { (void)user_kernel_code(*k); }));
  e.module = jit_load(code.source, name);
  for (std::future<void>& f : pending) f.get();
  e.params = code.params;
}

// The library calls of the program: each node's CPU kernel on tensors built once over the slots.
void bind_externs(Entry& e) {
  const Graph& g = e.graph;
  e.slot_storage.resize(size_t(e.slots.count));
  e.externs.resize(e.plan.steps.size());
  for (size_t i = 0; i < e.plan.steps.size(); ++i) {
    const Step& st = e.plan.steps[i];
    if (st.group >= 0) continue;
    const Node& n = g.nodes[size_t(st.node)];
    if (n.random_offset >= 0) e.random_nodes.push_back(st.node);
    runtime::ExternCall& c = e.externs[i];
    c.op = n.op->name;
    c.kernel = &n.op->kernels[size_t(DeviceType::cpu)];
    SINTER_CHECK_T(CompileError, *c.kernel != nullptr, "[compile] ", n.op->name, " has no CPU kernel");
    c.attrs = &n.attrs;
    for (int v : n.inputs) c.in.push_back(over_slot(e, g, v));
    for (int v : n.outputs) c.out.push_back(over_slot(e, g, v));
    for (size_t k = 0; k < n.outputs.size(); ++k) c.writes.push_back(n.op->mutates && n.op->effects[k].kind == Effect::Kind::writes);
  }
}

}  // namespace

void build(Entry& e, const CompileOptions& opts) {
  if (e.profile_name.empty()) e.profile_name = "compiled " + opts.name;
  compile_graph(e, opts, cpp_target());
  bind_externs(e);
}

namespace {
void call_extern(void* ctx, int step) {
  Entry& e = *static_cast<Entry*>(ctx);
  runtime::ExternCall& c = e.externs[size_t(step)];
  if (op_profiling()) {
    const auto t0 = std::chrono::steady_clock::now();
    runtime::run_extern(c);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    record_op_time(c.op + " < " + e.profile_name, s);
    e.extern_seconds += s;
  } else {
    runtime::run_extern(c);
  }
}
}  // namespace

std::vector<Tensor> run(Entry& e, const std::vector<Tensor>& inputs, Tensor& arena, const std::vector<Tensor>* captured,
                        const uint64_t* random_base) {
  auto captured_tensor = [&](const Value& x) -> const Tensor& { return captured ? (*captured)[size_t(x.index)] : x.captured; };
  const Graph& g = e.graph;
  std::vector<char*> slots(size_t(e.slots.count), nullptr);
  std::vector<Tensor> fresh(size_t(e.slots.count));
  auto set = [&](int slot, void* p, int64_t nbytes) { e.slot_storage.set(size_t(slot), p, nbytes, slots.data()); };
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

// A piece runs op by op through the op table when its compile failed or the function is past its
// recompile limit: what eager execution does, on the piece's recorded calls.
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

}  // namespace sinter::compiler

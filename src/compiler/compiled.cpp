// CompiledFunction: finds the entry whose guards hold, traces on a miss (splitting off a traced
// backward), builds programs within the recompile limit, and runs them; a trace that broke runs
// lazily, its pieces compiled once per structure.
#include <algorithm>
#include <future>

#include "compiler/compiled.h"
#include "sinter/autograd.h"
#include "sinter/ops.h"

namespace sinter {

void CompiledFunction::State::warn(const std::string& message) {
  warnings.push_back(message);
  sinter::warn(message);
}

// Compiles a new program where the recompile limit allows, warning once when it does not.
bool CompiledFunction::State::may_compile() {
  if (specializations < opts.recompile_limit && entries.size() + pieces.size() < kMaxEntries) return true;
  if (!warned)
    warn("sinter::compile: '" + opts.name + "' reached its recompile limit (" + std::to_string(opts.recompile_limit) + "); running " +
         (pieces.empty() ? "it" : "its new pieces") + " eagerly from now on" +
         (last_miss.empty() ? std::string() : " (guard that kept failing: " + last_miss + ")"));
  warned = true;
  return false;
}

void CompiledFunction::State::count_program(const compiler::Entry& e) {
  const bool new_program = !e.eager && std::find(programs.begin(), programs.end(), e.module.get()) == programs.end();
  if (new_program) programs.push_back(e.module.get());
  if (new_program || e.eager) ++specializations;
}

// Builds an entry's program; a failing compiler makes it eager (or, with fullgraph, throws).
void CompiledFunction::State::build(compiler::Entry& e) {
  try {
    compiler::build(e, opts);
  } catch (const CompileError& err) {
    if (opts.fullgraph) throw;
    warn("sinter::compile: " + opts.name + ": " + err.what() + "\nsinter::compile: running '" + opts.name + "' eagerly");
    e.eager = true, e.break_reason = "the compiler failed";
  }
}

// The forward program, and the backward one (if any) in parallel with it; a backward that fails
// to compile makes the function eager, autograd and all.
void CompiledFunction::State::build_both(compiler::Entry& e) {
  std::future<std::string> backward;
  if (e.backward) {
    compiler::Entry& b = *e.backward->entry;
    b.profile_name = "compiled " + opts.name + " (backward)", b.debug_name = opts.name + ".backward";
    backward = std::async(std::launch::async, [&b, this]() -> std::string {
      try {
        compiler::build(b, opts);
        return "";
      } catch (const CompileError& err) {
        return err.what();
      }
    });
  }
  build(e);
  count_program(e);
  if (!e.backward) return;
  const std::string failed = backward.get();
  if (e.eager) return;
  compiler::Entry& b = *e.backward->entry;
  if (!failed.empty()) {
    if (opts.fullgraph) throw CompileError(failed);
    warn("sinter::compile: " + opts.name + " (backward): " + failed + "\nsinter::compile: running '" + opts.name + "' eagerly");
    b.eager = true, b.break_reason = "the compiler failed";
  }
  count_program(b);
  if (b.eager) e.eager = true;  // the function runs eagerly, autograd and all
}

std::vector<Tensor> CompiledFunction::State::run_piece(compiler::Graph& g, uint64_t random_base, const std::string& reason) {
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

std::vector<Tensor> CompiledFunction::State::run_lazily(const std::vector<Tensor>& in) {
  last_pieces.clear(), last_breaks.clear();
  return compiler::trace_lazily(fn, in, opts, [this](compiler::Graph& g, uint64_t base, const std::string& reason) {
    return run_piece(g, base, reason);
  });
}

compiler::Entry* CompiledFunction::State::find(const std::vector<Tensor>& in) {
  if (last_hit && compiler::guards_hold(*last_hit, in)) return last_hit;
  for (auto& e : entries)
    if (compiler::guards_hold(*e, in)) return last_hit = e.get();
  if (!entries.empty()) last_miss = compiler::guard_mismatch(*entries.back(), in);
  return nullptr;
}

compiler::Entry* CompiledFunction::State::make(const std::vector<Tensor>& in) {
  auto e = std::make_unique<compiler::Entry>();
  compiler::set_guards(*e, in);
  if (!last_miss.empty()) compiler::debug_write(opts.name + ".guard_miss.txt", "recompiling: guard failed on " + last_miss + "\n");
  ++traces;
  compiler::TraceResult r = compiler::trace(fn, in, opts);
  if (r.broke) {
    e->lazy = true, e->break_op = r.break_op, e->break_reason = r.break_reason;
  } else {
    const bool recompute = opts.recompute && compiler::enabled_passes().recompute;
    if (r.backward.forward_nodes >= 0) compiler::split_backward(*e, r, in.size(), recompute);
    else e->graph = std::move(r.graph);
    e->leaf_grads = std::move(r.leaf_grads), e->leaves_cleared = std::move(r.leaves_cleared);
    build_both(*e);
  }
  entries.push_back(std::move(e));
  return last_hit = entries.back().get();
}

CompiledFunction::CompiledFunction(TensorFn fn, CompileOptions opts) : s_(std::make_unique<State>()) {
  s_->fn = std::move(fn);
  s_->opts = std::move(opts);
}
CompiledFunction::~CompiledFunction() = default;
CompiledFunction::CompiledFunction(CompiledFunction&&) noexcept = default;
CompiledFunction& CompiledFunction::operator=(CompiledFunction&&) noexcept = default;

int CompiledFunction::compiles() const { return int(s_->programs.size()); }
int CompiledFunction::traces() const { return s_->traces; }

std::vector<Tensor> CompiledFunction::operator()(const std::vector<Tensor>& inputs) {
  compiler::check_dynamic(s_->opts, inputs);
  compiler::Entry* e = s_->find(inputs);
  if (!e) {
    if (!s_->may_compile()) return s_->fn(inputs);
    e = s_->make(inputs);
  }
  if (e->lazy) return s_->run_lazily(inputs);
  if (e->eager) return s_->fn(inputs);
  if (e->backward) return compiler::run_with_backward(*e, inputs, s_->arena, s_->opts.name);
  if (!e->leaf_grads.empty() || !e->leaves_cleared.empty()) return s_->run_handing_gradients(*e, inputs);
  return compiler::run(*e, inputs, s_->arena);
}

// The gradients the function's backward left on leaves go to them as eager's backward leaves
// them: set where the function cleared the leaf first, else added to what the leaf holds (the
// same add) or set where it holds none. A graph that reads a gradient it adds to was traced with
// none there: a call finding one there runs eagerly.
std::vector<Tensor> CompiledFunction::State::run_handing_gradients(compiler::Entry& e, const std::vector<Tensor>& in) {
  auto leaf_of = [&](const compiler::LeafGrad& g) { return g.input >= 0 ? in[size_t(g.input)] : g.leaf; };
  for (const compiler::LeafGrad& g : e.leaf_grads)
    if (g.read && !g.cleared && leaf_of(g).grad().defined()) return fn(in);
  std::vector<Tensor> out = compiler::run(e, in, arena);
  const size_t n = out.size() - e.leaf_grads.size();
  NoGradGuard no_grad;
  for (size_t i = 0; i < e.leaf_grads.size(); ++i) {
    Tensor leaf = leaf_of(e.leaf_grads[i]);
    const Tensor old = e.leaf_grads[i].cleared ? Tensor() : leaf.grad();
    leaf.set_grad(old.defined() ? old + out[n + i] : out[n + i]);
  }
  for (Tensor& leaf : e.leaves_cleared) leaf.set_grad({});
  out.resize(n);
  return out;
}

CompiledFunction compile(TensorFn fn, CompileOptions opts) { return CompiledFunction(std::move(fn), std::move(opts)); }
Explanation explain(CompiledFunction& f, const std::vector<Tensor>& inputs) { return f.explain(inputs); }

}  // namespace sinter

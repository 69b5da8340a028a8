// explain(): what a compiled function is now: graphs traced, programs compiled, graph breaks,
// each program's fused kernels and library calls (GEMM epilogues named), buffer bytes, what its
// backward keeps, the guards and what checking them costs per call, and the warnings it raised.
#include <algorithm>
#include <chrono>
#include <climits>

#include "compiler/compiled.h"
#include "compiler/user_kernel.h"

namespace sinter {
namespace {

// A library call as explain lists it: its op, and a GEMM's epilogue ("linear_fused: bias +
// gelu_tanh + residual", "sparse24_linear: bias + silu").
std::string library_call(const compiler::Node& n) {
  std::string what = n.op->name, parts;
  auto add = [&](const std::string& q) { parts += (parts.empty() ? "" : " + ") + q; };
  if (n.op->name == "linear_fused" || n.op->name == "sparse24_linear") {
    const std::string& act = n.attrs.str(n.op->name == "linear_fused" ? "act" : "activation");
    if (n.attrs.b("bias")) add("bias");
    if (act != "none") add(act);
    if (n.attrs.b_or("residual", false)) add("residual");
  }
  return parts.empty() ? what : what + ": " + parts;
}

// A user kernel the program calls: its configs and the one each key bucket seen so far runs.
std::string user_kernel_line(compiler::UserKernel& k) {
  std::ostringstream os;
  os << k.def.name << ": " << k.def.configs.size() << " config(s)";
  std::lock_guard lock(k.mu);
  for (const auto& [bucket, c] : k.tuned) {
    os << "; bucket (";
    for (size_t i = 0; i < bucket.size(); ++i) os << (i ? ", " : "") << bucket[i];
    os << "): config " << c.config;
  }
  return os.str();
}

// One compiled program's part of the report.
void explain_program(const compiler::Entry& p, Explanation& x, std::ostringstream& os) {
  const compiler::Graph& g = p.graph;
  int fused = int(p.plan.groups.size()), library = 0;
  for (const compiler::Step& st : p.plan.steps) {
    if (st.group >= 0) continue;
    ++library;
    const compiler::Node& n = g.nodes[size_t(st.node)];
    const std::string what = library_call(n);
    if (what.find(':') != std::string::npos) os << "    GEMM epilogue: " << what << "\n";
    x.library.push_back(what);
    if (compiler::UserKernel* k = compiler::user_kernel_of(n.op)) {
      const std::string line = user_kernel_line(*k);
      if (std::find(x.user_kernels.begin(), x.user_kernels.end(), line) == x.user_kernels.end())
        x.user_kernels.push_back(line), os << "    user kernel " << line << "\n";
    }
  }
  for (const compiler::Group& gr : p.plan.groups) x.kernels.push_back(gr.ops), os << "    fused: " << gr.ops << "\n";
  for (const std::string& n : g.notes) x.notes.push_back(n), os << "    " << n << "\n";
  x.fused_kernels += fused, x.library_calls += library;
  x.planned_bytes += p.plan.arena_bytes;
  x.unplanned_bytes += p.plan.unplanned_bytes;
  os << "  " << g.nodes.size() << " nodes -> " << fused << " fused kernels + " << library << " library calls\n";
  os << "  buffers: " << p.plan.arena_bytes << " bytes planned (" << p.plan.unplanned_bytes << " without reuse)\n";
  os << "  code: " << p.module->path << (p.module->from_cache ? " (from the cache)" : "") << "\n";
}

// What each call spends choosing its compiled code: the guard checks, timed over many calls.
double guard_check_us(CompiledFunction::State& s, const std::vector<Tensor>& inputs) {
  const int reps = 2000;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) (void)s.find(inputs);
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps;
}

}  // namespace

Explanation CompiledFunction::explain(const std::vector<Tensor>& inputs) {
  compiler::check_dynamic(s_->opts, inputs);
  compiler::Entry* e = s_->find(inputs);
  if (!e) e = s_->make(inputs);
  Explanation x;
  x.graphs = s_->traces;
  x.compiles = int(s_->programs.size());
  x.guard_check_us = guard_check_us(*s_, inputs);
  for (auto& en : s_->entries)
    if (en->lazy) ++x.breaks, x.break_reasons.push_back(en->break_op + ": " + en->break_reason);
  x.guards = e->guard_text;
  for (const DynamicDim& d : s_->opts.dynamic)
    x.guards.push_back("input " + std::to_string(d.input) + " dim " + std::to_string(d.dim) + " dynamic in [" + std::to_string(d.min) + ", " +
                       (d.max == INT64_MAX ? std::string("inf") : std::to_string(d.max)) + "]");
  x.warnings = s_->warnings;
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
    explain_program(*p, x, os);
  }
  if (!e->lazy && e->backward) {
    x.saved_bytes = e->backward->saved_bytes, x.recomputed = int(e->backward->recomputed);
    os << "  backward: " << x.saved_bytes << " bytes of forward values kept for it, " << x.recomputed << " node(s) recomputed instead\n";
  }
  os << "  guards (checked in " << x.guard_check_us << " us per call):\n";
  for (const std::string& g : x.guards) os << "    " << g << "\n";
  for (const std::string& w : x.warnings) os << "  warning: " << w << "\n";
  x.text = os.str();
  return x;
}

}  // namespace sinter

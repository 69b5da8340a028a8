// Graph rewrites: dead code, common subexpressions, GEMM epilogues, sibling linears, layout
// copies; the pass switches; the recomputation a compiled backward chooses. (The plan: plan.cpp.)
#include "compiler/passes.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <map>
#include <set>

#include "ops/linalg.h"

namespace sinter::compiler {

void eliminate_dead_code(Graph& g) {
  // A value is used when a live node reads it or the graph returns it; a buffer is observed when
  // it is the caller's (an input, a captured tensor) or something live reads it later, so a write
  // into it matters. Walking backwards, program order decides "later".
  std::vector<bool> used(g.values.size(), false), observed(g.values.size(), false);
  for (int v : g.outputs) used[size_t(v)] = true, observed[size_t(g.buffer_of(v))] = true;
  for (int v : g.inputs) observed[size_t(g.buffer_of(v))] = true;
  for (int v : g.captured) observed[size_t(g.buffer_of(v))] = true;
  std::vector<bool> keep(g.nodes.size(), false);
  for (size_t n = g.nodes.size(); n-- > 0;) {
    const Node& node = g.nodes[n];
    bool live = false, writes_dead = false;
    for (size_t k = 0; k < node.outputs.size(); ++k) {
      const int v = node.outputs[k];
      live = live || used[size_t(v)];
      if (!node.is_view() && node.op->effects[k].kind == Effect::Kind::writes) {
        const bool seen = observed[size_t(g.buffer_of(v))];
        live = live || seen, writes_dead = writes_dead || !seen;
      }
    }
    if (!live) {
      if (writes_dead) g.notes.push_back("dropped " + node.op->name + " (node " + std::to_string(n) + "): it writes a buffer nothing reads afterwards");
      continue;
    }
    keep[n] = true;
    for (int v : node.inputs) used[size_t(v)] = true, observed[size_t(g.buffer_of(v))] = true;
  }
  std::vector<Node> kept;
  for (size_t n = 0; n < g.nodes.size(); ++n)
    if (keep[n]) {
      for (int v : g.nodes[n].outputs) g.values[size_t(v)].node = int(kept.size());
      kept.push_back(std::move(g.nodes[n]));
    }
  g.nodes = std::move(kept);
}

void eliminate_common_subexpressions(Graph& g) {
  // Buffers some node writes: a read of one is not the same value before and after the write.
  std::set<int> written;
  for (const Node& n : g.nodes)
    if (n.mutates())
      for (int v : n.outputs) written.insert(g.buffer_of(v));
  std::vector<int> same(g.values.size());
  for (size_t v = 0; v < same.size(); ++v) same[v] = int(v);
  std::multimap<uint64_t, size_t> seen;  // hash -> node
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    Node& node = g.nodes[n];
    for (int& v : node.inputs) v = same[size_t(v)];
    if (node.mutates() || node.op->random || node.op->data_dependent) continue;
    bool reads_written = false;
    for (int v : node.inputs) reads_written = reads_written || (!node.is_view() && written.count(g.buffer_of(v)));
    if (reads_written) continue;
    uint64_t h = node.attrs.hash() ^ std::hash<const void*>{}(node.op);
    for (int v : node.inputs) h = h * 1099511628211ull ^ uint64_t(v);
    bool replaced = false;
    for (auto [it, end] = seen.equal_range(h); it != end && !replaced; ++it) {
      const Node& prev = g.nodes[it->second];
      if (prev.op != node.op || prev.inputs != node.inputs || !(prev.attrs == node.attrs)) continue;
      for (size_t k = 0; k < node.outputs.size(); ++k) same[size_t(node.outputs[k])] = prev.outputs[k];
      replaced = true;
    }
    if (!replaced) seen.emplace(h, n);
  }
  for (int& v : g.outputs) v = same[size_t(v)];
  eliminate_dead_code(g);
}

// Drops the marked nodes and renumbers the producers of the values the rest make.
void remove_nodes(Graph& g, const std::vector<bool>& removed) {
  std::vector<Node> kept;
  for (size_t n = 0; n < g.nodes.size(); ++n)
    if (!removed[n]) {
      for (int v : g.nodes[n].outputs) g.values[size_t(v)].node = int(kept.size());
      kept.push_back(std::move(g.nodes[n]));
    }
  g.nodes = std::move(kept);
}

// Whether a node strictly between nodes `from` and `to` writes in place a buffer one of `reads`
// lives in: a node fused into the later position must not read across such a write.
bool written_between(const Graph& g, size_t from, size_t to, const std::vector<int>& reads) {
  for (size_t m = from + 1; m < to; ++m)
    if (g.nodes[m].mutates())
      for (int w : g.nodes[m].outputs)
        for (int in : reads)
          if (g.buffer_of(w) == g.buffer_of(in)) return true;
  return false;
}

void fuse_gemm_epilogues(Graph& g) {
  static const OpDef& fused = get_op("linear_fused");
  std::vector<int> uses(g.values.size(), 0), user(g.values.size(), -1);
  for (size_t n = 0; n < g.nodes.size(); ++n)
    for (int v : g.nodes[n].inputs) ++uses[size_t(v)], user[size_t(v)] = int(n);
  for (int v : g.outputs) uses[size_t(v)] += 2;  // a returned value is materialised
  // The one node that reads v, when v is read once.
  auto only_user = [&](int v) -> Node* { return uses[size_t(v)] == 1 ? &g.nodes[size_t(user[size_t(v)])] : nullptr; };
  std::vector<bool> removed(g.nodes.size(), false);
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    Node& lin = g.nodes[n];
    // A 2:4 linear applies relu, silu or gelu to its output tiles itself (attr "activation").
    if (!removed[n] && lin.op->name == "sparse24_linear" && lin.attrs.str("activation") == "none") {
      Node* u = only_user(lin.outputs[0]);
      if (!u || u->inputs.size() != 1 || !u->attrs.items().empty() || u->mutates() ||
          (u->op->name != "relu" && u->op->name != "silu" && u->op->name != "gelu"))
        continue;
      const int last = int(u - g.nodes.data());  // the fused node runs where the activation ran
      if (written_between(g, n, size_t(last), lin.inputs)) continue;
      Node f = lin;
      f.attrs.set("activation", u->op->name);
      f.outputs = u->outputs;
      removed[n] = true;
      g.nodes[size_t(last)] = std::move(f);
      g.values[size_t(g.nodes[size_t(last)].outputs[0])].node = last;
      continue;
    }
    if (removed[n] || lin.op->name != "linear") continue;
    const Value& y = g.values[size_t(lin.outputs[0])];
    if (y.meta.device.type != DeviceType::cpu || !is_floating(y.meta.dtype)) continue;
    std::vector<int> absorbed;
    int cur = lin.outputs[0], residual = -1;
    std::string act = "none";
    if (Node* u = only_user(cur); u && u->inputs.size() == 1 && u->attrs.items().empty() && u->op->name != "none" &&
                                  detail::fused_linear_activation(u->op->name))
      act = u->op->name, cur = u->outputs[0], absorbed.push_back(int(u - g.nodes.data()));
    if (Node* u = only_user(cur); u && u->op->name == "add" && u->inputs.size() == 2 && u->inputs[0] != u->inputs[1]) {
      const int other = u->inputs[0] == cur ? u->inputs[1] : u->inputs[0];
      const Value &o = g.values[size_t(other)], &c = g.values[size_t(cur)];
      if (o.meta.shape == c.meta.shape && o.meta.dtype == c.meta.dtype && g.values[size_t(u->outputs[0])].meta.shape == c.meta.shape)
        residual = other, cur = u->outputs[0], absorbed.push_back(int(u - g.nodes.data()));
    }
    if (absorbed.empty()) continue;
    const int last = absorbed.back();  // the fused node runs where the last absorbed node ran
    if (written_between(g, n, size_t(last), lin.inputs)) continue;
    Node f;
    f.op = &fused;
    f.inputs = lin.inputs;
    f.attrs = Attrs{{"act", act}, {"bias", lin.inputs.size() == 3}, {"residual", residual >= 0}};
    if (residual >= 0) f.inputs.push_back(residual);
    f.outputs = {cur};
    removed[n] = true;
    for (int m : absorbed) removed[size_t(m)] = true;
    removed[size_t(last)] = false;
    g.nodes[size_t(last)] = std::move(f);
    g.values[size_t(cur)].node = last, g.values[size_t(cur)].output = 0;
  }
  remove_nodes(g, removed);
}

void fuse_sibling_linears(Graph& g) {
  static const OpDef& l3 = get_op("linear3");
  std::vector<bool> removed(g.nodes.size(), false);
  std::map<std::pair<int, size_t>, std::vector<size_t>> by_input;  // (x, inputs) -> linear nodes, in order
  for (size_t n = 0; n < g.nodes.size(); ++n)
    if (g.nodes[n].op->name == "linear") by_input[{g.nodes[n].inputs[0], g.nodes[n].inputs.size()}].push_back(n);
  std::vector<int> producer(g.values.size(), -1);
  for (size_t n = 0; n < g.nodes.size(); ++n)
    for (int v : g.nodes[n].outputs) producer[size_t(v)] = int(n);
  for (auto& [key, nodes] : by_input) {
    if (nodes.size() < 3) continue;
    const size_t first = nodes[0], last = nodes[2];
    const bool bias = key.second == 3;
    // The fused node runs where the first ran: the others' weights must exist by then, and nothing
    // in between may write what any of them reads.
    bool ok = true;
    std::vector<int> reads;
    for (int k = 0; k < 3; ++k)
      for (int v : g.nodes[nodes[size_t(k)]].inputs) ok = ok && (k == 0 || producer[size_t(v)] < int(first)), reads.push_back(v);
    if (!ok || written_between(g, first, last, reads)) continue;
    Node f;
    f.op = &l3;
    f.attrs = Attrs{{"bias", bias}};
    f.inputs.push_back(key.first);
    for (int k = 0; k < 3; ++k) f.inputs.push_back(g.nodes[nodes[size_t(k)]].inputs[1]);
    if (bias)
      for (int k = 0; k < 3; ++k) f.inputs.push_back(g.nodes[nodes[size_t(k)]].inputs[2]);
    for (int k = 0; k < 3; ++k) {
      const int out = g.nodes[nodes[size_t(k)]].outputs[0];
      f.outputs.push_back(out);
      g.values[size_t(out)].output = k;
    }
    removed[nodes[1]] = removed[nodes[2]] = true;
    g.nodes[first] = std::move(f);
  }
  remove_nodes(g, removed);
}

// Ops whose kernels write the output in any layout with a contiguous last dim (attention's o and
// its gradients: the flash kernels take a row layout per operand).
namespace {
bool writes_any_row_layout(const Graph& g, int v) {
  const Value& x = g.values[size_t(v)];
  if (x.kind != ValueKind::node || !x.owns_buffer()) return false;
  const std::string& op = g.nodes[size_t(x.node)].op->name;
  return (op == "sdpa" && x.output == 0) || op == "sdpa_flash_backward";
}
}  // namespace

void absorb_layout_copies(Graph& g) {
  std::vector<int> uses(g.values.size(), 0);
  for (const Node& n : g.nodes)
    for (int v : n.inputs) ++uses[size_t(v)];
  std::set<int> returned, written;
  for (int v : g.outputs) returned.insert(g.buffer_of(v));
  for (const Node& n : g.nodes)
    if (n.mutates())
      for (int v : n.outputs) written.insert(g.buffer_of(v));
  std::vector<int> views(g.values.size(), 0);  // values living in each buffer, itself aside
  for (size_t v = 0; v < g.values.size(); ++v)
    if (!g.values[v].owns_buffer()) ++views[size_t(g.values[v].base)];
  std::vector<bool> removed(g.nodes.size(), false);
  for (size_t c = 0; c < g.nodes.size(); ++c) {
    const Node& copy = g.nodes[c];
    if (copy.op->name != "copy" || copy.inputs.size() != 1 || copy.outputs.size() != 1) continue;
    const int v = copy.inputs[0], out = copy.outputs[0];
    Value& pv = g.values[size_t(v)];
    if (pv.owns_buffer() || pv.kind != ValueKind::node || uses[size_t(v)] != 1) continue;
    const Node& perm = g.nodes[size_t(pv.node)];
    const int o = pv.base;
    if (perm.op->name != "permute" || perm.inputs[0] != o || !writes_any_row_layout(g, o) || views[size_t(o)] != 1) continue;
    if (returned.count(o) || returned.count(out) || written.count(o) || written.count(out) || !g.values[size_t(out)].owns_buffer() ||
        !g.contiguous(out) || g.values[size_t(o)].offset != 0)
      continue;
    // o laid out so that its permute is the copy's contiguous layout; the last dim stays contiguous.
    const Shape& dims = perm.attrs.ints("dims");
    const Shape& shape = pv.meta.shape;
    Shape packed(shape.size());
    for (int64_t i = int64_t(shape.size()), st = 1; i-- > 0;) packed[size_t(i)] = st, st *= shape[size_t(i)];
    Shape laid(shape.size());
    for (size_t i = 0; i < dims.size(); ++i) laid[size_t(dims[i])] = packed[i];
    if (laid.back() != 1 && g.values[size_t(o)].meta.shape.back() > 1) continue;
    g.values[size_t(o)].strides = laid;
    pv.strides = packed, pv.offset = 0;
    for (Node& n : g.nodes)
      for (int& x : n.inputs) x = x == out ? v : x;
    for (Value& w : g.values)
      if (w.base == out) w.base = o;
    removed[c] = true;
  }
  remove_nodes(g, removed);
}

std::vector<size_t> choose_recomputation(const Graph& g, size_t forward_nodes, std::vector<bool>& saved, const Target& t) {
  static const std::set<std::string> cheap{"add", "sub", "mul", "neg", "relu", "abs", "maximum", "minimum", "where", "cast", "clamp"};
  std::set<int> written, returned;
  for (const Node& n : g.nodes)
    if (n.mutates())
      for (int v : n.outputs) written.insert(g.buffer_of(v));
  for (int v : g.outputs) returned.insert(v);
  const std::vector<bool> kept = saved;  // what the backward reads of the forward anyway
  auto at_hand = [&](int u) { return kept[size_t(u)] || g.values[size_t(u)].kind == ValueKind::captured; };
  // Values the backward can compute from what it has: cheap nodes over such values.
  std::vector<bool> derivable(g.values.size(), false);
  for (size_t n = 0; n < forward_nodes; ++n) {
    const Node& node = g.nodes[n];
    if (node.outputs.size() != 1 || node.mutates() || node.op->random || node.op->data_dependent) continue;
    if (!node.is_view() && !(cheap.count(node.op->name) && fusable(g, node, t))) continue;
    const int v = node.outputs[0];
    bool ok = !written.count(g.buffer_of(v));
    for (int u : node.inputs) ok = ok && !written.count(g.buffer_of(u)) && (at_hand(u) || derivable[size_t(u)]);
    derivable[size_t(v)] = ok;
  }
  // Each kept value that is derivable (and not returned) is recomputed, with the nodes it needs.
  std::vector<bool> chosen(forward_nodes, false);
  std::vector<int> stack;
  for (size_t v = 0; v < g.values.size(); ++v) {
    if (!kept[v] || !derivable[v] || returned.count(int(v))) continue;
    saved[v] = false;
    stack.push_back(int(v));
    while (!stack.empty()) {
      const int x = stack.back();
      stack.pop_back();
      const size_t n = size_t(g.values[size_t(x)].node);
      if (chosen[n]) continue;
      chosen[n] = true;
      for (int u : g.nodes[n].inputs)
        if (!at_hand(u)) stack.push_back(u);
    }
  }
  std::vector<size_t> nodes;
  for (size_t n = 0; n < forward_nodes; ++n)
    if (chosen[n]) nodes.push_back(n);
  return nodes;
}

PassSet enabled_passes() {
  PassSet on;
  const char* e = std::getenv("SINTER_COMPILE_DISABLE");
  std::stringstream ss(e ? e : "");
  for (std::string name; std::getline(ss, name, ',');) {
    bool* flag = name == "cse" ? &on.cse : name == "epilogues" ? &on.epilogues : name == "siblings" ? &on.siblings
               : name == "layouts" ? &on.layouts : name == "fuse" ? &on.fuse : name == "recompute" ? &on.recompute : nullptr;
    SINTER_CHECK_T(CompileError, flag || name.empty(), "[compile] SINTER_COMPILE_DISABLE names '", name,
                   "'; the passes are cse, epilogues, siblings, layouts, fuse, recompute");
    if (flag) *flag = false;
  }
  return on;
}

}  // namespace sinter::compiler

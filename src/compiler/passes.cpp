// Dead code, common subexpressions, GEMM epilogues, fusion groups and the memory plan.
#include "compiler/passes.h"

#include <algorithm>
#include <map>
#include <set>

#include "ops/linalg.h"

namespace sinter::compiler {

void eliminate_dead_code(Graph& g) {
  std::vector<bool> used(g.values.size(), false);
  for (int v : g.outputs) used[size_t(v)] = true;
  std::vector<bool> keep(g.nodes.size(), false);
  for (size_t n = g.nodes.size(); n-- > 0;) {
    const Node& node = g.nodes[n];
    bool live = node.mutates();
    for (int v : node.outputs) live = live || used[size_t(v)];
    if (!live) continue;
    keep[n] = true;
    for (int v : node.inputs) used[size_t(v)] = true;
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

namespace {
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
}  // namespace

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

namespace {

bool spelled(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::bf16 || t == DType::i64 || t == DType::i32 || t == DType::boolean;
}

}  // namespace

bool spelled_op(const std::string& name);  // codegen.cpp

bool fusable(const Graph& g, const Node& n) {
  if (!spelled_op(n.op->name) || n.mutates() || n.op->random) return false;
  for (int v : n.inputs) if (!spelled(g.values[size_t(v)].meta.dtype)) return false;
  for (int v : n.outputs) if (!spelled(g.values[size_t(v)].meta.dtype)) return false;
  return g.values[size_t(n.outputs[0])].meta.device.type == DeviceType::cpu;
}

std::vector<size_t> choose_recomputation(const Graph& g, size_t forward_nodes, std::vector<bool>& saved) {
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
    if (!node.is_view() && !(cheap.count(node.op->name) && fusable(g, node))) continue;
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

bool fusable_row(const Graph& g, const Node& n) {
  if (n.op->name != "layer_norm" && n.op->name != "rms_norm") return false;
  const Value& x = g.values[size_t(n.inputs[0])];
  const DType dt = x.meta.dtype;
  return (dt == DType::f32 || dt == DType::f64 || dt == DType::bf16) && !x.meta.shape.empty() && x.meta.shape.back() > 0 &&
         x.meta.shape.back() <= 16384 && x.meta.device.type == DeviceType::cpu;
}

Plan plan(const Graph& g) {
  Plan p;
  std::vector<int> group_of_node(g.nodes.size(), -1);
  std::vector<int> group_of_value(g.values.size(), -1);
  std::vector<bool> open;  // by group: still accepting nodes
  std::vector<bool> constant(g.nodes.size(), false);  // `full` nodes: inlined into the groups that read them
  for (size_t n = 0; n < g.nodes.size(); ++n) constant[n] = g.nodes[n].op->name == "full" && fusable(g, g.nodes[n]);
  auto shape_of = [&](int n) -> const Shape& { return g.values[size_t(g.nodes[size_t(n)].outputs[0])].meta.shape; };
  // Greedy fusion in program order: a node joins the open groups of its shape that it reads from
  // (merging them), else the latest open group of its shape; a group closes when a node outside it
  // reads its values or a node writes in place (no read moves across a write). A group runs where
  // its last node was.
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    const Node& node = g.nodes[n];
    if (constant[n]) continue;
    if (node.mutates())
      for (size_t k = 0; k < open.size(); ++k) open[k] = false;
    const bool row = fusable_row(g, node);
    const bool fuse = row || fusable(g, node);
    int join = -1;
    // Values a group made before its row reduction: its epilogue cannot read them.
    auto prologue_value = [&](int v) {
      const int gi = group_of_value[size_t(v)];
      const int r = gi >= 0 ? p.groups[size_t(gi)].row : -1;
      return r >= 0 && g.values[size_t(v)].node < r;
    };
    if (row) {  // joins the open group that makes its input (as that group's reduction), if any
      const int gi = group_of_value[size_t(node.inputs[0])];
      if (gi >= 0 && open[size_t(gi)] && p.groups[size_t(gi)].row < 0 && p.groups[size_t(gi)].shape == shape_of(int(n))) join = gi;
    } else if (fuse) {
      const Shape& shape = shape_of(int(n));
      std::vector<int> from;
      for (int v : node.inputs) {
        const int gi = group_of_value[size_t(v)];
        if (gi >= 0 && open[size_t(gi)] && p.groups[size_t(gi)].shape == shape &&
            std::find(from.begin(), from.end(), gi) == from.end())
          from.push_back(gi);
      }
      if (from.empty())
        for (size_t gi = p.groups.size(); gi-- > 0;)
          if (open[gi] && p.groups[gi].shape == shape) { from.push_back(int(gi)); break; }
      bool reads_prologue = false;
      for (int v : node.inputs) reads_prologue = reads_prologue || prologue_value(v);
      int rows = 0;
      for (int gi : from) rows += p.groups[size_t(gi)].row >= 0;
      if (reads_prologue || (rows > 0 && from.size() > 1)) from.clear();  // no epilogue reads a prologue value; one reduction a group
      if (!from.empty()) {
        join = from[0];
        for (size_t k = 1; k < from.size(); ++k) {  // merge into the first
          Group& src = p.groups[size_t(from[k])];
          for (int m : src.nodes) {
            group_of_node[size_t(m)] = join;
            for (int v : g.nodes[size_t(m)].outputs) group_of_value[size_t(v)] = join;
            p.groups[size_t(join)].nodes.push_back(m);
          }
          src.nodes.clear();
          open[size_t(from[k])] = false;
        }
      }
    }
    // Reading an open group's value from outside it closes that group.
    for (int v : node.inputs) {
      const int gi = group_of_value[size_t(v)];
      if (gi >= 0 && gi != join) open[size_t(gi)] = false;
    }
    if (!fuse) {
      if (!node.is_view()) p.steps.push_back({-1, int(n)});
      continue;
    }
    if (join < 0) {
      join = int(p.groups.size());
      p.groups.push_back({});
      p.groups.back().shape = shape_of(int(n));
      open.push_back(true);
    }
    if (row) p.groups[size_t(join)].row = int(n);
    p.groups[size_t(join)].nodes.push_back(int(n));
    group_of_node[n] = join;
    for (int v : node.outputs) group_of_value[size_t(v)] = join;
  }
  // Constants go into each group that reads them; one read elsewhere (or returned) is a step of its own.
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    if (!constant[n]) continue;
    const int v = g.nodes[n].outputs[0];
    bool elsewhere = std::find(g.outputs.begin(), g.outputs.end(), v) != g.outputs.end();
    std::set<int> groups;
    for (size_t m = 0; m < g.nodes.size(); ++m)
      for (int u : g.nodes[m].inputs)
        if (u == v) {
          if (group_of_node[m] >= 0) groups.insert(group_of_node[m]);
          else elsewhere = true;
        }
    for (int gi : groups) p.groups[size_t(gi)].nodes.push_back(int(n));
    if (elsewhere) p.steps.push_back({-1, int(n)}), std::sort(p.steps.begin(), p.steps.end(), [](const Step& a, const Step& b) { return a.node < b.node; });
  }
  // Drop emptied (merged) groups; nodes in program order.
  {
    std::vector<Group> kept;
    std::vector<int> renum(p.groups.size(), -1);
    for (size_t gi = 0; gi < p.groups.size(); ++gi)
      if (!p.groups[gi].nodes.empty()) renum[gi] = int(kept.size()), kept.push_back(std::move(p.groups[gi]));
    for (int& gi : group_of_node) if (gi >= 0) gi = renum[size_t(gi)];
    for (int& gi : group_of_value) if (gi >= 0) gi = renum[size_t(gi)];
    p.groups = std::move(kept);
    for (Group& gr : p.groups) std::sort(gr.nodes.begin(), gr.nodes.end());
  }
  auto in_group = [&](int gi, int n) {
    const std::vector<int>& ns = p.groups[size_t(gi)].nodes;
    return std::binary_search(ns.begin(), ns.end(), n);
  };
  // Each group runs where its last non-constant node was.
  std::vector<Step> steps;
  std::vector<int> last_of_group(p.groups.size(), -1);
  for (size_t gi = 0; gi < p.groups.size(); ++gi)
    for (int n : p.groups[gi].nodes)
      if (!constant[size_t(n)]) last_of_group[gi] = std::max(last_of_group[gi], n);
  {
    size_t s = 0;
    for (size_t n = 0; n < g.nodes.size(); ++n) {
      while (s < p.steps.size() && p.steps[s].node == int(n)) steps.push_back(p.steps[s++]);
      const int gi = group_of_node[n];
      if (gi >= 0 && last_of_group[size_t(gi)] == int(n)) steps.push_back({gi, -1});
    }
  }
  p.steps = std::move(steps);
  // Group inputs and stored outputs: a value a group makes is stored when a node outside the group
  // reads it (constants excepted: each reader inlines its own) or the function returns it.
  std::vector<bool> returned(g.values.size(), false);
  for (int v : g.outputs) returned[size_t(g.buffer_of(v))] = true, returned[size_t(v)] = true;
  std::vector<int> producer(g.values.size(), -1);
  for (size_t n = 0; n < g.nodes.size(); ++n)
    for (int v : g.nodes[n].outputs) producer[size_t(v)] = int(n);
  for (size_t gi = 0; gi < p.groups.size(); ++gi) {
    Group& gr = p.groups[gi];
    std::set<int> ins;
    std::vector<std::string> names;
    for (int n : gr.nodes) {
      const Node& node = g.nodes[size_t(n)];
      if (!constant[size_t(n)]) names.push_back(node.op->name);
      for (int v : node.inputs)
        if ((producer[size_t(v)] < 0 || !in_group(int(gi), producer[size_t(v)])) && !ins.count(v)) ins.insert(v), gr.inputs.push_back(v);
      if (constant[size_t(n)]) continue;
      for (int v : node.outputs) {
        bool outside = returned[size_t(v)];
        for (size_t m = 0; m < g.nodes.size() && !outside; ++m)
          if (!in_group(int(gi), int(m)))
            for (int u : g.nodes[m].inputs) outside = outside || u == v;
        if (outside) gr.outputs.push_back(v);
      }
    }
    for (size_t i = 0; i < names.size(); ++i) gr.ops += (i ? " -> " : "") + names[i];
  }
  // Memory plan: buffers made by nodes live from their step to the last step that reads them (or
  // a view of them); returned buffers are fresh per call. First fit in a 64-byte aligned arena.
  // Materialised: a library kernel's outputs and what a fused kernel stores; a group's other values
  // live in registers.
  std::vector<int> step_of_value(g.values.size(), -1), last_use(g.values.size(), -1);
  for (size_t s = 0; s < p.steps.size(); ++s) {
    const Step& st = p.steps[s];
    if (st.group >= 0) {
      for (int v : p.groups[size_t(st.group)].inputs) last_use[size_t(g.buffer_of(v))] = int(s);
      for (int v : p.groups[size_t(st.group)].outputs) step_of_value[size_t(v)] = int(s);
      continue;
    }
    for (int v : g.nodes[size_t(st.node)].inputs) last_use[size_t(g.buffer_of(v))] = int(s);
    for (int v : g.nodes[size_t(st.node)].outputs)
      if (g.values[size_t(v)].owns_buffer() && step_of_value[size_t(v)] < 0) step_of_value[size_t(v)] = int(s);
  }
  p.arena_offset.assign(g.values.size(), -1);
  p.fresh.assign(g.values.size(), false);
  for (size_t v = 0; v < g.values.size(); ++v) p.fresh[v] = returned[v] && step_of_value[v] >= 0 && g.values[v].owns_buffer();
  struct Block { int64_t at, bytes; int free_after; };
  std::vector<Block> live;
  for (size_t s = 0; s < p.steps.size(); ++s)
    for (size_t v = 0; v < g.values.size(); ++v) {
      if (step_of_value[v] != int(s) || returned[v]) continue;
      const Value& x = g.values[v];
      const int64_t bytes = (x.meta.shape.numel() * dtype_size(x.meta.dtype) + 63) / 64 * 64;
      p.unplanned_bytes += bytes;
      std::erase_if(live, [&](const Block& b) { return b.free_after < int(s); });
      std::sort(live.begin(), live.end(), [](const Block& a, const Block& b) { return a.at < b.at; });
      int64_t at = 0;
      for (const Block& b : live) {
        if (at + bytes <= b.at) break;
        at = std::max(at, b.at + b.bytes);
      }
      live.push_back({at, bytes, std::max(last_use[v], int(s))});
      p.arena_offset[v] = at;
      p.arena_bytes = std::max(p.arena_bytes, at + bytes);
    }
  return p;
}

}  // namespace sinter::compiler

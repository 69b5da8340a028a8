// The plan of a graph, in four named steps: grouping (which nodes fuse into one kernel), order
// (where each kernel and library call runs), group inputs and outputs (what a kernel reads and
// stores), and the memory plan (which buffers share the arena).
#include <algorithm>
#include <set>

#include "compiler/passes.h"

namespace sinter::compiler {

bool fusable(const Graph& g, const Node& n, const Target& t) {
  if (!n.op->fusable || n.mutates() || n.op->random) return false;
  for (int v : n.inputs) if (!t.spells(g.values[size_t(v)].meta.dtype)) return false;
  for (int v : n.outputs) if (!t.spells(g.values[size_t(v)].meta.dtype)) return false;
  return g.values[size_t(n.outputs[0])].meta.device.type == t.device;
}

bool fusable_row(const Graph& g, const Node& n, const Target& t) {
  if (n.op->name != "layer_norm" && n.op->name != "rms_norm") return false;
  const Value& x = g.values[size_t(n.inputs[0])];
  const DType dt = x.meta.dtype;
  return (dt == DType::f32 || dt == DType::f64 || dt == DType::bf16) && !x.meta.shape.empty() && x.meta.shape.back() > 0 &&
         x.meta.shape.back() <= 16384 && x.meta.device.type == t.device;
}

// A constant (full) generated code can spell: inlined into each group that reads it.
static bool inlined_constant(const Graph& g, const Node& n, const Target& t) {
  if (n.op->spelling.form != Spelling::Form::constant || n.op->random) return false;
  const Value& v = g.values[size_t(n.outputs[0])];
  return t.spells(v.meta.dtype) && v.meta.device.type == t.device;
}

namespace {

// Step 1, grouping. Greedy, in program order: a node joins the open groups of its shape that it
// reads from (merging them), else the latest open group of its shape; a group closes when a node
// outside it reads its values or a node writes in place (no read moves across a write). A row
// reduction joins the open group that makes its input, as that group's reduction.
struct Grouping {
  const Graph& g;
  const Target& t;
  Plan& p;
  std::vector<int> group_of_node, group_of_value;
  std::vector<bool> open;      // by group: still accepting nodes
  std::vector<bool> constant;  // by node: inlined where read (inlined_constant)

  Grouping(const Graph& g_, const Target& t_, Plan& p_)
      : g(g_), t(t_), p(p_), group_of_node(g_.nodes.size(), -1), group_of_value(g_.values.size(), -1), constant(g_.nodes.size()) {
    for (size_t n = 0; n < g.nodes.size(); ++n) constant[n] = inlined_constant(g, g.nodes[n], t);
  }
  const Shape& shape_of(size_t n) const { return g.values[size_t(g.nodes[n].outputs[0])].meta.shape; }
  int group_of(int v) const { return group_of_value[size_t(v)]; }
  // Made by a group before its row reduction: the group's epilogue cannot read it.
  bool prologue_value(int v) const {
    const int gi = group_of(v), r = gi >= 0 ? p.groups[size_t(gi)].row : -1;
    return r >= 0 && g.values[size_t(v)].node < r;
  }

  int row_join(size_t n) const {
    const int gi = group_of(g.nodes[n].inputs[0]);
    return gi >= 0 && open[size_t(gi)] && p.groups[size_t(gi)].row < 0 && p.groups[size_t(gi)].shape == shape_of(n) ? gi : -1;
  }

  // The open groups an elementwise node joins (merged into the first), or none.
  std::vector<int> elementwise_join(size_t n) const {
    const Node& node = g.nodes[n];
    const Shape& shape = shape_of(n);
    std::vector<int> from;
    for (int v : node.inputs) {
      const int gi = group_of(v);
      if (gi >= 0 && open[size_t(gi)] && p.groups[size_t(gi)].shape == shape && std::find(from.begin(), from.end(), gi) == from.end())
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
    return from;
  }

  void merge(const std::vector<int>& from) {
    const int join = from[0];
    for (size_t k = 1; k < from.size(); ++k) {
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

  void add(size_t n, int join, bool row) {
    if (join < 0) {
      join = int(p.groups.size());
      p.groups.push_back({});
      p.groups.back().shape = shape_of(n);
      open.push_back(true);
    }
    if (row) p.groups[size_t(join)].row = int(n);
    p.groups[size_t(join)].nodes.push_back(int(n));
    group_of_node[n] = join;
    for (int v : g.nodes[n].outputs) group_of_value[size_t(v)] = join;
  }

  void node(size_t n, bool fuse_enabled) {
    const Node& node = g.nodes[n];
    if (node.mutates()) std::fill(open.begin(), open.end(), false);
    const bool row = fuse_enabled && fusable_row(g, node, t);
    const bool fuse = row || (fuse_enabled && fusable(g, node, t));
    int join = -1;
    if (row) {
      join = row_join(n);
    } else if (fuse) {
      const std::vector<int> from = elementwise_join(n);
      if (!from.empty()) merge(from), join = from[0];
    }
    for (int v : node.inputs)  // reading an open group's value from outside it closes that group
      if (const int gi = group_of(v); gi >= 0 && gi != join) open[size_t(gi)] = false;
    if (fuse) add(n, join, row);
    else if (!node.is_view()) p.steps.push_back({-1, int(n)});
  }

  // Constants go into each group that reads them; one read elsewhere (or returned) is a step of its own.
  void place_constants() {
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
      if (elsewhere) {
        p.steps.push_back({-1, int(n)});
        std::sort(p.steps.begin(), p.steps.end(), [](const Step& a, const Step& b) { return a.node < b.node; });
      }
    }
  }

  // Drops emptied (merged) groups; each group's nodes in program order.
  void drop_empty_groups() {
    std::vector<Group> kept;
    std::vector<int> renum(p.groups.size(), -1);
    for (size_t gi = 0; gi < p.groups.size(); ++gi)
      if (!p.groups[gi].nodes.empty()) renum[gi] = int(kept.size()), kept.push_back(std::move(p.groups[gi]));
    for (int& gi : group_of_node) if (gi >= 0) gi = renum[size_t(gi)];
    for (int& gi : group_of_value) if (gi >= 0) gi = renum[size_t(gi)];
    p.groups = std::move(kept);
    for (Group& gr : p.groups) std::sort(gr.nodes.begin(), gr.nodes.end());
  }

  void run(bool fuse_enabled) {
    for (size_t n = 0; n < g.nodes.size(); ++n)
      if (!constant[n]) node(n, fuse_enabled);
    place_constants();
    drop_empty_groups();
  }
};

// Step 2, order: the library steps stay in program order; each group runs where its last
// non-constant node was.
void order_steps(const Grouping& gp, Plan& p) {
  std::vector<int> last_of_group(p.groups.size(), -1);
  for (size_t gi = 0; gi < p.groups.size(); ++gi)
    for (int n : p.groups[gi].nodes)
      if (!gp.constant[size_t(n)]) last_of_group[gi] = std::max(last_of_group[gi], n);
  std::vector<Step> steps;
  size_t s = 0;
  for (size_t n = 0; n < gp.g.nodes.size(); ++n) {
    while (s < p.steps.size() && p.steps[s].node == int(n)) steps.push_back(p.steps[s++]);
    const int gi = gp.group_of_node[n];
    if (gi >= 0 && last_of_group[size_t(gi)] == int(n)) steps.push_back({gi, -1});
  }
  p.steps = std::move(steps);
}

// Step 3, group inputs and stored outputs: a value a group makes is stored when a node outside
// the group reads it (constants excepted: each reader inlines its own) or the function returns it.
void group_io(const Grouping& gp, const std::vector<bool>& returned, Plan& p) {
  const Graph& g = gp.g;
  std::vector<int> producer(g.values.size(), -1);
  for (size_t n = 0; n < g.nodes.size(); ++n)
    for (int v : g.nodes[n].outputs) producer[size_t(v)] = int(n);
  for (Group& gr : p.groups) {
    auto in_group = [&](int n) { return std::binary_search(gr.nodes.begin(), gr.nodes.end(), n); };
    std::set<int> ins;
    std::vector<std::string> names;
    for (int n : gr.nodes) {
      const Node& node = g.nodes[size_t(n)];
      if (!gp.constant[size_t(n)]) names.push_back(node.op->name);
      for (int v : node.inputs)
        if ((producer[size_t(v)] < 0 || !in_group(producer[size_t(v)])) && !ins.count(v)) ins.insert(v), gr.inputs.push_back(v);
      if (gp.constant[size_t(n)]) continue;
      for (int v : node.outputs) {
        bool outside = returned[size_t(v)];
        for (size_t m = 0; m < g.nodes.size() && !outside; ++m)
          if (!in_group(int(m)))
            for (int u : g.nodes[m].inputs) outside = outside || u == v;
        if (outside) gr.outputs.push_back(v);
      }
    }
    for (size_t i = 0; i < names.size(); ++i) gr.ops += (i ? " -> " : "") + names[i];
  }
}

// Step 4, the memory plan: buffers made by nodes live from their step to the last step that
// reads them (or a view of them); returned buffers are fresh per call. First fit in a 64-byte
// aligned arena. Materialised: a library kernel's outputs and what a fused kernel stores; a
// group's other values live in registers.
void plan_memory(const Graph& g, const std::vector<bool>& returned, Plan& p) {
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
}

}  // namespace

Plan plan(const Graph& g, const Target& t, bool fuse) {
  Plan p;
  Grouping gp(g, t, p);
  gp.run(fuse);
  order_steps(gp, p);
  std::vector<bool> returned(g.values.size(), false);
  for (int v : g.outputs) returned[size_t(g.buffer_of(v))] = true, returned[size_t(v)] = true;
  group_io(gp, returned, p);
  plan_memory(g, returned, p);
  return p;
}

}  // namespace sinter::compiler

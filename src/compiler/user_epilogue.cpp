// Epilogue fusion into user kernels: a pointwise output's chain of elementwise consumers is
// generated into that output's store(i, v), and the kernel compiled again with it, in a
// translation unit of its own: the values the chain makes never go to memory but its last.
#include <algorithm>
#include <sstream>

#include "compiler/emit.h"
#include "compiler/passes.h"
#include "compiler/user_kernel.h"

namespace sinter::compiler {
namespace {

// How the chain reads one of its other inputs at element i of the kernel's output: a constant
// inlined, or an operand at [i], [0] or [i % n].
struct Extra {
  int value;
  enum class At { constant, element, scalar, trailing } at;
  int64_t n = 0;
  bool operand() const { return at != At::constant; }
};

struct Epilogue {
  size_t node;                 // the user kernel's node
  int output;                  // its pointwise output
  std::vector<size_t> chain;   // the consumers, in order
  std::vector<Extra> extras;
};

// How a chain node's input x can be read at the output's element i, or false.
bool extra_of(const Graph& g, int x, const Shape& shape, Extra& e) {
  const Value& v = g.values[size_t(x)];
  e.value = x;
  if (v.kind == ValueKind::node && g.nodes[size_t(v.node)].op->spelling.form == Spelling::Form::constant && !g.nodes[size_t(v.node)].op->random)
    return e.at = Extra::At::constant, true;
  if (v.meta.shape.numel() == 1) return e.at = Extra::At::scalar, true;
  if (!g.contiguous(x) || v.meta.shape.size() > shape.size()) return false;
  const size_t off = shape.size() - v.meta.shape.size();
  for (size_t d = 0; d < v.meta.shape.size(); ++d)
    if (v.meta.shape[d] != shape[off + d]) return false;
  e.n = v.meta.shape.numel();
  e.at = off == 0 ? Extra::At::element : Extra::At::trailing;
  return true;
}

// The chain of single-use, same-shape fusable nodes that starts at the kernel's output k.
bool find_chain(const Graph& g, const std::vector<int>& uses, const std::vector<int>& user, size_t n, int k, Epilogue& ep) {
  const int y = g.nodes[n].outputs[size_t(k)];
  const Shape& shape = g.values[size_t(y)].meta.shape;
  int cur = y;
  while (uses[size_t(cur)] == 1) {
    const size_t u = size_t(user[size_t(cur)]);
    const Node& node = g.nodes[u];
    if (!fusable(g, node, cpp_target()) || node.outputs.size() != 1 || g.values[size_t(node.outputs[0])].meta.shape != shape) break;
    std::vector<Extra> extras;
    bool ok = true;
    for (int x : node.inputs) {
      if (x == cur) continue;
      Extra e{};
      ok = ok && extra_of(g, x, shape, e);
      extras.push_back(e);
    }
    if (!ok || std::count(node.inputs.begin(), node.inputs.end(), cur) != 1) break;
    ep.chain.push_back(u);
    ep.extras.insert(ep.extras.end(), extras.begin(), extras.end());
    cur = node.outputs[0];
  }
  ep.node = n, ep.output = k;
  return !ep.chain.empty();
}

// The translation unit: the user's source and an output type whose store(i, v) runs the chain.
std::string fused_source(const Graph& g, const UserKernel& k, const Epilogue& ep, std::vector<int>& operand_values) {
  const Target& t = cpp_target();
  const std::string base = user_kernel_source(k);
  const size_t entry = base.find("extern \"C\" void sinter_user_kernel");
  std::ostringstream os;
  const Node& n = g.nodes[ep.node];
  const int y = n.outputs[size_t(ep.output)], last = g.nodes[ep.chain.back()].outputs[0];
  const std::string Y = t.type(g.values[size_t(y)].meta.dtype), L = t.type(g.values[size_t(last)].meta.dtype);
  os << "// epilogue of " << k.def.name << "'s output " << ep.output << ":";
  for (size_t c : ep.chain) os << " " << g.nodes[c].op->name;
  os << "   (graph nodes " << ep.chain.front() << ".." << ep.chain.back() << ")\n";
  os << "namespace {\nstruct SinterEpilogue {\n  " << L << "* p;\n  const int64_t* d;\n";
  for (size_t i = 0; i < ep.extras.size(); ++i)
    if (ep.extras[i].operand()) os << "  const " << t.type(g.values[size_t(ep.extras[i].value)].meta.dtype) << "* e" << i << ";\n";
  os << "  int64_t dim() const { return d[0]; }\n  int64_t size(int64_t i) const { return d[1 + i]; }\n"
        "  int64_t stride(int64_t i) const { return d[1 + d[0] + i]; }\n"
        "  int64_t numel() const { int64_t n = 1; for (int64_t i = 0; i < d[0]; ++i) n *= d[1 + i]; return n; }\n";
  os << "  void store(int64_t i, " << Y << " v) const {\n";
  std::map<int, std::string> name{{y, "v"}};
  for (size_t i = 0; i < ep.extras.size(); ++i) {
    const Extra& e = ep.extras[i];
    name[e.value] = "x" + std::to_string(i);
    const std::string T = t.type(g.values[size_t(e.value)].meta.dtype);
    if (e.at == Extra::At::constant) {
      const Node& c = g.nodes[size_t(g.values[size_t(e.value)].node)];
      os << "    const " << T << " x" << i << " = " << t.convert << "<" << T << ">(" << emit::literal(c.attrs.f("value")) << ");\n";
      continue;
    }
    const std::string at = e.at == Extra::At::scalar ? "0" : e.at == Extra::At::element ? "i" : "i % " + std::to_string(e.n);
    os << "    const " << T << " x" << i << " = e" << i << "[" << at << "];\n";
  }
  for (size_t c : ep.chain) name[g.nodes[c].outputs[0]] = "t" + std::to_string(g.nodes[c].outputs[0]);
  for (size_t c : ep.chain) os << "    " << emit::node_code(g, t, g.nodes[c], name) << "\n";
  os << "    p[i] = " << name.at(last) << ";\n  }\n};\n}  // namespace\n";
  // The entry: the kernel's operands in p's order (its inputs, the chain's extras, its outputs),
  // output k being the epilogue; the extras are read by index, so only their descriptors are skipped.
  const size_t nin = k.def.inputs.size(), nout = k.def.outputs.size();
  std::ostringstream entry_os;
  entry_os << "extern \"C\" void sinter_user_kernel(char* const* p, const int64_t* q, int config) {\n  const int64_t* d = q;\n";
  for (size_t i = 0; i < nin; ++i)
    entry_os << "  sinter::In<" << t.type(k.def.inputs[i]) << "> a" << i << "(p[" << i << "], d); d += 1 + 2 * d[0];\n";
  std::vector<size_t> operands;  // the extras passed as operands, in slot order
  for (size_t x = 0; x < ep.extras.size(); ++x)
    if (ep.extras[x].operand()) operands.push_back(x), entry_os << "  d += 1 + 2 * d[0];  // extra " << x << "\n";
  for (size_t o = 0; o < nout; ++o) {
    const size_t slot = nin + operands.size() + o;
    if (int(o) == ep.output) {
      entry_os << "  SinterEpilogue a" << nin + o << "{reinterpret_cast<" << L << "*>(p[" << slot << "]), d";
      for (size_t j = 0; j < operands.size(); ++j)
        entry_os << ", reinterpret_cast<const " << t.type(g.values[size_t(ep.extras[operands[j]].value)].meta.dtype) << "*>(p[" << nin + j << "])";
      entry_os << "}; d += 1 + 2 * d[0];\n";
    } else {
      entry_os << "  sinter::Out<" << t.type(k.def.outputs[o]) << "> a" << nin + o << "(p[" << slot << "], d); d += 1 + 2 * d[0];\n";
    }
  }
  entry_os << "  (void)d;\n  switch (config) {\n";
  for (size_t c = 0; c < k.def.configs.size(); ++c) {
    entry_os << "    case " << c << ": kernel<SinterConfig" << c << ">(";
    for (size_t i = 0; i < nin + nout; ++i) entry_os << (i ? ", " : "") << "a" << i;
    entry_os << "); break;\n";
  }
  entry_os << "  }\n}\n";
  for (size_t i = 0; i < nin; ++i) operand_values.push_back(n.inputs[i]);
  for (const Extra& e : ep.extras)
    if (e.operand()) operand_values.push_back(e.value);
  for (size_t o = 0; o < nout; ++o) operand_values.push_back(int(o) == ep.output ? last : n.outputs[o]);
  return base.substr(0, entry) + os.str() + entry_os.str();
}

// Whether the kernel's node can run where the chain's last node runs: nothing between writes what
// it reads, and nothing between reads its other outputs.
bool movable(const Graph& g, const std::vector<int>& user, const Epilogue& ep, const std::vector<int>& reads) {
  const size_t last = ep.chain.back();
  if (written_between(g, ep.node, last, reads)) return false;
  const Node& n = g.nodes[ep.node];
  for (size_t o = 0; o < n.outputs.size(); ++o)
    if (int(o) != ep.output)
      for (size_t m = ep.node + 1; m < last; ++m)
        for (int x : g.nodes[m].inputs)
          if (x == n.outputs[o]) return false;
  (void)user;
  return true;
}

// Replaces the kernel's node and its chain by one node of the fused variant, at the chain's end.
void fuse(Graph& g, const std::shared_ptr<UserKernel>& base, const Epilogue& ep, std::vector<bool>& removed) {
  std::vector<int> operands;
  auto variant = std::make_shared<UserKernel>();
  variant->def = base->def;
  variant->label = base->label;
  variant->tuning = base.get();
  variant->unit = fused_source(g, *base, ep, operands);
  std::string ops;
  for (size_t c : ep.chain) ops += " -> " + g.nodes[c].op->name;
  const size_t nin = operands.size() - base->def.outputs.size(), last = ep.chain.back();
  const std::shared_ptr<OpDef> op = variant_op(variant, base->def.name + ops, int(nin - base->def.inputs.size()));
  g.owned_ops.push_back(op);
  Node f;
  f.op = op.get();
  f.inputs.assign(operands.begin(), operands.begin() + long(nin));
  f.outputs.assign(operands.begin() + long(nin), operands.end());
  removed[ep.node] = true;
  for (size_t c : ep.chain) removed[c] = c != last;
  for (size_t o = 0; o < f.outputs.size(); ++o) g.values[size_t(f.outputs[o])].node = int(last), g.values[size_t(f.outputs[o])].output = int(o);
  g.nodes[last] = std::move(f);
}

}  // namespace

void fuse_user_epilogues(Graph& g) {
  std::vector<int> uses(g.values.size(), 0), user(g.values.size(), -1);
  for (size_t n = 0; n < g.nodes.size(); ++n)
    for (int v : g.nodes[n].inputs) ++uses[size_t(v)], user[size_t(v)] = int(n);
  for (int v : g.outputs) uses[size_t(v)] += 2;  // a returned value is materialised
  std::vector<bool> removed(g.nodes.size(), false);
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    UserKernel* k = removed[n] ? nullptr : user_kernel_of(g.nodes[n].op);
    if (!k || !k->unit.empty()) continue;
    std::shared_ptr<UserKernel> base;
    for (size_t o = 0; o < k->def.pointwise.size() && o < k->def.outputs.size(); ++o) {
      Epilogue ep;
      if (!k->def.pointwise[o] || k->def.effects[o].kind != Effect::Kind::fresh || !find_chain(g, uses, user, n, int(o), ep)) continue;
      std::vector<int> reads = g.nodes[n].inputs;
      for (const Extra& e : ep.extras)
        if (e.operand()) reads.push_back(e.value);
      bool taken = false;
      for (size_t c : ep.chain) taken = taken || removed[c];
      if (taken || !movable(g, user, ep, reads)) continue;
      fuse(g, user_kernel_ptr(g.nodes[n].op), ep, removed);
      break;  // one epilogue per kernel call
    }
  }
  remove_nodes(g, removed);
}

}  // namespace sinter::compiler

// The graph's verifier and text dump.
#include "compiler/graph.h"

#include <sstream>

namespace sinter::compiler {

bool Graph::contiguous(int v) const {
  const Value& x = values[size_t(v)];
  int64_t expected = 1;
  for (size_t i = x.meta.shape.size(); i-- > 0;) {
    if (x.meta.shape[i] == 1) continue;
    if (x.strides[i] != expected) return false;
    expected *= x.meta.shape[i];
  }
  return true;
}

std::string Graph::describe(int v) const {
  std::ostringstream os;
  const Value& x = values[size_t(v)];
  os << "%" << v << " " << dtype_name(x.meta.dtype) << x.meta.shape;
  return os.str();
}

void verify(const Graph& g) {
  std::vector<bool> defined(g.values.size(), false);
  for (int v : g.inputs) defined[size_t(v)] = true;
  for (int v : g.captured) defined[size_t(v)] = true;
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    const Node& node = g.nodes[n];
    for (int v : node.inputs)
      SINTER_CHECK_T(CompileError, v >= 0 && size_t(v) < g.values.size() && defined[size_t(v)], "[compile] node ", n, " (",
                     node.op->name, ") uses %", v, " before it is made");
    for (size_t k = 0; k < node.outputs.size(); ++k) {
      const int v = node.outputs[k];
      SINTER_CHECK_T(CompileError, v >= 0 && size_t(v) < g.values.size(), "[compile] node ", n, " has a bad output %", v);
      const Value& x = g.values[size_t(v)];
      SINTER_CHECK_T(CompileError, x.kind == ValueKind::node && x.node == int(n) && x.output == int(k), "[compile] %", v,
                     " does not name node ", n, " output ", k, " as its producer");
      SINTER_CHECK_T(CompileError, x.strides.size() == x.meta.shape.size(), "[compile] %", v, " has ", x.strides.size(),
                     " strides for ", x.meta.shape.size(), " dims");
      if (!node.is_view()) {  // a written or aliased output lives in its input's buffer, a fresh one in its own
        const Effect& e = node.op->effects[k];
        const bool ok = e.kind == Effect::Kind::fresh ? x.owns_buffer() : x.base == g.buffer_of(node.inputs[size_t(e.input)]);
        SINTER_CHECK_T(CompileError, ok, "[compile] %", v, " (", node.op->name, " output ", k, ") does not live in the buffer its effect names");
      }
      defined[size_t(v)] = true;
    }
  }
  for (int v : g.outputs)
    SINTER_CHECK_T(CompileError, v >= 0 && size_t(v) < g.values.size() && defined[size_t(v)], "[compile] output %", v,
                   " is not made by the graph");
}

std::string dump(const Graph& g) {
  std::ostringstream os;
  for (int v : g.inputs) os << g.describe(v) << " = input " << g.values[size_t(v)].index << "\n";
  for (int v : g.captured) os << g.describe(v) << " = captured " << g.values[size_t(v)].index << "\n";
  for (const Node& n : g.nodes) {
    for (size_t k = 0; k < n.outputs.size(); ++k) os << (k ? ", " : "") << g.describe(n.outputs[k]);
    os << " = " << n.op->name << "(";
    for (size_t i = 0; i < n.inputs.size(); ++i) os << (i ? ", " : "") << "%" << n.inputs[i];
    os << ")";
    if (!n.attrs.items().empty()) os << " " << n.attrs;
    if (n.is_view()) os << "  [view of %" << g.buffer_of(n.inputs[0]) << "]";
    if (n.mutates()) os << "  [writes in place]";
    os << "\n";
  }
  os << "return";
  for (int v : g.outputs) os << " %" << v;
  return os.str() + "\n";
}

Graph extract(const Graph& g, size_t begin, size_t end, const std::vector<int>& inputs, const std::vector<int>& outputs) {
  std::vector<size_t> nodes;
  for (size_t n = begin; n < end; ++n) nodes.push_back(n);
  return extract(g, nodes, inputs, outputs);
}

Graph extract(const Graph& g, const std::vector<size_t>& nodes, const std::vector<int>& inputs, const std::vector<int>& outputs) {
  Graph x;
  std::vector<int> map(g.values.size(), -1);
  auto add = [&](int v, Value val) {
    map[size_t(v)] = int(x.values.size());
    x.values.push_back(std::move(val));
    return map[size_t(v)];
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    Value val = g.values[size_t(inputs[i])];
    val.kind = ValueKind::input, val.index = int(i), val.base = -1, val.node = -1, val.captured = Tensor();
    x.inputs.push_back(add(inputs[i], std::move(val)));
  }
  auto use = [&](int v) {
    if (map[size_t(v)] >= 0) return map[size_t(v)];
    const Value& y = g.values[size_t(v)];
    SINTER_CHECK_T(CompileError, y.kind == ValueKind::captured, "[compile] splitting the graph: ", g.describe(v),
                   " is read by a node but made outside the part taken");
    Value val = y;
    val.index = int(x.captured.size()), val.base = -1;
    x.captured.push_back(add(v, std::move(val)));
    return map[size_t(v)];
  };
  for (size_t n : nodes) {
    Node m = g.nodes[n];
    for (int& v : m.inputs) v = use(v);
    for (int& o : m.outputs) {
      Value val = g.values[size_t(o)];
      val.node = int(x.nodes.size());
      if (val.base >= 0) {  // a view or an in-place write: the buffer of the input it aliases
        int base = -1;
        for (size_t i = 0; i < g.nodes[n].inputs.size() && base < 0; ++i)
          if (g.buffer_of(g.nodes[n].inputs[i]) == val.base) base = x.buffer_of(m.inputs[i]);
        SINTER_CHECK_T(CompileError, base >= 0, "[compile] splitting the graph: ", g.describe(o), " aliases a buffer none of its inputs has");
        val.base = base;
      }
      o = add(o, std::move(val));
    }
    x.nodes.push_back(std::move(m));
  }
  for (int v : outputs) {
    SINTER_CHECK_T(CompileError, map[size_t(v)] >= 0, "[compile] splitting the graph: output ", g.describe(v), " is not made by the part taken");
    x.outputs.push_back(map[size_t(v)]);
  }
  verify(x);
  return x;
}

}  // namespace sinter::compiler

// Source for a planned graph: one kernel per fusion group and the wrapper that runs the steps.
// The per-op spelling comes from the op table (OpDef::spelling: the functor of each op of
// elementwise.def, or a form), and every word that differs between devices from the Target, so an
// op added to elementwise.def fuses with no change here. Values are kept in their storage dtype
// between ops, converted as the eager kernels convert them: fused results equal eager ones bit for bit.
#include "compiler/codegen.h"

#include <cmath>

#include "compiler/emit.h"

namespace sinter::compiler {
namespace emit {

std::string literal(double v) {
  std::ostringstream os;
  os.precision(17);
  if (std::isinf(v)) return v > 0 ? "INFINITY" : "-INFINITY";
  if (std::isnan(v)) return "NAN";
  os << v;
  std::string s = os.str();
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string stride_expr(int64_t s, const std::string& var, Params& q, std::ostringstream& decl) {
  if (s == 0 || s == 1) return std::to_string(s);
  decl << "  const int64_t " << var << " = " << q.add(s) << ";\n";
  return var;
}

std::string maybe_parallel(const Target& t, const std::string& numel, const std::string& parallel, const std::string& serial,
                           const std::string& loop) {
  return "  if (" + numel + " >= " + std::to_string(t.parallel_from) + ") {\n" + parallel + "\n" + loop + "  } else {\n" + serial +
         loop + "  }\n";
}

std::string pointers(const Graph& g, const Target& t, const Group& gr) {
  std::ostringstream os;
  size_t slot = 0;
  for (int v : gr.inputs) {
    const std::string T = t.type(g.values[size_t(v)].meta.dtype);
    os << "  const " << T << "* " << t.restrict_ptr << " in" << slot << " = reinterpret_cast<const " << T << "*>(p[" << slot << "]);\n";
    ++slot;
  }
  for (int v : gr.outputs) {
    const std::string T = t.type(g.values[size_t(v)].meta.dtype);
    os << "  " << T << "* " << t.restrict_ptr << " out" << slot - gr.inputs.size() << " = reinterpret_cast<" << T << "*>(p[" << slot
       << "]);\n";
    ++slot;
  }
  return os.str();
}

namespace {

// A functor of scalar_fns.h on the inputs converted to their common compute type.
std::string functor_code(const Graph& g, const Target& t, const Node& n, const std::string& O, const std::vector<std::string>& arg) {
  const Spelling& s = n.op->spelling;
  std::ostringstream os;
  if (n.inputs.size() == 1) {
    os << O << "(" << t.functors << s.functor << "{}(" << t.compute_type << "<" << O << ">(" << t.convert << "<" << O << ">(" << arg[0]
       << "))))";
    return os.str();
  }
  DType td = promote_types(g.values[size_t(n.inputs[0])].meta.dtype, g.values[size_t(n.inputs[1])].meta.dtype);
  if (s.true_div && !is_floating(td)) td = DType::f32;
  const std::string T = t.type(td), C = t.compute_type + "<" + T + ">";
  os << O << "(" << t.functors << s.functor << "{}(" << C << "(" << t.convert << "<" << T << ">(" << arg[0] << ")), " << C << "("
     << t.convert << "<" << T << ">(" << arg[1] << "))))";
  return os.str();
}

std::string clamp_code(const Target& t, const Node& n, const std::string& O, const std::string& x) {
  const std::string C = t.compute_type + "<" + O + ">";
  std::ostringstream os;
  os << O << "([&] { " << C << " v = " << C << "(" << x << ");";
  if (n.attrs.has("min")) os << " if (v < " << C << "(" << literal(n.attrs.f("min")) << ")) v = " << C << "(" << literal(n.attrs.f("min")) << ");";
  if (n.attrs.has("max")) os << " if (v > " << C << "(" << literal(n.attrs.f("max")) << ")) v = " << C << "(" << literal(n.attrs.f("max")) << ");";
  os << " return v; }())";
  return os.str();
}

}  // namespace

std::map<int, std::string> integer_constants(const Graph& g, const std::vector<int>& nodes, Params& q) {
  std::map<int, std::string> out;
  for (int i : nodes) {
    const Node& n = g.nodes[size_t(i)];
    const DType dt = g.values[size_t(n.outputs[0])].meta.dtype;
    if (n.op->spelling.form != Spelling::Form::constant || is_floating(dt) || dt == DType::boolean) continue;
    const double v = n.attrs.f("value");
    if (v == std::trunc(v) && std::fabs(v) < 9.0e15) out[n.outputs[0]] = q.add(int64_t(v));
  }
  return out;
}

std::string node_code(const Graph& g, const Target& t, const Node& n, const std::map<int, std::string>& name,
                      const std::map<int, std::string>* params) {
  std::vector<std::string> arg;
  for (int v : n.inputs) arg.push_back(name.at(v));
  const int out = n.outputs[0];
  const std::string O = t.type(g.values[size_t(out)].meta.dtype), to_O = t.convert + "<" + O + ">";
  std::ostringstream os;
  os << "const " << O << " " << name.at(out) << " = ";
  switch (n.op->spelling.form) {
    case Spelling::Form::constant:
      if (params && params->count(out)) os << to_O << "(" << params->at(out) << ")";
      else os << to_O << "(" << literal(n.attrs.f("value")) << ")";
      break;
    case Spelling::Form::cast: os << to_O << "(" << arg[0] << ")"; break;
    case Spelling::Form::select: os << "(" << arg[0] << " ? " << to_O << "(" << arg[1] << ") : " << to_O << "(" << arg[2] << "))"; break;
    case Spelling::Form::fill:  // eager: where(mask, value in x's dtype, x)
      os << "(" << arg[1] << " ? " << to_O << "(" << literal(n.attrs.f("value")) << ") : " << arg[0] << ")";
      break;
    case Spelling::Form::clamp: os << clamp_code(t, n, O, arg[0]); break;
    case Spelling::Form::functor: os << functor_code(g, t, n, O, arg); break;
  }
  os << ";";
  return os.str();
}

std::map<int, std::vector<int64_t>> broadcast_strides(const Graph& g, const Group& gr) {
  const Shape& S = gr.shape;
  std::map<int, std::vector<int64_t>> st;
  auto add = [&](int v) {
    const Value& x = g.values[size_t(v)];
    std::vector<int64_t> s(S.size(), 0);
    const size_t off = S.size() - x.meta.shape.size();
    for (size_t d = 0; d < x.meta.shape.size(); ++d) s[off + d] = x.meta.shape[d] == 1 && S[off + d] != 1 ? 0 : x.strides[d];
    st[v] = s;
  };
  for (int v : gr.inputs) add(v);
  for (int v : gr.outputs) add(v);
  return st;
}

}  // namespace emit

Slots assign_slots(const Graph& g, const Plan& p) {
  Slots s;
  s.of_value.assign(g.values.size(), -1);
  for (int v : g.inputs) s.of_value[size_t(v)] = s.count++;
  for (int v : g.captured) s.of_value[size_t(v)] = s.count++;
  for (size_t v = 0; v < g.values.size(); ++v)  // buffers made per call (returned)
    if (p.fresh[v]) s.of_value[v] = s.count++;
  s.arena = s.count++;
  for (size_t v = 0; v < g.values.size(); ++v) {  // views (and a group's values kept in registers: none)
    if (p.arena_offset[v] >= 0) s.of_value[v] = s.arena;
    else if (s.of_value[v] < 0) s.of_value[v] = s.of_value[size_t(g.buffer_of(int(v)))];
  }
  return s;
}

namespace {

// "k3_mul_add_gelu_tanh": the group's index and its ops (constants left out), at most ~60 characters.
std::string kernel_name(const Graph& g, const Group& gr, size_t gi) {
  std::string n = "k" + std::to_string(gi);
  for (int node : gr.nodes)
    if (g.nodes[size_t(node)].op->spelling.form != Spelling::Form::constant) n += "_" + g.nodes[size_t(node)].op->name;
  if (n.size() > 60) n = n.substr(0, 60) + "_" + std::to_string(gi);
  return n;
}

// The wrapper: runs the steps in order, fused kernels on their operands' addresses (slot base plus
// a byte offset parameter), library kernels through the callback.
std::string wrapper_code(const Graph& g, const Plan& p, const Slots& slots, const Target& t, const std::vector<std::string>& names,
                         const std::vector<size_t>& base, emit::Params& P) {
  auto address = [&](int v) {
    const Value& x = g.values[size_t(v)];
    const int64_t at = p.arena_offset[size_t(g.buffer_of(v))];
    const int64_t bytes = (at >= 0 ? at : 0) + x.offset * dtype_size(x.meta.dtype);
    return "s[" + std::to_string(slots.of_value[size_t(v)]) + "] + " + P.add(bytes, "P");
  };
  std::ostringstream os;
  os << t.entry << "(char* const* s, const int64_t* P, void (*call)(void*, int), void* ctx) {\n";
  os << "  (void)s; (void)P; (void)call; (void)ctx;\n";
  for (size_t i = 0; i < p.steps.size(); ++i) {
    const Step& st = p.steps[i];
    if (st.group < 0) {
      os << "  call(ctx, " << i << ");  // " << g.nodes[size_t(st.node)].op->name << " (node " << st.node << ")\n";
      continue;
    }
    const Group& gr = p.groups[size_t(st.group)];
    os << "  { char* const p[] = {";
    bool first = true;
    for (int v : gr.inputs) os << (first ? "" : ", ") << address(v), first = false;
    for (int v : gr.outputs) os << (first ? "" : ", ") << address(v), first = false;
    if (first) os << "nullptr";
    os << "}; " << names[size_t(st.group)] << "(p, P + " << base[size_t(st.group)] << "); }\n";
  }
  os << "}\n";
  return os.str();
}

}  // namespace

Generated generate(const Graph& g, const Plan& p, const Slots& slots, const std::string& name, const Target& t) {
  std::ostringstream os;
  os << "// Generated by sinter::compile for '" << name << "': " << p.groups.size() << " fused kernels, " << p.steps.size()
     << " steps.\n" << t.prelude << "\n";
  std::vector<std::string> names(p.groups.size());
  std::vector<size_t> base(p.groups.size());  // where each kernel's parameters start in P
  std::vector<int64_t> params;
  for (size_t gi = 0; gi < p.groups.size(); ++gi) {
    const Group& gr = p.groups[gi];
    names[gi] = kernel_name(g, gr, gi);
    emit::Params q;
    os << (gr.row >= 0 ? emit::row_kernel(g, t, gr, names[gi], q) : emit::elementwise_kernel(g, t, gr, names[gi], q)) << "\n";
    base[gi] = params.size();
    params.insert(params.end(), q.values.begin(), q.values.end());
  }
  emit::Params P{std::move(params)};  // then the byte offsets of the values the kernels read and write
  os << wrapper_code(g, p, slots, t, names, base, P);
  return {os.str(), std::move(P.values)};
}

}  // namespace sinter::compiler

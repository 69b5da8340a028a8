// C++ source for a planned graph: one kernel per fusion group and the wrapper that runs the steps.
// The per-op spelling comes from elementwise.def (the functor of each op), so an op added there
// is fused with no change here; values are kept in their storage dtype between ops, converted as
// the eager kernels convert them, so fused results equal eager ones bit for bit.
#include "compiler/codegen.h"

#include <cmath>
#include <map>
#include <set>
#include <sstream>

namespace sinter::compiler {
namespace {

struct Spelling {
  const char* functor;
  bool binary;
  bool true_div;
};
const std::map<std::string, Spelling>& spellings() {
  static const std::map<std::string, Spelling> m = [] {
    std::map<std::string, Spelling> s;
#define UNARY(F, name, rule, dx) s[#name] = {#F, false, false};
#define BINARY(F, name, rule, da, db) s[#name] = {#F, true, std::string_view(#rule) == "true_div"};
#include "ops/elementwise.def"
#undef UNARY
#undef BINARY
    return s;
  }();
  return m;
}

const char* ctype(DType t) {
  switch (t) {
    case DType::f32: return "float";
    case DType::f64: return "double";
    case DType::bf16: return "sinter::bf16";
    case DType::i64: return "int64_t";
    case DType::i32: return "int32_t";
    case DType::boolean: return "bool";
    default: SINTER_THROW(CompileError, "[compile] no spelling for dtype ", t, " in generated code");
  }
}

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

// The element index of value v at the loop's multi-index, given the group's (merged) dims.
struct Loop {
  std::vector<int64_t> dims;                 // merged iteration dims
  std::map<int, std::vector<int64_t>> strides;  // by value: element strides over `dims` (0: broadcast)
};

Loop make_loop(const Graph& g, const Group& gr) {
  const Shape& S = gr.shape;
  std::vector<int> operands(gr.inputs);
  operands.insert(operands.end(), gr.outputs.begin(), gr.outputs.end());
  std::map<int, std::vector<int64_t>> full;
  for (int v : operands) {
    const Value& x = g.values[size_t(v)];
    std::vector<int64_t> st(S.size(), 0);
    const size_t off = S.size() - x.meta.shape.size();
    for (size_t d = 0; d < x.meta.shape.size(); ++d)
      st[off + d] = x.meta.shape[d] == 1 && S[off + d] != 1 ? 0 : x.strides[d];
    full[v] = st;
  }
  Loop l;
  for (size_t d = 0; d < S.size(); ++d) {
    if (S[d] == 1) continue;
    bool merge = !l.dims.empty();
    for (auto& [v, st] : full) merge = merge && l.strides[v].back() == st[d] * S[d];
    if (merge) {
      l.dims.back() *= S[d];
      for (auto& [v, st] : full) l.strides[v].back() = st[d];
    } else {
      l.dims.push_back(S[d]);
      for (auto& [v, st] : full) l.strides[v].push_back(st[d]);
    }
  }
  if (l.dims.empty()) {
    l.dims.push_back(1);
    for (auto& [v, st] : full) l.strides[v].push_back(0);
  }
  return l;
}

std::string node_code(const Graph& g, const Node& n, const std::map<int, std::string>& name) {
  auto arg = [&](size_t i) { return name.at(n.inputs[i]); };
  const int out = n.outputs[0];
  const DType od = g.values[size_t(out)].meta.dtype;
  const std::string O = ctype(od), t = name.at(out);
  const std::string& op = n.op->name;
  std::ostringstream os;
  os << "const " << O << " " << t << " = ";
  if (op == "full") {
    os << "sinter::jit::cvt<" << O << ">(" << literal(n.attrs.f("value")) << ")";
  } else if (op == "cast") {
    os << "sinter::jit::cvt<" << O << ">(" << arg(0) << ")";
  } else if (op == "where") {
    os << "(" << arg(0) << " ? sinter::jit::cvt<" << O << ">(" << arg(1) << ") : sinter::jit::cvt<" << O << ">(" << arg(2) << "))";
  } else if (op == "masked_fill") {  // eager: where(mask, value in x's dtype, x)
    os << "(" << arg(1) << " ? sinter::jit::cvt<" << O << ">(" << literal(n.attrs.f("value")) << ") : " << arg(0) << ")";
  } else if (op == "clamp") {
    const std::string C = "sinter::jit::compute_t<" + O + ">";
    os << O << "([&] { " << C << " v = " << C << "(" << arg(0) << ");";
    if (n.attrs.has("min")) os << " if (v < " << C << "(" << literal(n.attrs.f("min")) << ")) v = " << C << "(" << literal(n.attrs.f("min")) << ");";
    if (n.attrs.has("max")) os << " if (v > " << C << "(" << literal(n.attrs.f("max")) << ")) v = " << C << "(" << literal(n.attrs.f("max")) << ");";
    os << " return v; }())";
  } else {
    const Spelling& s = spellings().at(op);
    if (!s.binary) {
      os << O << "(sinter::fn::" << s.functor << "{}(sinter::jit::compute_t<" << O << ">(sinter::jit::cvt<" << O << ">(" << arg(0) << "))))";
    } else {
      DType td = promote_types(g.values[size_t(n.inputs[0])].meta.dtype, g.values[size_t(n.inputs[1])].meta.dtype);
      if (s.true_div && !is_floating(td)) td = DType::f32;
      const std::string T = ctype(td), C = "sinter::jit::compute_t<" + T + ">";
      os << O << "(sinter::fn::" << s.functor << "{}(" << C << "(sinter::jit::cvt<" << T << ">(" << arg(0) << ")), " << C
         << "(sinter::jit::cvt<" << T << ">(" << arg(1) << "))))";
    }
  }
  os << ";";
  return os.str();
}

// Sizes, strides and offsets reach generated code at run time, as the kernel's parameters (q[i])
// and the wrapper's (P[i]): the source depends on the graph's structure, not on its sizes, so a
// graph traced at other sizes (a new sequence length) produces the same source and reuses the
// compiled code. Only structural facts are spelled in the source: which dims merge, which
// strides are 0 (broadcast) or 1 (contiguous, vectorizable), and a row reduction's row length.
struct Params {
  std::vector<int64_t> values;
  std::string add(int64_t v, const char* array = "q") {
    values.push_back(v);
    return std::string(array) + "[" + std::to_string(values.size() - 1) + "]";
  }
};

// An operand's stride: a literal when structural (0 or 1), else a named parameter.
std::string stride_expr(int64_t s, const std::string& var, Params& q, std::ostringstream& decl) {
  if (s == 0 || s == 1) return std::to_string(s);
  decl << "  const int64_t " << var << " = " << q.add(s) << ";\n";
  return var;
}

// `loop` twice: with a thread team when the work is large, without one (no team to start) below.
std::string maybe_parallel(const std::string& numel, const std::string& parallel, const std::string& serial, const std::string& loop) {
  return "  if (" + numel + " >= 32768) {\n" + parallel + "\n" + loop + "  } else {\n" + serial + loop + "  }\n";
}

std::string kernel_code(const Graph& g, const Group& gr, const std::string& fname, Params& q) {
  const Loop l = make_loop(g, gr);
  std::ostringstream os;
  os << "// fused: " << gr.ops << "   (graph nodes " << gr.nodes.front() << ".." << gr.nodes.back() << ")\n";
  os << "static void " << fname << "(char* const* p, const int64_t* q) {\n";
  std::map<int, std::string> name;
  size_t slot = 0;
  for (int v : gr.inputs) {
    const std::string T = ctype(g.values[size_t(v)].meta.dtype);
    os << "  const " << T << "* __restrict in" << slot << " = reinterpret_cast<const " << T << "*>(p[" << slot << "]);\n";
    ++slot;
  }
  for (int v : gr.outputs) {
    const std::string T = ctype(g.values[size_t(v)].meta.dtype);
    os << "  " << T << "* __restrict out" << slot - gr.inputs.size() << " = reinterpret_cast<" << T << "*>(p[" << slot << "]);\n";
    ++slot;
  }
  const size_t nd = l.dims.size();
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < nd; ++d) rows *= l.dims[d];
  os << "  const int64_t rows = " << q.add(rows) << ", inner = " << q.add(l.dims[nd - 1]) << ";\n";
  os << "  (void)rows;\n";
  for (size_t d = 0; d + 1 < nd; ++d) os << "  const int64_t n" << d << " = " << q.add(l.dims[d]) << ";\n";
  std::vector<int> operands(gr.inputs);
  operands.insert(operands.end(), gr.outputs.begin(), gr.outputs.end());
  std::map<int, std::vector<std::string>> st;  // by operand: its stride in each merged dim
  for (int v : operands)
    for (size_t d = 0; d < nd; ++d)
      st[v].push_back(stride_expr(l.strides.at(v)[d], "s" + std::to_string(v) + "_" + std::to_string(d), q, os));
  auto index = [&](int v, const char* j) {  // element offset of v at row r (its base b<v>) and inner index j
    const std::string& s = st.at(v)[nd - 1];
    return "b" + std::to_string(v) + (s == "0" ? std::string() : s == "1" ? std::string(" + ") + j : " + " + std::string(j) + " * " + s);
  };
  auto body = [&](const std::string& indent) {
    std::ostringstream b;
    for (size_t i = 0; i < gr.inputs.size(); ++i) {
      const int v = gr.inputs[i];
      name[v] = "a" + std::to_string(v);
      b << indent << "const " << ctype(g.values[size_t(v)].meta.dtype) << " " << name[v] << " = in" << i << "[" << index(v, "j") << "];\n";
    }
    for (int n : gr.nodes)
      for (int v : g.nodes[size_t(n)].outputs) name[v] = "t" + std::to_string(v);
    for (int n : gr.nodes) b << indent << node_code(g, g.nodes[size_t(n)], name) << "\n";
    for (size_t i = 0; i < gr.outputs.size(); ++i) b << indent << "out" << i << "[" << index(gr.outputs[i], "j") << "] = " << name[gr.outputs[i]] << ";\n";
    return b.str();
  };
  std::ostringstream loop;
  if (nd == 1) {
    for (int v : operands) os << "  const int64_t b" << v << " = 0;\n";
    loop << "  for (int64_t j = 0; j < inner; ++j) {\n" << body("    ") << "  }\n";
    os << maybe_parallel("inner", "#pragma omp parallel for simd schedule(static)", "#pragma omp simd\n", loop.str());
  } else {
    loop << "  for (int64_t r = 0; r < rows; ++r) {\n";
    loop << "    int64_t rem = r;\n";
    for (size_t d = nd - 1; d-- > 0;) {
      loop << "    const int64_t i" << d << " = rem % n" << d << ";";
      loop << (d > 0 ? " rem /= n" + std::to_string(d) + ";\n" : "\n");
    }
    for (int v : operands) {
      loop << "    const int64_t b" << v << " = 0";
      for (size_t d = 0; d + 1 < nd; ++d)
        if (st.at(v)[d] != "0") loop << " + i" << d << " * " << st.at(v)[d];
      loop << ";\n";
    }
    loop << "#pragma omp simd\n";
    loop << "    for (int64_t j = 0; j < inner; ++j) {\n" << body("      ") << "    }\n  }\n";
    os << maybe_parallel("rows * inner", "#pragma omp parallel for schedule(static)", "", loop.str());
  }
  os << "}\n";
  return os.str();
}

// A group around a row reduction (layer_norm, rms_norm over the last dim): per row, pass 1 runs the
// prologue and keeps the reduction's input in a row buffer (in its compute type), the statistics
// are summed in double, and pass 2 normalises and runs the epilogue.
std::string row_kernel_code(const Graph& g, const Group& gr, const std::string& fname, Params& q) {
  const Node& R = g.nodes[size_t(gr.row)];
  const Shape& S = gr.shape;
  const int64_t D = S.back(), rows = D ? S.numel() / D : 0;
  const DType xt = g.values[size_t(R.inputs[0])].meta.dtype;
  const std::string T = ctype(xt), C = "sinter::jit::compute_t<" + T + ">";
  std::ostringstream os;
  os << "// fused: " << gr.ops << "   (graph nodes " << gr.nodes.front() << ".." << gr.nodes.back() << "; rows of " << D << ")\n";
  os << "static void " << fname << "(char* const* p, const int64_t* q) {\n";
  std::map<int, std::string> name;
  std::map<int, std::vector<int64_t>> st;  // broadcast strides over S
  std::vector<int> operands(gr.inputs);
  operands.insert(operands.end(), gr.outputs.begin(), gr.outputs.end());
  for (int v : operands) {
    const Value& x = g.values[size_t(v)];
    std::vector<int64_t> s(S.size(), 0);
    const size_t off = S.size() - x.meta.shape.size();
    for (size_t d = 0; d < x.meta.shape.size(); ++d) s[off + d] = x.meta.shape[d] == 1 && S[off + d] != 1 ? 0 : x.strides[d];
    st[v] = s;
  }
  for (size_t i = 0; i < gr.inputs.size(); ++i) {
    const std::string VT = ctype(g.values[size_t(gr.inputs[i])].meta.dtype);
    os << "  const " << VT << "* __restrict in" << i << " = reinterpret_cast<const " << VT << "*>(p[" << i << "]);\n";
  }
  for (size_t i = 0; i < gr.outputs.size(); ++i) {
    const std::string VT = ctype(g.values[size_t(gr.outputs[i])].meta.dtype);
    os << "  " << VT << "* __restrict out" << i << " = reinterpret_cast<" << VT << "*>(p[" << gr.inputs.size() + i << "]);\n";
  }
  if (D == 0) return os.str() + "}\n";
  os << "  const int64_t rows = " << q.add(rows) << ";\n";
  for (size_t d = 0; d + 1 < S.size(); ++d) os << "  const int64_t n" << d << " = " << q.add(S[d]) << ";\n";
  std::map<int, std::vector<std::string>> se;  // strides as literals (0, 1) or parameters
  for (int v : operands)
    for (size_t d = 0; d < S.size(); ++d) se[v].push_back(stride_expr(st[v][d], "s" + std::to_string(v) + "_" + std::to_string(d), q, os));
  std::ostringstream head;
  head << "  for (int64_t r = 0; r < rows; ++r) {\n    " << C << " xr[" << D << "];\n    int64_t rem = r;\n";
  for (size_t d = S.size() - 1; d-- > 0;) head << "    const int64_t i" << d << " = rem % n" << d << "; rem /= n" << d << ";\n";
  for (int v : operands) {
    head << "    const int64_t b" << v << " = 0";
    for (size_t d = 0; d + 1 < S.size(); ++d)
      if (se[v][d] != "0") head << " + i" << d << " * " << se[v][d];
    head << ";\n";
  }
  auto at = [&](int v) {
    const std::string& s = se[v].back();
    return "b" + std::to_string(v) + (s == "0" ? std::string() : s == "1" ? std::string(" + j") : " + j * " + s);
  };
  const std::ostringstream::pos_type body_start = os.tellp();
  os << head.str();
  auto pass = [&](bool first) {
    std::ostringstream b;
    std::vector<int> nodes;
    for (int n : gr.nodes)
      if (g.nodes[size_t(n)].op->name == "full" || (first ? n < gr.row : n > gr.row)) nodes.push_back(n);
    std::set<int> reads;
    for (int n : nodes) for (int v : g.nodes[size_t(n)].inputs) reads.insert(v);
    if (first) reads.insert(R.inputs[0]);
    else for (size_t i = 1; i < R.inputs.size(); ++i) reads.insert(R.inputs[i]);
    for (size_t i = 0; i < gr.inputs.size(); ++i) {
      const int v = gr.inputs[i];
      if (!reads.count(v)) continue;
      name[v] = "a" + std::to_string(v);
      b << "      const " << ctype(g.values[size_t(v)].meta.dtype) << " " << name[v] << " = in" << i << "[" << at(v) << "];\n";
    }
    for (int n : nodes) for (int v : g.nodes[size_t(n)].outputs) name[v] = "t" + std::to_string(v);
    if (!first) {
      const int y = R.outputs[0];
      name[y] = "t" + std::to_string(y);
      const std::string w = "sinter::jit::cvt<" + std::string(C) + ">(" + name.at(R.inputs[1]) + ")";
      if (R.op->name == "layer_norm")
        b << "      const " << T << " " << name[y] << " = " << T << "((xr[j] - m) * rstd * " << w << " + sinter::jit::cvt<" << C << ">(" << name.at(R.inputs[2]) << "));\n";
      else
        b << "      const " << T << " " << name[y] << " = " << T << "(xr[j] * rstd * " << w << ");\n";
    }
    for (int n : nodes) b << "      " << node_code(g, g.nodes[size_t(n)], name) << "\n";
    if (first) b << "      xr[j] = " << C << "(sinter::jit::cvt<" << T << ">(" << name.at(R.inputs[0]) << "));\n";
    for (size_t i = 0; i < gr.outputs.size(); ++i) {
      const int v = gr.outputs[i], producer = g.values[size_t(v)].node;
      if (first ? producer < gr.row : producer >= gr.row) b << "      out" << i << "[" << at(v) << "] = " << name.at(v) << ";\n";
    }
    return b.str();
  };
  os << "    for (int64_t j = 0; j < " << D << "; ++j) {\n" << pass(true) << "    }\n";
  // Sums in 16 independent lanes of the compute type, then the lanes in order: the eager kernels'
  // order (cpu/simd/lanes.h), and a loop the compiler vectorizes.
  auto lane_sum = [&](const std::string& var, const std::string& term) {
    os << "    " << C << " " << var << " = 0;\n    {\n      " << C << " acc[16] = {};\n      int64_t j = 0;\n";
    os << "      for (; j + 16 <= " << D << "; j += 16)\n        for (int l = 0; l < 16; ++l) { const int64_t i = j + l; acc[l] += " << term << "; }\n";
    os << "      for (int l = 0; j < " << D << "; ++j, ++l) { const int64_t i = j; acc[l] += " << term << "; }\n";
    os << "      for (int l = 0; l < 16; ++l) " << var << " += acc[l];\n    }\n";
  };
  const std::string eps = C + "(" + literal(R.attrs.f("eps")) + ")";
  if (R.op->name == "layer_norm") {
    lane_sum("sum", "xr[i]");
    os << "    const " << C << " m = sum / " << C << "(" << D << ");\n";
    lane_sum("sq", "(xr[i] - m) * (xr[i] - m)");
    os << "    const " << C << " rstd = " << C << "(1) / std::sqrt(sq / " << C << "(" << D << ") + " << eps << ");\n";
  } else {
    lane_sum("sq", "xr[i] * xr[i]");
    os << "    const " << C << " rstd = " << C << "(1) / std::sqrt(sq / " << C << "(" << D << ") + " << eps << ");\n";
  }
  os << "#pragma omp simd\n    for (int64_t j = 0; j < " << D << "; ++j) {\n" << pass(false) << "    }\n  }\n";
  // The row loop with a thread team when the work is large, without one below.
  std::string text = os.str();
  const std::string loop = text.substr(size_t(body_start));
  text.resize(size_t(body_start));
  return text + maybe_parallel("rows * " + std::to_string(D), "#pragma omp parallel for schedule(static)", "", loop) + "}\n";
}

}  // namespace

bool spelled_op(const std::string& name) {
  return spellings().count(name) || name == "full" || name == "cast" || name == "where" || name == "clamp" || name == "masked_fill";
}

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

Generated generate_cpp(const Graph& g, const Plan& p, const Slots& slots, const std::string& name) {
  Generated out;
  std::ostringstream os;
  os << "// Generated by sinter::compile for '" << name << "': " << p.groups.size() << " fused kernels, " << p.steps.size()
     << " steps.\n#include \"sinter_jit_prelude.h\"\n\n";
  std::vector<std::string> names(p.groups.size());
  std::vector<size_t> base(p.groups.size());  // where each kernel's parameters start in P
  for (size_t gi = 0; gi < p.groups.size(); ++gi) {
    const Group& gr = p.groups[gi];
    std::string n = "k" + std::to_string(gi);
    for (int node : gr.nodes)
      if (g.nodes[size_t(node)].op->name != "full") n += "_" + g.nodes[size_t(node)].op->name;
    if (n.size() > 60) n = n.substr(0, 60) + "_" + std::to_string(gi);
    names[gi] = n;
    Params q;
    os << (gr.row >= 0 ? row_kernel_code(g, gr, n, q) : kernel_code(g, gr, n, q)) << "\n";
    base[gi] = out.params.size();
    out.params.insert(out.params.end(), q.values.begin(), q.values.end());
  }
  Params wrapper{std::move(out.params)};  // then the byte offsets of the values the kernels read and write
  auto address = [&](int v) {
    const Value& x = g.values[size_t(v)];
    const int64_t bytes = (p.arena_offset[size_t(g.buffer_of(v))] >= 0 ? p.arena_offset[size_t(g.buffer_of(v))] : 0) +
                          x.offset * dtype_size(x.meta.dtype);
    return "s[" + std::to_string(slots.of_value[size_t(v)]) + "] + " + wrapper.add(bytes, "P");
  };
  os << "extern \"C\" void sinter_graph_run(char* const* s, const int64_t* P, void (*call)(void*, int), void* ctx) {\n";
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
  out.source = os.str();
  out.params = std::move(wrapper.values);
  return out;
}

}  // namespace sinter::compiler

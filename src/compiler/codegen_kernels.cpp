// The two shapes of fused kernel: an elementwise group over its (merged) loop dims, and a group
// around a row reduction (layer_norm, rms_norm over the last dim) with its prologue and epilogue.
#include <set>

#include "compiler/emit.h"

namespace sinter::compiler::emit {
namespace {

// The group's iteration dims, adjacent dims merged where every operand's strides allow.
struct Loop {
  std::vector<int64_t> dims;                    // merged iteration dims
  std::map<int, std::vector<int64_t>> strides;  // by value: element strides over `dims` (0: broadcast)
};

Loop make_loop(const Graph& g, const Group& gr) {
  const Shape& S = gr.shape;
  const std::map<int, std::vector<int64_t>> full = broadcast_strides(g, gr);
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

std::vector<int> operands_of(const Group& gr) {
  std::vector<int> operands(gr.inputs);
  operands.insert(operands.end(), gr.outputs.begin(), gr.outputs.end());
  return operands;
}

// "b<v> + j * s": operand v's element at its row base and inner index j, given its inner stride.
std::string element_at(int v, const std::string& inner_stride, const char* j) {
  const std::string& s = inner_stride;
  return "b" + std::to_string(v) + (s == "0" ? std::string() : s == "1" ? std::string(" + ") + j : " + " + std::string(j) + " * " + s);
}

// Per row r: the multi-index i0.. of the outer dims n0.., and each operand's base b<v> from them.
std::string row_bases(const std::vector<int>& operands, const std::map<int, std::vector<std::string>>& st, size_t outer) {
  std::ostringstream loop;
  for (size_t d = outer; d-- > 0;) {
    loop << "    const int64_t i" << d << " = rem % n" << d << ";";
    loop << (d > 0 ? " rem /= n" + std::to_string(d) + ";\n" : "\n");
  }
  for (int v : operands) {
    loop << "    const int64_t b" << v << " = 0";
    for (size_t d = 0; d < outer; ++d)
      if (st.at(v)[d] != "0") loop << " + i" << d << " * " << st.at(v)[d];
    loop << ";\n";
  }
  return loop.str();
}

}  // namespace

std::string elementwise_kernel(const Graph& g, const Target& t, const Group& gr, const std::string& fname, Params& q) {
  const Loop l = make_loop(g, gr);
  std::ostringstream os;
  os << "// fused: " << gr.ops << "   (graph nodes " << gr.nodes.front() << ".." << gr.nodes.back() << ")\n";
  os << t.kernel << " " << fname << "(char* const* p, const int64_t* q) {\n" << pointers(g, t, gr);
  const size_t nd = l.dims.size();
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < nd; ++d) rows *= l.dims[d];
  os << "  const int64_t rows = " << q.add(rows) << ", inner = " << q.add(l.dims[nd - 1]) << ";\n";
  os << "  (void)rows;\n";
  for (size_t d = 0; d + 1 < nd; ++d) os << "  const int64_t n" << d << " = " << q.add(l.dims[d]) << ";\n";
  const std::vector<int> operands = operands_of(gr);
  std::map<int, std::vector<std::string>> st;  // by operand: its stride in each merged dim
  for (int v : operands)
    for (size_t d = 0; d < nd; ++d) st[v].push_back(stride_expr(l.strides.at(v)[d], "s" + std::to_string(v) + "_" + std::to_string(d), q, os));
  std::map<int, std::string> name;
  const std::map<int, std::string> consts = integer_constants(g, gr.nodes, q);
  auto body = [&](const std::string& indent) {
    std::ostringstream b;
    for (size_t i = 0; i < gr.inputs.size(); ++i) {
      const int v = gr.inputs[i];
      name[v] = "a" + std::to_string(v);
      b << indent << "const " << t.type(g.values[size_t(v)].meta.dtype) << " " << name[v] << " = in" << i << "[" << element_at(v, st.at(v)[nd - 1], "j") << "];\n";
    }
    for (int n : gr.nodes)
      for (int v : g.nodes[size_t(n)].outputs) name[v] = "t" + std::to_string(v);
    for (int n : gr.nodes) b << indent << node_code(g, t, g.nodes[size_t(n)], name, &consts) << "\n";
    for (size_t i = 0; i < gr.outputs.size(); ++i)
      b << indent << "out" << i << "[" << element_at(gr.outputs[i], st.at(gr.outputs[i])[nd - 1], "j") << "] = " << name[gr.outputs[i]] << ";\n";
    return b.str();
  };
  std::ostringstream loop;
  if (nd == 1) {
    for (int v : operands) os << "  const int64_t b" << v << " = 0;\n";
    loop << "  for (int64_t j = 0; j < inner; ++j) {\n" << body("    ") << "  }\n";
    os << maybe_parallel(t, "inner", t.parallel_flat, t.simd + "\n", loop.str());
  } else {
    loop << "  for (int64_t r = 0; r < rows; ++r) {\n    int64_t rem = r;\n" << row_bases(operands, st, nd - 1);
    loop << t.simd << "\n    for (int64_t j = 0; j < inner; ++j) {\n" << body("      ") << "    }\n  }\n";
    os << maybe_parallel(t, "rows * inner", t.parallel_rows, "", loop.str());
  }
  os << "}\n";
  return os.str();
}

namespace {

// A group around a row reduction: per row, pass 1 runs the prologue and keeps the reduction's
// input in a row buffer (in its compute type), the statistics are summed in 16 lanes, and pass 2
// normalises and runs the epilogue.
struct RowKernel {
  const Graph& g;
  const Target& t;
  const Group& gr;
  const Node& R;
  int64_t D;
  std::string T, C;  // the reduction input's type and its compute type
  std::map<int, std::vector<std::string>> se;  // by operand: strides as literals (0, 1) or parameters
  std::map<int, std::string> name;

  RowKernel(const Graph& g_, const Target& t_, const Group& gr_)
      : g(g_), t(t_), gr(gr_), R(g_.nodes[size_t(gr_.row)]), D(gr_.shape.back()),
        T(t_.type(g_.values[size_t(R.inputs[0])].meta.dtype)), C(t_.compute_type + "<" + T + ">") {}

  std::string at(int v) const { return element_at(v, se.at(v).back(), "j"); }

  // Pass 1 (first) or pass 2 over a row's D elements: the nodes before or after the reduction.
  std::string pass(bool first) {
    std::ostringstream b;
    std::vector<int> nodes;
    for (int n : gr.nodes)
      if (g.nodes[size_t(n)].op->spelling.form == Spelling::Form::constant || (first ? n < gr.row : n > gr.row)) nodes.push_back(n);
    std::set<int> reads;
    for (int n : nodes)
      for (int v : g.nodes[size_t(n)].inputs) reads.insert(v);
    if (first) reads.insert(R.inputs[0]);
    else for (size_t i = 1; i < R.inputs.size(); ++i) reads.insert(R.inputs[i]);
    for (size_t i = 0; i < gr.inputs.size(); ++i) {
      const int v = gr.inputs[i];
      if (!reads.count(v)) continue;
      name[v] = "a" + std::to_string(v);
      b << "      const " << t.type(g.values[size_t(v)].meta.dtype) << " " << name[v] << " = in" << i << "[" << at(v) << "];\n";
    }
    for (int n : nodes)
      for (int v : g.nodes[size_t(n)].outputs) name[v] = "t" + std::to_string(v);
    if (!first) b << normalized();
    for (int n : nodes) b << "      " << node_code(g, t, g.nodes[size_t(n)], name) << "\n";
    if (first) b << "      xr[j] = " << C << "(" << t.convert << "<" << T << ">(" << name.at(R.inputs[0]) << "));\n";
    for (size_t i = 0; i < gr.outputs.size(); ++i) {
      const int v = gr.outputs[i], producer = g.values[size_t(v)].node;
      if (first ? producer < gr.row : producer >= gr.row) b << "      out" << i << "[" << at(v) << "] = " << name.at(v) << ";\n";
    }
    return b.str();
  }

  // The reduction's output at element j: (x - mean) * rstd * w + b, or x * rstd * w.
  std::string normalized() {
    const int y = R.outputs[0];
    name[y] = "t" + std::to_string(y);
    const std::string w = t.convert + "<" + C + ">(" + name.at(R.inputs[1]) + ")";
    if (R.op->name == "layer_norm")
      return "      const " + T + " " + name[y] + " = " + T + "((xr[j] - m) * rstd * " + w + " + " + t.convert + "<" + C + ">(" +
             name.at(R.inputs[2]) + "));\n";
    return "      const " + T + " " + name[y] + " = " + T + "(xr[j] * rstd * " + w + ");\n";
  }

  // Sums in 16 independent lanes of the compute type, then the lanes in order: the eager kernels'
  // order (cpu/simd/lanes.h), and a loop the compiler vectorizes.
  std::string lane_sum(const std::string& var, const std::string& term) const {
    std::ostringstream os;
    os << "    " << C << " " << var << " = 0;\n    {\n      " << C << " acc[16] = {};\n      int64_t j = 0;\n";
    os << "      for (; j + 16 <= " << D << "; j += 16)\n        for (int l = 0; l < 16; ++l) { const int64_t i = j + l; acc[l] += " << term << "; }\n";
    os << "      for (int l = 0; j < " << D << "; ++j, ++l) { const int64_t i = j; acc[l] += " << term << "; }\n";
    os << "      for (int l = 0; l < 16; ++l) " << var << " += acc[l];\n    }\n";
    return os.str();
  }

  std::string statistics() const {
    const std::string eps = C + "(" + literal(R.attrs.f("eps")) + ")";
    const std::string rstd = "    const " + C + " rstd = " + C + "(1) / " + t.sqrt + "(sq / " + C + "(" + std::to_string(D) + ") + " + eps + ");\n";
    if (R.op->name != "layer_norm") return lane_sum("sq", "xr[i] * xr[i]") + rstd;
    return lane_sum("sum", "xr[i]") + "    const " + C + " m = sum / " + C + "(" + std::to_string(D) + ");\n" +
           lane_sum("sq", "(xr[i] - m) * (xr[i] - m)") + rstd;
  }
};

}  // namespace

std::string row_kernel(const Graph& g, const Target& t, const Group& gr, const std::string& fname, Params& q) {
  RowKernel k(g, t, gr);
  const Shape& S = gr.shape;
  const int64_t D = k.D, rows = D ? S.numel() / D : 0;
  std::ostringstream os;
  os << "// fused: " << gr.ops << "   (graph nodes " << gr.nodes.front() << ".." << gr.nodes.back() << "; rows of " << D << ")\n";
  os << t.kernel << " " << fname << "(char* const* p, const int64_t* q) {\n" << pointers(g, t, gr);
  if (D == 0) return os.str() + "}\n";
  os << "  const int64_t rows = " << q.add(rows) << ";\n";
  for (size_t d = 0; d + 1 < S.size(); ++d) os << "  const int64_t n" << d << " = " << q.add(S[d]) << ";\n";
  const std::map<int, std::vector<int64_t>> st = broadcast_strides(g, gr);
  const std::vector<int> operands = operands_of(gr);
  for (int v : operands)
    for (size_t d = 0; d < S.size(); ++d) k.se[v].push_back(stride_expr(st.at(v)[d], "s" + std::to_string(v) + "_" + std::to_string(d), q, os));
  std::ostringstream loop;
  loop << "  for (int64_t r = 0; r < rows; ++r) {\n    " << k.C << " xr[" << D << "];\n    int64_t rem = r;\n";
  for (size_t d = S.size() - 1; d-- > 0;) loop << "    const int64_t i" << d << " = rem % n" << d << "; rem /= n" << d << ";\n";
  for (int v : operands) {
    loop << "    const int64_t b" << v << " = 0";
    for (size_t d = 0; d + 1 < S.size(); ++d)
      if (k.se[v][d] != "0") loop << " + i" << d << " * " << k.se[v][d];
    loop << ";\n";
  }
  loop << "    for (int64_t j = 0; j < " << D << "; ++j) {\n" << k.pass(true) << "    }\n" << k.statistics();
  loop << t.simd << "\n    for (int64_t j = 0; j < " << D << "; ++j) {\n" << k.pass(false) << "    }\n  }\n";
  return os.str() + maybe_parallel(t, "rows * " + std::to_string(D), t.parallel_rows, "", loop.str()) + "}\n";
}

}  // namespace sinter::compiler::emit

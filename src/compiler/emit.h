#pragma once
// What the kernel emitters share (codegen.cpp: elementwise groups and the wrapper; codegen_rows.cpp:
// groups around a row reduction): the run-time parameter list, the spelling of one node, pointer
// declarations and the thread-team switch, all in the words of a Target.
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "compiler/passes.h"
#include "compiler/target.h"

namespace sinter::compiler::emit {

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

std::string literal(double v);  // a double as a C++ literal that reads back exactly
// An operand's stride: a literal when structural (0 or 1), else a named parameter.
std::string stride_expr(int64_t s, const std::string& var, Params& q, std::ostringstream& decl);
// `loop` twice: with a thread team when `numel` reaches the target's threshold, without one
// (no team to start) below.
std::string maybe_parallel(const Target& t, const std::string& numel, const std::string& parallel, const std::string& serial,
                           const std::string& loop);
// The kernel's typed pointers: in0.. for the group's inputs, out0.. for what it stores.
std::string pointers(const Graph& g, const Target& t, const Group& gr);
// One node as a statement that defines its value from named operands (OpDef::spelling); a
// constant listed in `params` (by its value) reads that parameter.
std::string node_code(const Graph& g, const Target& t, const Node& n, const std::map<int, std::string>& name,
                      const std::map<int, std::string>* params = nullptr);
// Integer constants among `nodes` as parameters, by value: such a constant is often a size
// (a position plus the tokens of this call), which as a literal would make the source differ
// from size to size. Floating constants stay literals (the compiler folds them).
std::map<int, std::string> integer_constants(const Graph& g, const std::vector<int>& nodes, Params& q);
// Each operand's element strides over the group's shape (0 where it broadcasts).
std::map<int, std::vector<int64_t>> broadcast_strides(const Graph& g, const Group& gr);

std::string elementwise_kernel(const Graph& g, const Target& t, const Group& gr, const std::string& fname, Params& q);
std::string row_kernel(const Graph& g, const Target& t, const Group& gr, const std::string& fname, Params& q);

}  // namespace sinter::compiler::emit

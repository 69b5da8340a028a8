#pragma once
// Graph passes (passes.cpp): dead-code elimination, common subexpressions, GEMM epilogues,
// sibling linears, layout copies, backward recomputation; and the plan (plan.cpp): fusion groups,
// step order, group inputs and outputs, the memory plan.
#include <cstdint>
#include <vector>

#include "compiler/graph.h"
#include "compiler/target.h"

namespace sinter::compiler {

// The passes a compile runs: all by default; SINTER_COMPILE_DISABLE=cse,epilogues,fuse (any of
// the names below) switches some off, to bisect a miscompile. Every combination computes what the
// eager function computes. Dead code always goes.
struct PassSet {
  bool cse = true;        // eliminate_common_subexpressions
  bool epilogues = true;  // fuse_gemm_epilogues
  bool siblings = true;   // fuse_sibling_linears
  bool layouts = true;    // absorb_layout_copies
  bool fuse = true;       // plan(): elementwise and row-reduction groups (off: every node its own kernel)
  bool recompute = true;  // choose_recomputation in a compiled backward
};
PassSet enabled_passes();  // read at each compile; an unknown name is a CompileError listing the names

void eliminate_dead_code(Graph& g);
// Helpers of the rewrites: drop the marked nodes (renumbering the producers of the rest), and
// whether a node strictly between `from` and `to` writes a buffer one of `reads` lives in.
void remove_nodes(Graph& g, const std::vector<bool>& removed);
bool written_between(const Graph& g, size_t from, size_t to, const std::vector<int>& reads);  // keeps nodes that write in place (their effect is the point)
void eliminate_common_subexpressions(Graph& g);
// GEMM epilogues: linear -> activation -> add of a tensor of the output's shape (either step
// optional) becomes one linear_fused node, whose activation and add run on the GEMM's output
// tiles. Each value absorbed has one use and is not returned. A 2:4 sparse linear absorbs a
// following relu, silu or gelu (its kernels apply them to the output tiles).
void fuse_gemm_epilogues(Graph& g);
// A user kernel's pointwise output (KernelDef::pointwise) and the chain of elementwise nodes that
// consume it become one node: the kernel compiled again with the chain generated into that
// output's store() (user_epilogue.cpp). The chain's other inputs are scalars, the output's shape
// or its trailing dims, contiguous.
void fuse_user_epilogues(Graph& g);
// Three plain linears of one input (q, k and v) become one linear3 node: a decode step then runs
// them in one parallel region instead of three.
void fuse_sibling_linears(Graph& g);
// A copy that only makes a permute of attention's output (or of its gradients) contiguous, as
// (B, H, L, D) -> (B, L, H, D) before the output projection: the attention op writes that layout
// itself (its kernels take any row layout) and the copy goes. The output must have no other view,
// not be returned and not be written in place.
void absorb_layout_copies(Graph& g);

// A fused kernel: elementwise nodes over one output shape, run at the position of its last node.
struct Group {
  std::vector<int> nodes;    // in program order
  std::vector<int> inputs;   // values read from outside the group
  std::vector<int> outputs;  // values stored (used after the group, or returned)
  Shape shape;
  std::string ops;           // "mul -> add -> gelu_tanh" (constants left out)
  // A row reduction (layer_norm, rms_norm) over the last dim, or -1: the nodes before it are its
  // prologue (they make its input a row at a time), those after it its epilogue.
  int row = -1;
};

// What runs, in order: a fused group, or one node's library kernel (views run nothing).
struct Step {
  int group = -1;  // index into Plan::groups, or
  int node = -1;   // a node run by its op's kernel
};

struct Plan {
  std::vector<Group> groups;
  std::vector<Step> steps;
  // Buffers the graph makes, by owning value: -1 for a fresh one per call (returned to the caller),
  // else an offset in the arena.
  std::vector<int64_t> arena_offset;  // by value id
  std::vector<bool> fresh;            // by value id: a returned buffer, allocated per call
  int64_t arena_bytes = 0, unplanned_bytes = 0;
};

// Whether generated code for target t can compute this node: an op flagged OpDef::fusable, on
// dtypes the target spells, not writing in place, not drawing random numbers.
bool fusable(const Graph& g, const Node& n, const Target& t);
// Whether it is a row reduction (layer_norm, rms_norm) generated code can fuse with its neighbours.
bool fusable_row(const Graph& g, const Node& n, const Target& t);

// Recomputation for a backward split off a joint graph: the forward nodes (of the first
// `forward_nodes`) whose outputs the backward computes again instead of the forward keeping them.
// A kept value qualifies when it is made from values the backward has anyway (in `saved`, or
// captured tensors) by views and cheap arithmetic (add, sub, mul, neg, relu, ...: no exp, no
// division) whose buffers nothing writes in place, and is not returned. `saved` (by value: read
// by the backward) loses the values chosen. Returns the nodes to run again, in forward order.
std::vector<size_t> choose_recomputation(const Graph& g, size_t forward_nodes, std::vector<bool>& saved, const Target& t);

// The plan: grouping, order, group inputs and outputs, memory (plan.cpp). fuse = false: no groups.
Plan plan(const Graph& g, const Target& t, bool fuse = true);

}  // namespace sinter::compiler

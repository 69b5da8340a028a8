#pragma once
// A compiled function's insides, shared by the files that do its jobs: guards.cpp (what a trace
// depended on, checked at every call), partition.cpp (a joint trace split into forward and
// backward programs), executor.cpp (building a program and running it on planned buffers),
// explain.cpp (the report) and compiled.cpp (CompiledFunction: find, trace, compile, run).
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "compiler/codegen.h"
#include "compiler/jit.h"
#include "compiler/passes.h"
#include "compiler/trace.h"
#include "runtime/executor.h"
#include "sinter/compile.h"

namespace sinter::compiler {

// What a trace depended on, for one input.
struct InputGuard {
  Shape shape, strides;
  int64_t offset;
  DType dtype;
  Device device;
  bool requires_grad;
};

struct BackwardPart;

// One traced graph and its program.
struct Entry {
  std::vector<InputGuard> guards;
  bool grad_mode;
  DType autocast;
  // Eager when the compiler failed (and fullgraph is off); lazy when the trace broke: each call
  // then traces lazily and runs the pieces between data reads compiled (State::pieces).
  bool eager = false, lazy = false;
  std::string break_op, break_reason;
  Graph graph;
  Plan plan;
  Slots slots;
  std::shared_ptr<JitModule> module;
  std::vector<int64_t> params;      // sizes, strides and offsets the generated code reads
  runtime::SlotStorage slot_storage;  // non-owning: addresses set at each call
  std::vector<runtime::ExternCall> externs;  // by step (empty for fused steps)
  // Under op profiling (SINTER_PROFILE=1): library calls are listed as "op < compiled NAME", the
  // rest of the program's time as "fused kernels < compiled NAME".
  std::string profile_name;
  std::string debug_name;           // its files under SINTER_COMPILE_DEBUG (default: the function's name)
  double extern_seconds = 0;
  std::vector<int> random_nodes;    // nodes whose seed and counter each call sets
  std::vector<std::string> guard_text;
  // Leaves the function's own backward leaves gradients on: `graph` returns them after the
  // function's outputs; each call sets (or adds to) each leaf's .grad (compiled.cpp).
  std::vector<LeafGrad> leaf_grads;
  std::vector<Tensor> leaves_cleared;  // cleared by the function, and given no gradient
  // Outputs that require grad: `graph` is the forward, returning the function's outputs and then
  // what the backward reads; each call attaches an autograd node that runs the backward program.
  std::shared_ptr<BackwardPart> backward;
};

struct BackwardPart {
  std::shared_ptr<Entry> entry;             // the backward program: (saved..., output grads...) -> leaf grads
  size_t outputs = 0;                       // the function's outputs (the forward returns more: the saved)
  std::vector<int> differentiated;          // which of them the backward takes gradients of
  std::vector<TracedBackward::Leaf> leaves;
  std::vector<Tensor> captured_leaves;      // by leaf: the captured tensor (undefined for an input)
  std::vector<int> grad_of_leaf;            // by leaf: its gradient among the backward's outputs, or -1
  std::shared_ptr<Tensor> arena = std::make_shared<Tensor>();
  int64_t saved_bytes = 0;                  // forward values kept for the backward (not inputs)
  size_t recomputed = 0;                    // forward nodes the backward computes again instead
};

// guards.cpp
void set_guards(Entry& e, const std::vector<Tensor>& in);
bool guards_hold(const Entry& e, const std::vector<Tensor>& in);
std::string guard_mismatch(const Entry& e, const std::vector<Tensor>& in);  // the first guard that fails, readable
void check_dynamic(const CompileOptions& o, const std::vector<Tensor>& in);

// partition.cpp: splits a trace with a traced backward into the forward program's graph (in
// e.graph) and the backward's (e.backward): the backward reads the forward values and inputs its
// nodes use (saved, returned by the forward after the function's outputs) and the output
// gradients; with `recompute`, cheap forward values are computed again by the backward instead.
void split_backward(Entry& e, TraceResult& r, size_t num_inputs, bool recompute);

// executor.cpp
Generated prepare(Entry& e, const CompileOptions& opts, const Target& t);  // passes, plan, codegen (export stops here)
void build(Entry& e, const CompileOptions& opts);  // prepare, then the jit; throws CompileError
int64_t slot_offset(const Entry& e, int v);  // value v's offset in elements from its slot's base (the arena's start for planned buffers)
// `arena` is the function's, shared by its entries (one call at a time) and grown to the largest.
// A lazily traced piece passes its captured tensors (by captured number) and the generator offset
// its draws were reserved at.
std::vector<Tensor> run(Entry& e, const std::vector<Tensor>& inputs, Tensor& arena, const std::vector<Tensor>* captured = nullptr,
                        const uint64_t* random_base = nullptr);
std::vector<Tensor> run_with_backward(Entry& e, const std::vector<Tensor>& inputs, Tensor& arena, const std::string& name);
std::vector<Tensor> interpret(const Graph& g);  // op by op through the op table, as eager execution
std::string piece_key(const Graph& g);  // what makes two lazily traced pieces the same program

}  // namespace sinter::compiler

namespace sinter {

struct CompiledFunction::State {
  TensorFn fn;
  CompileOptions opts;
  std::vector<std::unique_ptr<compiler::Entry>> entries;
  int traces = 0;
  // Traces that made new code or broke: what the recompile limit counts. A trace at new sizes
  // whose code is already loaded (the generated source does not depend on sizes) costs only the
  // trace, so it does not count; kMaxEntries bounds those.
  int specializations = 0;
  static constexpr size_t kMaxEntries = 1024;
  std::vector<const compiler::JitModule*> programs;  // distinct compiled programs
  compiler::Entry* last_hit = nullptr;
  Tensor arena;  // the entries' intermediate buffers (one call at a time)
  bool warned = false;
  std::string last_miss;
  std::vector<std::string> warnings;  // also handed to sinter::warn
  // A function whose trace broke runs lazily: its pieces, by structure, and what the last call ran.
  std::unordered_map<std::string, std::unique_ptr<compiler::Entry>> pieces;
  std::vector<const compiler::Entry*> last_pieces;  // null: run op by op
  std::vector<std::string> last_breaks;

  bool may_compile();
  void count_program(const compiler::Entry& e);
  void build(compiler::Entry& e);
  void build_both(compiler::Entry& e);
  std::vector<Tensor> run_piece(compiler::Graph& g, uint64_t random_base, const std::string& reason);
  std::vector<Tensor> run_lazily(const std::vector<Tensor>& in);
  std::vector<Tensor> run_handing_gradients(compiler::Entry& e, const std::vector<Tensor>& in);
  compiler::Entry* find(const std::vector<Tensor>& in);
  compiler::Entry* make(const std::vector<Tensor>& in);
  void warn(const std::string& message);
};

}  // namespace sinter

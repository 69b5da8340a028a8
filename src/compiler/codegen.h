#pragma once
// Code generation (codegen.cpp, codegen_kernels.cpp): one translation unit per graph, a kernel
// per fusion group (ops spelled with the eager kernels' scalar functors, in a Target's words) and
// the wrapper, which runs the steps in order: fused kernels directly, library kernels through a
// callback. slots[i] is the base address of buffer slot i; each value's address is its slot's plus
// a byte offset. Sizes, strides and offsets are parameters, so one program serves every size.
//   extern "C" void sinter_graph_run(char* const* slots, const int64_t* params,
//                                    void (*call)(void* ctx, int step), void* ctx);
#include <string>
#include <vector>

#include "compiler/passes.h"
#include "compiler/target.h"

namespace sinter::compiler {

// Which buffer slot each value's buffer is: graph inputs, captured tensors, fresh (returned)
// buffers, then the arena.
struct Slots {
  std::vector<int> of_value;  // by value id: its buffer's slot
  int count = 0, arena = -1;
};
Slots assign_slots(const Graph& g, const Plan& p);

// The source, and the parameters it reads at run time (sizes, strides, byte offsets): graphs that
// differ only in sizes give the same source and different parameters.
struct Generated {
  std::string source;
  std::vector<int64_t> params;
};
Generated generate(const Graph& g, const Plan& p, const Slots& slots, const std::string& name, const Target& target);

}  // namespace sinter::compiler

#pragma once
// C++ code generation (codegen.cpp): one translation unit per graph, holding a kernel per fusion
// group (loops over the group's shape, the ops spelled with the scalar functors of
// src/ops/scalar_fns.h, which the eager kernels use too) and the wrapper `sinter_graph_run`, which
// runs the steps in order: fused kernels directly, library kernels through a callback.
//   extern "C" void sinter_graph_run(char* const* slots, const int64_t* params,
//                                    void (*call)(void* ctx, int step), void* ctx);
// slots[i] is the base address of buffer slot i (Slots below); each value's address is its slot's
// plus its byte offset. Sizes, strides and offsets are parameters (Generated::params), so the
// source depends on the graph's structure only: one compiled program serves every size.
#include <string>
#include <vector>

#include "compiler/passes.h"

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
Generated generate_cpp(const Graph& g, const Plan& p, const Slots& slots, const std::string& name);

}  // namespace sinter::compiler

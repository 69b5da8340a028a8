#pragma once
// C++ code generation (codegen.cpp): one translation unit per graph, holding a kernel per fusion
// group (loops over the group's shape, the ops spelled with the scalar functors of
// src/ops/scalar_fns.h, which the eager kernels use too) and the wrapper `sinter_graph_run`, which
// runs the steps in order: fused kernels directly, library kernels through a callback.
//   extern "C" void sinter_graph_run(char* const* slots, void (*call)(void* ctx, int step), void* ctx);
// slots[i] is the base address of buffer slot i (Slots below); each value's address is its slot's
// plus its byte offset.
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

std::string generate_cpp(const Graph& g, const Plan& p, const Slots& slots, const std::string& name);

}  // namespace sinter::compiler

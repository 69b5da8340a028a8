#pragma once
// The executor the JIT (src/compiler/executor.cpp) and the runtime share: a program is generated
// code that runs its fused kernels itself and calls back for each library kernel; a library call
// is the kernel of its op on tensors built once over the program's slots (whose addresses each run
// sets), with its attributes.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "sinter/op.h"

namespace sinter::runtime {

// The entry of a generated translation unit (src/compiler/codegen.h): slots[i] is buffer slot i's
// base address, params its sizes, strides and offsets; `call(ctx, step)` runs step's library call.
using GraphRunFn = void (*)(char* const* slots, const int64_t* params, void (*call)(void*, int), void* ctx);

struct ExternCall {
  std::string op;                // the op's name (profiles, errors)
  const KernelFn* kernel = nullptr;
  std::vector<Tensor> in, out;
  const Attrs* attrs = nullptr;
  std::vector<bool> writes;      // by output: an input it writes in place (its version moves on)
};

// A user kernel's entry (src/compiler/user_kernel.cpp): p, the operands' base addresses (inputs,
// then outputs); q, per operand its ndim, sizes and strides (describe); the config to run.
using UserKernelFn = void (*)(char* const* p, const int64_t* q, int config);
// A user kernel call's p and q; inputs it does not write (written[i] false) go contiguous first,
// the copies kept in `keep` for the call's length.
void user_kernel_operands(std::span<const Tensor> in, std::span<Tensor> out, const std::vector<bool>& written, std::vector<char*>& p,
                          std::vector<int64_t>& q, std::vector<Tensor>& keep);

// Runs one library call: the kernel, then the version of every buffer it wrote.
void run_extern(ExternCall& c);

// A slot's storage, addressed anew at each run: non-owning.
struct SlotStorage {
  std::vector<std::shared_ptr<Storage>> storage;
  void resize(size_t n);
  void set(size_t slot, void* data, int64_t nbytes, char** table);
};

}  // namespace sinter::runtime

#pragma once
// What generated code looks like on one kind of device. The emitter (codegen.cpp) writes every
// target's kernels from the same plan and asks the target only for these words, as tinygrad's
// renderers do: a CUDA target is a second record (a thread index instead of an OpenMP loop, its
// own restrict and conversions), not a second code generator. cpp_target() is the C++ one (g++,
// OpenMP), the only one built today.
#include <string>

#include "sinter/dtype.h"
#include "sinter/tensor.h"

namespace sinter::compiler {

struct Target {
  std::string name;              // "cpp": in messages and debug dumps
  DeviceType device;             // the values it computes live here
  std::string prelude;           // the translation unit's first lines (its includes)
  std::string kernel;            // what precedes a fused kernel's name: "static void"
  std::string restrict_ptr;      // the no-alias qualifier of a kernel's pointers
  std::string parallel_flat;     // before a flat loop run by a thread team (and vectorized)
  std::string parallel_rows;     // before a loop over rows run by a thread team
  std::string simd;              // before a loop the compiler should vectorize
  int64_t parallel_from = 0;     // elements from which a kernel starts its thread team
  std::string functors;          // where the scalar functors live: "sinter::fn::"
  std::string convert;           // convert<To>(v), as the eager kernels convert
  std::string compute_type;      // compute_type<T>: the type arithmetic on T runs in
  std::string sqrt;              // the square root of a compute-type value
  std::string entry;             // the wrapper's declaration up to its parameter list
  // The spelling of a dtype in generated code, or empty for a dtype it cannot hold.
  std::string (*type_name)(DType) = nullptr;
  bool spells(DType t) const { return !type_name(t).empty(); }
  std::string type(DType t) const;  // type_name, or a CompileError naming the dtype and target
};

const Target& cpp_target();

}  // namespace sinter::compiler

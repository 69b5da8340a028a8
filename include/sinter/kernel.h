#pragma once
// User-defined kernels: C++ source registered once as an op of the op table, so it runs eagerly,
// under autograd (its backward), traced and inside compiled graphs as any op does. The source is
// compiled through the compiler's disk cache on first use, every config in one translation unit;
// the config a call runs is chosen per key bucket by timing them all once (autotuning), and the
// choice is kept on disk. docs/compiler.md describes the machinery.

//   KernelDef k{.name = "swiglu", .source = R"(
//     template <class Cfg> void kernel(sinter::In<float> gate, sinter::In<float> up, auto& out) {
//       for (int64_t i = 0; i < out.numel(); ++i) out.store(i, sinter::fn::Silu{}(gate[i]) * up[i]);
//     })", .inputs = {DType::f32, DType::f32}, .outputs = {DType::f32}, .shape = same_as_input(0)};
//   register_kernel_def(k);  Tensor y = call1(get_op("swiglu"), {g, u});
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "sinter/op.h"

namespace sinter {

// One set of a kernel's compile-time constants: `Cfg::NAME` in the source.
using KernelConfig = std::vector<std::pair<std::string, int64_t>>;

struct KernelDef {
  std::string name = {};           // the op's name in the op table
  std::string source = {};         // the kernel's C++ source, or
  std::string source_file = {};    // a file holding it (its compiler diagnostics name this file's lines)
  std::vector<DType> inputs = {};  // the inputs' dtypes, in order: the kernel's In<T> parameters
  std::vector<DType> outputs = {}; // the outputs' dtypes: its Out<T> parameters, after the inputs
  InferFn shape = {};              // the outputs' shapes (and dtypes, as declared) from the inputs'
  std::vector<Effect> effects = {};  // per output: fresh (the default), writes input i, aliases input i
  std::vector<KernelConfig> configs = {{}};  // all compiled; autotuning picks one per key bucket
  // The sizes the best config depends on; each key bucket rounds them up to powers of two.
  // Null: every size of every input.
  std::function<std::vector<int64_t>(std::span<const TensorMeta>)> key = {};
  // Per output: written only through store(i, v) at its flat index (a fresh, contiguous output). In a
  // compiled graph, the elementwise ops that consume it are then computed inside store().
  std::vector<bool> pointwise = {};
  BackwardFn backward = {};        // in public ops or other kernels; null: not differentiable
  uint32_t save_inputs = ~0u, save_outputs = 0;  // what the backward reads (as OpDef's)
};

// Registers the kernel as an op (named def.name) with a CPU kernel that compiles the source on
// first use. Throws naming the kernel for a definition it cannot use.
const OpDef& register_kernel_def(KernelDef def);

// The shape function of a kernel whose one output is shaped and typed as input i.
InferFn same_as_input(int i);

// What autotuning chose for a kernel so far: per key bucket, the config (index into configs) and
// the time each config took when it was measured (empty when read back from the disk).
struct TunedChoice {
  std::vector<int64_t> bucket;
  int config = 0;
  std::vector<double> ms;
};
std::vector<TunedChoice> tuned_choices(const std::string& kernel);

}  // namespace sinter

#pragma once
// Ahead-of-time export: traced functions become a folder that a C program runs with libsinter_rt
// alone (include/sinter/sinter_rt.h): model.so (each graph's generated code and its program, with
// a table row per size of a dynamic range), weights.safetensors (weights, and state's initial
// values) and manifest.json (ABI version, ISA level, specs, SHA-256 of each file). A graph must
// trace whole: a break is an error naming the op. docs/aot.md has the details.
//   sinter::aot::export_graph(fn, {tokens}, {.graph = {.name = "forward"}}, "out/model");
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "sinter/compile.h"

namespace sinter::aot {

// A dim of an input whose size each call chooses within [min, max]. Dims of one graph that share
// a name share the size (one dynamic size per graph).
struct Dim {
  std::string name = "seq";
  int input = 0, dim = 0;
  int64_t min = 1, max = 1;
};

struct GraphOptions {
  std::string name = "forward";
  std::vector<std::string> input_names, output_names;  // default: input0..., output0...
  std::vector<Dim> dynamic;
};

struct Options {
  GraphOptions graph;                   // export_graph's one graph
  std::string isa = "x86-64-v3";        // the generated code's ISA level: x86-64-v3 (AVX2) or x86-64-v4 (AVX-512)
  std::map<std::string, Tensor> names;  // captured tensors' names (parameters, buffers, state), matched by storage
  // Called as sizes are traced and as code compiles: (what, done, total).
  std::function<void(const std::string&, int64_t, int64_t)> progress;
};

struct GraphToExport {
  TensorFn fn;
  std::vector<Tensor> example_inputs;  // their dtypes and fixed dims; values are not read
  GraphOptions options;
};

// What an export wrote.
struct Exported {
  std::string dir;
  int64_t model_so_bytes = 0, weights_bytes = 0;
  int64_t weights = 0, state = 0;   // captured tensors of each kind
  int64_t sizes_traced = 0;
  double seconds = 0;
};

Exported export_graphs(const std::vector<GraphToExport>& graphs, const Options& options, const std::string& dir);
Exported export_graph(const TensorFn& fn, const std::vector<Tensor>& example_inputs, const Options& options, const std::string& dir);

}  // namespace sinter::aot

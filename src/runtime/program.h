#pragma once
// An exported model's program: what `sinter::aot::export_graph` (src/compiler/export.cpp) writes
// into model.so and the runtime reads back. Per graph: its inputs and outputs (dims fixed or in a
// dynamic range), and one or more variants of generated code, each with its slots (the buffers the
// code addresses: inputs, captured weights and state, fresh outputs, the arena) and its library
// calls (op name, attributes, operands). The sizes, strides, offsets and buffer bytes that change
// with the dynamic dim are one flat table row per size, so the structure is stored once.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "sinter/op.h"

namespace sinter::runtime {

inline constexpr int kAbiVersion = 1;  // include/sinter/sinter_rt.h SINTER_RT_ABI_VERSION

struct DimSpec {
  int64_t min = 0, max = 0;
  std::string name;  // the dynamic dim's name, or "" for a fixed one
};
struct TensorSpec {
  std::string name;
  DType dtype = DType::f32;
  std::vector<DimSpec> dims;
};
// A captured tensor: a weight (read only, from weights.safetensors) or state (written by a graph,
// one copy per session, starting from its value in weights.safetensors).
struct CapturedSpec {
  std::string name;
  bool state = false;
  DType dtype = DType::f32;
  Shape shape;
};

struct Operand {
  int slot = 0;
  DType dtype = DType::f32;
  int rank = 0;  // its shape, strides and offset are in the size's table row
};
struct ExternSpec {
  int step = 0;  // the generated code's step number
  std::string op;
  Attrs attrs;
  std::vector<Operand> in, out;
};
struct SlotSpec {
  enum class Kind { input, captured, fresh, arena } kind = Kind::fresh;
  int index = -1;  // input or captured number
};
// One compiled program of a graph, and how its table rows read.
struct Variant {
  std::string symbol;  // its sinter_graph_run in model.so
  std::vector<SlotSpec> slots;
  std::vector<ExternSpec> externs;
  std::vector<Operand> outputs;
  int64_t num_params = 0;
  // A row: params, then each slot's bytes, then each extern operand's (in, then out) shape,
  // strides and offset in elements, then each output's.
  int64_t row_width() const;
};
struct SizeEntry {
  int64_t value = 0;  // the dynamic dim's size (0 for a graph without one)
  int variant = 0;
  int64_t row = 0;  // offset of its row in Program::tables
  // Library calls whose attributes differ at this size (a slice's length): by extern number.
  std::vector<std::pair<int, Attrs>> attrs;
};
struct GraphProgram {
  std::string name;
  std::vector<TensorSpec> inputs, outputs;
  std::string dynamic;  // the dynamic dim's name, or ""
  int64_t dyn_min = 0, dyn_max = 0;
  std::vector<Variant> variants;
  std::vector<SizeEntry> sizes;  // by size, ascending
};
struct Program {
  std::vector<CapturedSpec> captured;
  std::vector<GraphProgram> graphs;
  std::vector<int64_t> tables;
};

// manifest.json, as a loader reads it (checked: format, ABI version, a SHA-256 per file).
struct Manifest {
  int64_t abi_version = 0;
  std::string isa, sinter_version;
  std::map<std::string, std::string> sha256;  // by file name
};
Manifest parse_manifest(const std::string& text, const std::string& where);

// The captured tensors a program reads, found in a weights file by name and checked against its
// dtypes and shapes (IOError naming `where` and the tensor otherwise).
std::vector<Tensor> match_weights(const Program& p, const std::map<std::string, Tensor>& tensors, const std::string& where);

// The structure as JSON (the tables travel as an int64 array beside it).
std::string program_json(const Program& p);
// Parses and checks a program: every slot, operand, row and variant in range; throws IOError
// naming `where` and what is wrong.
Program parse_program(const std::string& json, const int64_t* tables, size_t num_tables, const std::string& where);

}  // namespace sinter::runtime

#pragma once
// The compiler's IR: an SSA graph of op calls. Values are tensors with a layout (shape, strides,
// offset) over a buffer: a graph input's, a captured tensor's, or a node's own. View nodes make
// values that alias their input's buffer; nodes of ops that write inputs in place (OpDef::mutates)
// make new values for the same buffer, so program order is what separates a read from a write.
// The IR names ops and devices, not C++: code generation is a later stage. The stages and their
// files: docs/compiler.md.
#include <memory>
#include <string>
#include <vector>

#include "sinter/op.h"

namespace sinter::compiler {

enum class ValueKind { input, captured, node };

struct Value {
  ValueKind kind = ValueKind::node;
  TensorMeta meta;
  Shape strides;
  int64_t offset = 0;     // in elements, into the buffer of `base`
  int base = -1;          // the value whose buffer this one lives in; itself for buffer owners
  int node = -1, output = 0;  // producer (kind node)
  int index = -1;         // input or captured number
  Tensor captured;        // kind captured: the tensor, held by reference
  bool owns_buffer() const { return base < 0; }
};

struct Node {
  const OpDef* op = nullptr;
  Attrs attrs;
  std::vector<int> inputs, outputs;
  // A node that draws random numbers (attrs "seed" and "counter"): its counter's distance from the
  // generator's offset when the trace began. Each call sets the node's seed and counter from the
  // generator's state then, so a compiled function draws what the eager one would, and new
  // numbers every call. -1 for nodes that draw nothing.
  int64_t random_offset = -1;
  bool is_view() const { return op->view != nullptr; }
  bool mutates() const { return op->mutates != 0; }
};

struct Graph {
  std::vector<Value> values;
  std::vector<Node> nodes;          // in program order
  std::vector<int> inputs;          // values of kind input, by position
  std::vector<int> captured;        // values of kind captured
  std::vector<int> outputs;         // what the function returns
  uint64_t random_blocks = 0;       // Philox blocks one call reserves (random_offset above)
  std::vector<std::string> notes;   // what the passes removed that a reader may wonder about
  std::vector<std::shared_ptr<const OpDef>> owned_ops;  // ops the passes made for this graph's nodes

  // The value whose buffer v lives in.
  int buffer_of(int v) const { return values[size_t(v)].base < 0 ? v : values[size_t(v)].base; }
  bool contiguous(int v) const;
  std::string describe(int v) const;  // "%3 f32(4, 8)"
};

// Throws CompileError naming the first broken invariant (a value used before it is made, a
// producer that does not list its output, an output that is not a value).
void verify(const Graph& g);
// One line per node: "%5 = gelu(%4)   f32(16, 1024)".
std::string dump(const Graph& g);

// The graph of nodes [begin, end) of g (a traced forward, or its backward): `inputs` (values of
// g, in order) become its inputs 0..n-1, owning their buffers; tensors g captured that the nodes
// read stay captured; `outputs` are values of g the new graph returns. A node reading a value of g
// that is none of these is an error.
Graph extract(const Graph& g, size_t begin, size_t end, const std::vector<int>& inputs, const std::vector<int>& outputs);
// The same over the nodes listed, in that order (a backward that recomputes forward nodes first).
Graph extract(const Graph& g, const std::vector<size_t>& nodes, const std::vector<int>& inputs, const std::vector<int>& outputs);

}  // namespace sinter::compiler

#pragma once
// The runtime (libsinter_rt): loads a folder `sinter export` wrote and runs its graphs. It owns
// the exported-program format (program.h), SHA-256 (sha256.h), the executor it shares with the
// JIT (executor.h), a kernel-only registry keyed by op name (kernels.cpp), the model and its
// sessions (model.cpp, session.cpp) and the C ABI over them (c_api.cpp,
// include/sinter/sinter_rt.h). It links the kernels and what they stand on, nothing else: no op
// table, tracing, compiler, autograd or MPI.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/executor.h"
#include "runtime/program.h"

namespace sinter::runtime {

// The CPU kernel registered for an op, or null.
const KernelFn* find_kernel(const std::string& op);

// What `--isa` names, and whether this CPU runs it.
bool cpu_supports_isa(const std::string& isa);

struct Model {
  std::string dir;
  Program program;
  void* handle = nullptr;                       // model.so
  std::vector<std::vector<GraphRunFn>> code;    // by graph, by variant
  std::vector<Tensor> captured;                 // weights mapped from weights.safetensors; state's exported values
  std::map<std::string, KernelFn> user_kernels; // by entry symbol in model.so: the user kernels it calls
  ~Model();
  int graph_index(const std::string& name) const;  // -1: none
  const KernelFn* kernel(const ExternSpec& call) const;  // a user kernel's, or the registry's
};

// Loads and checks a folder: manifest (format, ABI version, ISA, each file's SHA-256), the
// program in model.so, the weights against the program's names, dtypes and shapes, and a kernel
// for every op the program calls. Throws IOError (or Error) saying which check failed.
std::unique_ptr<Model> load_model(const std::string& dir);

// The tensors of one run (dense, row-major).
struct HostTensor {
  void* data = nullptr;
  DType dtype = DType::f32;
  Shape shape;
  size_t capacity = 0;  // outputs: the caller's buffer bytes (0 with data null: the session's)
};

class Session {
 public:
  explicit Session(const Model& m);
  ~Session();
  void reset();
  // Checks the inputs against the graph's specs, runs it, and fills `outputs` (shape, dtype, and
  // data: the caller's buffer, or the session's when data is null).
  void run(const std::string& graph, const std::vector<HostTensor>& inputs, std::vector<HostTensor>& outputs);

 private:
  struct Bound;
  const Model& model_;
  std::vector<Tensor> state_;  // by captured number (undefined for weights)
  std::map<std::pair<int, size_t>, std::unique_ptr<Bound>> bound_;  // by (graph, size entry)
  std::map<std::tuple<int, int, size_t>, Tensor> fresh_;            // by (graph, variant, slot): grown, reused
  Tensor arena_;
  std::vector<Tensor> out_;                                         // outputs the runtime hands out
  Bound& bind(int graph, size_t size);
  size_t check_inputs(const GraphProgram& g, const std::vector<HostTensor>& in) const;  // the size's entry
};

}  // namespace sinter::runtime

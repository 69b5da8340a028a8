// The C++ target: kernels as static functions with OpenMP loops, compiled by the system g++ (jit.cpp)
// against the prelude generated from dtype.h and scalar_fns.h.
#include "compiler/target.h"

#include "sinter/error.h"

namespace sinter::compiler {

std::string Target::type(DType t) const {
  std::string s = type_name(t);
  SINTER_CHECK_T(CompileError, !s.empty(), "[compile] no spelling for dtype ", t, " in generated ", name, " code");
  return s;
}

namespace {
std::string cpp_type(DType t) {
  switch (t) {
    case DType::f32: return "float";
    case DType::f64: return "double";
    case DType::bf16: return "sinter::bf16";
    case DType::i64: return "int64_t";
    case DType::i32: return "int32_t";
    case DType::boolean: return "bool";
    default: return "";
  }
}
}  // namespace

const Target& cpp_target() {
  static const Target t{
      .name = "cpp",
      .device = DeviceType::cpu,
      .prelude = "#include \"sinter_jit_prelude.h\"\n",
      .kernel = "static void",
      .restrict_ptr = "__restrict",
      .parallel_flat = "#pragma omp parallel for simd schedule(static)",
      .parallel_rows = "#pragma omp parallel for schedule(static)",
      .simd = "#pragma omp simd",
      // Below this many elements a kernel runs on the calling thread: no team to start.
      .parallel_from = 32768,
      .functors = "sinter::fn::",
      .convert = "sinter::jit::cvt",
      .compute_type = "sinter::jit::compute_t",
      .sqrt = "std::sqrt",
      .entry = "extern \"C\" void sinter_graph_run",
      .type_name = cpp_type,
  };
  return t;
}

}  // namespace sinter::compiler

// The op-table sweep on CUDA: every op with a CUDA kernel runs its spec's cases (tests/op_specs*.cpp)
// on the GPU, inputs copied there and outputs NaN-poisoned first (SINTER_CUDA_POISON=1, set by the
// device run), against the double-precision reference and against the CPU kernel. Coverage (ops
// with a CUDA kernel, of all) is printed; ops the models need and CUDA lacks are listed.
#include "cuda_test_util.h"
#include "op_specs.h"

using namespace sinter;
using namespace sinter::test;

namespace {

class CudaOps : public ::testing::TestWithParam<std::string> {};

// The case's inputs on the GPU (an op without inputs, a factory, is told the device instead).
Case on_gpu(const Case& c) {
  Case g = c;
  for (Tensor& t : g.in) t = t.to(Device::cuda());
  if (c.in.empty()) g.attrs.set("device", Device::cuda());
  return g;
}

// What CUDA refuses by design, with an error naming the op and the dtype (as PyTorch's CUDA does):
// integer matmuls (cuBLASLt has no integer GEMM), and the flash backward in f64 (the CUDA flash
// kernels take f32 and bf16; f64 attention runs math there, whose backward is ops).
bool refused_on_cuda(const std::string& op, const Case& c) {
  const DType dt = c.in.empty() ? DType::f32 : c.in[0].dtype();
  if (op == "matmul" || op == "linear") return !is_floating(dt);
  if (op == "sdpa_flash_backward") return dt == DType::f64;
  return false;
}

std::vector<Tensor> to_cpu(const std::vector<Tensor>& ts) {
  std::vector<Tensor> out;
  for (const Tensor& t : ts) out.push_back(t.to(Device::cpu()));
  return out;
}

}  // namespace

TEST_P(CudaOps, MatchesTheReferenceAndTheCpuKernel) {
  NEEDS_GPU();
  const OpDef& op = get_op(GetParam());
  if (!op.kernels[size_t(DeviceType::cuda)]) GTEST_SKIP() << "[" << op.name << "] has no CUDA kernel yet (counted by CudaOps.Coverage)";
  const auto it = op_specs().find(op.name);
  ASSERT_NE(it, op_specs().end());
  const Spec& spec = it->second;
  manual_seed(1234);
  for (const Case& c : spec.cases()) {
    if (c.attrs.b_or("packed_only", false)) {  // a 2:4 weight held only in the CPU's prepacked layout
      const Case gpu = on_gpu(c);
      EXPECT_TRUE(test::throws_naming(op.name, [&] { (void)call(op, gpu.in, gpu.attrs); }, "unpack()")) << describe(c);
      continue;
    }
    if (refused_on_cuda(op.name, c)) {
      const Case gpu = on_gpu(c);
      EXPECT_TRUE(test::throws_naming(op.name, [&] { (void)call(op, gpu.in, gpu.attrs); }, dtype_name(c.in[0].dtype()))) << describe(c);
      continue;
    }
    std::vector<R> in_ref;
    for (const Tensor& t : c.in) in_ref.push_back(ref_of(t));
    const std::vector<R> ref = spec.ref(in_ref, c.attrs);
    Case cpu = c;  // an in-place op writes its inputs: each side gets its own copies
    for (Tensor& t : cpu.in) t = t.clone();
    const Case gpu = on_gpu(c);
    const std::vector<Tensor> out = to_cpu(call(op, gpu.in, gpu.attrs));
    EXPECT_TRUE(matches(out, ref, spec)) << "cuda: " << describe(c);
    const std::vector<Tensor> cpu_out = call(op, cpu.in, cpu.attrs);
    std::vector<R> cpu_ref;
    for (const Tensor& t : cpu_out) cpu_ref.push_back(ref_of(t));
    EXPECT_TRUE(matches(out, cpu_ref, spec)) << "cuda against the CPU kernel: " << describe(c);
  }
}

INSTANTIATE_TEST_SUITE_P(AllOps, CudaOps, ::testing::ValuesIn(op_names()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// The ops a GPT-2 or LLaMA training step and generation call (forward, backward, AdamW, sampling).
TEST(CudaOpsCoverage, PrintsCoverageAndTheModelOpsWithoutAKernel) {
  NEEDS_GPU();
  int with = 0;
  const std::vector<const OpDef*> ops = all_ops();
  for (const OpDef* op : ops) with += (op->view || op->kernels[size_t(DeviceType::cuda)]) ? 1 : 0;
  std::printf("CUDA kernels: %d of %zu ops (views need none)\n", with, ops.size());
  std::string missing;
  for (const char* name : {"matmul", "linear", "sum", "mean", "softmax", "log_softmax", "causal_softmax", "layer_norm", "rms_norm",
                           "embedding", "embedding_backward", "cross_entropy", "cross_entropy_backward", "sdpa",
                           "rotary_embedding", "rope_cos_sin", "kv_append_", "dynamic_slice", "cat", "dropout", "adamw_update", "sum_squares", "topk",
                           "multinomial", "index_select", "masked_fill", "gather", "scatter_add"}) {
    const OpDef* op = find_op(name);
    EXPECT_NE(op, nullptr) << "no op named " << name;
    if (op && !op->kernels[size_t(DeviceType::cuda)]) missing += std::string(missing.empty() ? "" : ", ") + name;
  }
  std::printf("model ops without a CUDA kernel: %s\n", missing.empty() ? "none" : missing.c_str());
  EXPECT_TRUE(missing.empty()) << "model ops without a CUDA kernel: " << missing;
}

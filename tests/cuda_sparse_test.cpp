// 2:4 layers on CUDA against dense products on the same pruned weights: each of the CUDA paths
// (cuSPARSELt, the dense copy on cuBLASLt, and the timed choice between them), bf16 and int8
// values, at every M tested; bias and activation; the gradient of x; a sparsified model generating
// on the GPU as on the CPU.
#include <dlfcn.h>

#include <cmath>
#include <cstdlib>
#include <map>

#include "cuda/cusparselt.h"
#include "cuda_test_util.h"
#include "sinter/sparse.h"
#include "sinter/train.h"
#include "train_util.h"

using namespace sinter;

namespace {

const Device kGpu = Device::cuda();

SemiStructuredSparse on_gpu(const SemiStructuredSparse& w) { return {w.values.to(kGpu), w.meta.to(kGpu), w.scales.to(kGpu)}; }

double relative_error(const Tensor& a, const Tensor& b) {
  const double scale = max(abs(b)).item<double>();
  return max(abs(a - b)).item<double>() / (scale > 0 ? scale : 1.0);
}

// Runs body with SINTER_SPARSE24_CUDA set to each path (unset: the timed choice); on the emulator
// cuSPARSELt is its own (src/cuda/emulator/cusparselt.cpp). Unset again however body ends.
template <class F> void for_each_path(F&& body) {
  struct Unset {
    ~Unset() { unsetenv("SINTER_SPARSE24_CUDA"); }
  } unset;
  for (const char* path : {"sparse", "dense", ""}) {
    if (*path) setenv("SINTER_SPARSE24_CUDA", path, 1);
    else unsetenv("SINTER_SPARSE24_CUDA");
    body(std::string(*path ? path : "auto"));
  }
}

// One of the emulator's counts ("searches": cuSPARSELt's algorithm searches run, "plans": plans
// alive, "plans_made"); -1 on a GPU (the library counts none).
int64_t emulated(const std::string& count) {
  const char* lib = std::getenv("SINTER_CUSPARSELT_LIBRARY");
  void* h = lib ? dlopen(lib, RTLD_NOW | RTLD_LOCAL) : nullptr;  // the library the backend opens (or will)
  auto* f = h ? reinterpret_cast<int64_t (*)()>(dlsym(h, ("sinter_emulated_cusparselt_" + count).c_str())) : nullptr;
  const int64_t n = f ? f() : -1;
  if (h) dlclose(h);
  return n;
}
int64_t searches() { return emulated("searches"); }

}  // namespace

// y = x W^T on the GPU against x W^T in f64 on the host, W the 2:4 weight's own dense matrix and x
// rounded to bf16 as the GPU sees it: within bf16 rounding of the output (2^-7 of the largest
// value); int8 values run as bf16 products of values and scales on the GPU (2^-6).
TEST(CudaSparse24, EveryPathMatchesTheDenseProductOfThePrunedWeightAtEveryM) {
  NEEDS_GPU();
  manual_seed(3);
  const int64_t N = 256, K = 512;
  const Tensor dense = prune_2_4(randn({N, K}) * 0.05);
  for (const DType vt : {DType::bf16, DType::i8}) {
    const SemiStructuredSparse w = to_sparse_semi_structured(dense, vt);
    const SemiStructuredSparse g = on_gpu(w);
    const Tensor w64 = w.to_dense().to(DType::f64);
    for (const int64_t M : {1, 16, 128, 1000}) {
      const Tensor x = randn({M, K}).to(DType::bf16);
      const Tensor want = matmul(x.to(DType::f64), w64.t());
      for_each_path([&](const std::string& path) {
        const Tensor got = linear(x.to(kGpu), g).to(Device::cpu()).to(DType::f64);
        const double err = relative_error(got, want);
        EXPECT_LE(err, vt == DType::i8 ? std::ldexp(1.0, -6) : std::ldexp(1.0, -7)) << dtype_name(vt) << " M=" << M << " path " << path;
        std::printf("2:4 %s M=%lld path %s: relative error %.1e\n", dtype_name(vt), static_cast<long long>(M), path.c_str(), err);
      });
    }
  }
}

// x as a view 2 bytes into its storage, off the 16 bytes cuSPARSELt's descriptors ask for: the
// layer copies it rather than failing (M = 5: padded to 8 rows as well).
TEST(CudaSparse24, AnXViewOffItsAlignmentRunsOnEveryPath) {
  NEEDS_GPU();
  manual_seed(6);
  const int64_t N = 64, K = 128, M = 5;
  const SemiStructuredSparse w = to_sparse_semi_structured(prune_2_4(randn({N, K}) * 0.1), DType::bf16);
  const Tensor flat = randn({M * K + 1}).to(DType::bf16);
  const Tensor x = flat.narrow(0, 1, M * K).reshape({M, K});
  const Tensor want = matmul(x.to(DType::f64), w.to_dense().to(DType::f64).t());
  const Tensor xg = flat.to(kGpu).narrow(0, 1, M * K).reshape({M, K});
  ASSERT_TRUE(xg.is_contiguous());
  for_each_path([&](const std::string& path) {
    const Tensor got = linear(xg, on_gpu(w)).to(Device::cpu()).to(DType::f64);
    EXPECT_LE(relative_error(got, want), std::ldexp(1.0, -7)) << "path " << path;
  });
}

// The bias and ReLU run in cuSPARSELt's epilogue on its path: three bias tensors in turn for one
// weight and M (one plan, its bias pointer set at each call), the third a view off 16 bytes.
TEST(CudaSparse24, BiasAndActivationMatchTheCpu) {
  NEEDS_GPU();
  manual_seed(4);
  const int64_t N = 128, K = 256;
  const SemiStructuredSparse w = to_sparse_semi_structured(prune_2_4(randn({N, K}) * 0.1), DType::bf16);
  const SemiStructuredSparse wg = on_gpu(w);
  const Tensor x = randn({33, K}).to(DType::bf16);
  const Tensor flat = randn({N + 1}).to(DType::bf16);
  const Tensor biases[] = {randn({N}).to(DType::bf16), randn({N}).to(DType::bf16) + 1, flat.narrow(0, 1, N)};
  for (const char* act : {"none", "relu", "gelu", "silu"}) {
    for_each_path([&](const std::string& path) {
      for (int i = 0; i < 3; ++i) {
        const Tensor& b = biases[i];
        const Tensor want = linear(x.to(DType::f32), SemiStructuredSparse{w.values.to(DType::f32), w.meta, w.scales}, b.to(DType::f32), act);
        const Tensor bg = i < 2 ? b.to(kGpu) : flat.to(kGpu).narrow(0, 1, N);
        const Tensor got = linear(x.to(kGpu), wg, bg, act).to(Device::cpu()).to(DType::f32);
        EXPECT_LE(relative_error(got.to(DType::f64), want.to(DType::f64)), std::ldexp(1.0, -7)) << act << " path " << path << " bias " << i;
      }
    });
  }
}

TEST(CudaSparse24, TheGradientOfXAndOfTheValuesMatchTheCpu) {
  NEEDS_GPU();
  manual_seed(5);
  const SemiStructuredSparse w = to_sparse_semi_structured(prune_2_4(randn({64, 128})), DType::f32);
  const Tensor x = randn({9, 128}), g = randn({9, 64});
  auto grads = [&](Device dev) {
    SemiStructuredSparse d{w.values.to(dev).detach().requires_grad_(), w.meta.to(dev), w.scales.to(dev)};
    const Tensor xd = x.to(dev).detach().requires_grad_();
    sum(linear(xd, d) * g.to(dev)).backward();
    return std::pair{xd.grad().to(Device::cpu()), d.values.grad().to(Device::cpu())};
  };
  const auto [gx_cpu, gv_cpu] = grads(Device::cpu());
  const auto [gx_gpu, gv_gpu] = grads(kGpu);
  EXPECT_TRUE(test::all_close(gx_gpu, gx_cpu, 1e-5, 1e-5));
  EXPECT_TRUE(test::all_close(gv_gpu, gv_cpu, 1e-5, 1e-5));
}

// A model sparsified as `sinter sparsify` does generates the same greedy tokens on the GPU.
TEST(CudaSparse24, ASparsifiedModelGeneratesOnTheGpuAsOnTheCpu) {
  NEEDS_GPU();
  const nn::ModelConfig cfg = test::micro_config("llama");
  manual_seed(12);
  nn::GPT model(cfg);
  model.eval();
  model.sparsify(DType::bf16);
  NoGradGuard no_grad;
  const Tensor prompt = randint(0, cfg.vocab_size, {1, 5});
  const Tensor cpu = model.forward(prompt);
  model.to(kGpu);
  const Tensor gpu = model.forward(prompt.to(kGpu)).to(Device::cpu());
  EXPECT_TRUE(test::all_close(gpu, cpu, 1e-4, 1e-4));  // f32 x: the dense copy of the bf16 values, exact in f32
  EXPECT_TRUE(test::bitwise_equal(argmax(gpu, -1), argmax(cpu, -1)));
}

// A bf16 model sparsified to 2:4 runs its layers through cuSPARSELt (prefill at M = 5, padded to 8
// rows) as through their dense copies on cuBLASLt: the same products, f32 accumulation in another
// order, so the logits agree within bf16 rounding; greedy decoding (M = 1) runs on every path.
TEST(CudaSparse24, ABf16SparsifiedModelRunsThroughCuSparseLtAsThroughItsDenseCopy) {
  NEEDS_GPU();
  const nn::ModelConfig cfg = test::micro_config("llama");
  manual_seed(13);
  nn::GPT model(cfg);
  model.eval();
  model.sparsify(DType::bf16);
  model.to(DType::bf16);
  model.to(kGpu);
  NoGradGuard no_grad;
  const Tensor prompt = randint(0, cfg.vocab_size, {1, 5}).to(kGpu);
  std::map<std::string, Tensor> logits;
  for_each_path([&](const std::string& path) {
    logits[path] = model.forward(prompt).to(Device::cpu()).to(DType::f64);
    const Tensor tokens = train::generate(model, prompt.to(Device::cpu()).reshape({5}), 6, {.temperature = 0}, true);
    EXPECT_EQ(tokens.numel(), 11) << path;
    EXPECT_TRUE(max(tokens).item<int64_t>() < cfg.vocab_size && min(tokens).item<int64_t>() >= 0) << path;
  });
  EXPECT_LE(relative_error(logits["sparse"], logits["dense"]), std::ldexp(1.0, -6));
  EXPECT_LE(relative_error(logits["auto"], logits["dense"]), std::ldexp(1.0, -6));
}

namespace {

// A bf16 2:4 weight on the GPU, and its dense matrix in f64.
struct GpuWeight {
  SemiStructuredSparse gpu;
  Tensor dense64;
};

GpuWeight bf16_weight_on_gpu(int64_t N, int64_t K) {
  const SemiStructuredSparse w = to_sparse_semi_structured(prune_2_4(randn({N, K}) * 0.1), DType::bf16);
  return {on_gpu(w), w.to_dense().to(DType::f64)};
}

// The GPU's x w^T for a bf16 x of M random rows, against the f64 product: the relative error.
double error_at(const GpuWeight& w, int64_t M) {
  const Tensor x = randn({M, w.dense64.size(1)}).to(DType::bf16);
  const Tensor got = linear(x.to(kGpu), w.gpu).to(Device::cpu()).to(DType::f64);
  return relative_error(got, matmul(x.to(DType::f64), w.dense64.t()));
}

}  // namespace

// Each M gets its own plan, but only the first M of a bucket (M rounded up to a power of two) runs
// cuSPARSELt's algorithm search; the others reuse its choice and give the same products. An M
// whose shape lacks that algorithm searches its own (M = 136 after 144, on the emulator).
TEST(CudaSparse24, TheFirstMOfABucketSearchesAndTheOthersReuseItsAlgorithm) {
  NEEDS_GPU();
  manual_seed(8);
  const GpuWeight w = bf16_weight_on_gpu(64, 128);
  setenv("SINTER_SPARSE24_CUDA", "sparse", 1);
  const int64_t before = searches();
  std::vector<int64_t> after;
  for (const int64_t M : {40, 48, 61, 72, 144, 136}) {  // buckets 64, 64, 64, 128, 256, 256
    EXPECT_LE(error_at(w, M), std::ldexp(1.0, -7)) << "M=" << M;
    after.push_back(searches() - before);
  }
  unsetenv("SINTER_SPARSE24_CUDA");
  if (before < 0) GTEST_SKIP() << "the products hold; cuSPARSELt does not count its searches (the emulator does)";
  EXPECT_EQ(after, (std::vector<int64_t>{1, 1, 1, 2, 3, 4}));
}

// A weight keeps its kCusparseltPlansPerWeight most recently used plans (one per M), however many
// Ms it sees: a decode step's M = 8, used between 40 prefill lengths, keeps its plan; a forgotten M
// gets a new plan without a search (its bucket's choice is kept) and the same product.
TEST(CudaSparse24, AWeightKeepsItsMostRecentlyUsedPlans) {
  NEEDS_GPU();
  manual_seed(10);
  const GpuWeight w = bf16_weight_on_gpu(32, 64);
  std::vector<int64_t> Ms;
  for (int64_t i = 1; i <= 40; ++i) Ms.insert(Ms.end(), {8 * i, 8});  // buckets 8 to 512
  Ms.insert(Ms.end(), {16, 320});                                    // one forgotten, one kept
  setenv("SINTER_SPARSE24_CUDA", "sparse", 1);
  const int64_t searches_before = emulated("searches");
  int64_t alive = 0, made = 0;  // counted once the first call has freed the plans of weights gone
  for (const int64_t M : Ms) {
    EXPECT_LE(error_at(w, M), std::ldexp(1.0, -7)) << "M=" << M;
    if (alive == 0) alive = emulated("plans"), made = emulated("plans_made");
  }
  unsetenv("SINTER_SPARSE24_CUDA");
  if (searches_before < 0) GTEST_SKIP() << "the products hold; cuSPARSELt does not count its plans (the emulator does)";
  EXPECT_EQ(emulated("plans") - alive, int64_t(cuda::kCusparseltPlansPerWeight) - 1);
  EXPECT_EQ(emulated("plans_made") - made, 39 + 1);  // the other Ms, and 16 again
  EXPECT_EQ(emulated("searches") - searches_before, 7);  // one per bucket: 8, 16, 32, 64, 128, 256, 512
}

// prune_2_4, mask_2_4 and to_sparse_semi_structured of a GPU tensor run on the GPU (the
// sparse24_select and sparse24_gather kernels, int8 scales by ops) and give the CPU's bytes: ties,
// zero groups and K not a multiple of 8 included; a group of three nonzeros is named from the GPU.
TEST(CudaSparse24, PruningAndPackingOnTheGpuGiveTheCpusBytes) {
  NEEDS_GPU();
  manual_seed(9);
  Tensor w = randn({48, 96});
  w.narrow(0, 0, 1).copy_(tensor<float>(std::vector<float>(96, 0.5f), {1, 96}));  // a row of ties
  w.narrow(0, 1, 1).zero_();
  for (const DType dt : {DType::f32, DType::bf16}) {
    const Tensor wd = w.to(dt);
    const Tensor pruned = prune_2_4(wd);
    const Tensor pruned_gpu = prune_2_4(wd.to(kGpu));
    EXPECT_EQ(pruned_gpu.device(), kGpu);
    EXPECT_TRUE(test::bitwise_equal(pruned_gpu.to(Device::cpu()), pruned)) << dtype_name(dt);
    const Tensor w3 = randn({2, 5, 12}).to(dt);  // K = 12: half a meta byte
    EXPECT_TRUE(test::bitwise_equal(mask_2_4(w3.to(kGpu)).to(Device::cpu()), mask_2_4(w3))) << dtype_name(dt);
    for (const DType vt : {DType::f32, DType::bf16, DType::i8}) {
      const SemiStructuredSparse cpu = to_sparse_semi_structured(pruned, vt);
      const SemiStructuredSparse gpu = to_sparse_semi_structured(pruned.to(kGpu), vt);
      ASSERT_EQ(gpu.values.device(), kGpu);
      EXPECT_TRUE(test::bitwise_equal(gpu.values.to(Device::cpu()), cpu.values)) << dtype_name(dt) << " -> " << dtype_name(vt);
      EXPECT_TRUE(test::bitwise_equal(gpu.meta.to(Device::cpu()), cpu.meta)) << dtype_name(dt) << " -> " << dtype_name(vt);
      EXPECT_TRUE(test::bitwise_equal(gpu.scales.to(Device::cpu()), cpu.scales)) << dtype_name(dt) << " -> " << dtype_name(vt);
    }
  }
  Tensor crowded = prune_2_4(w);
  crowded.narrow(0, 3, 1).narrow(1, 4, 4).copy_(tensor<float>({1, 2, 3, 0}, {1, 4}));
  try {
    to_sparse_semi_structured(crowded.to(kGpu));
    FAIL() << "accepted three nonzeros in a group";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("row 3, columns 4..7 hold 3 nonzeros (1, 2, 3, 0)"), std::string::npos) << e.what();
  }
}

// A model moved to the GPU and sparsified there equals one sparsified on the CPU and moved.
TEST(CudaSparse24, AModelSparsifiedOnTheGpuEqualsOneSparsifiedOnTheCpu) {
  NEEDS_GPU();
  const nn::ModelConfig cfg = test::micro_config("llama");
  manual_seed(14);
  nn::GPT on_cpu(cfg);
  manual_seed(14);
  nn::GPT on_device(cfg);
  on_cpu.eval(), on_device.eval();
  on_cpu.sparsify(DType::bf16);
  on_cpu.to(kGpu);
  on_device.to(kGpu);
  on_device.sparsify(DType::bf16);
  NoGradGuard no_grad;
  const Tensor prompt = randint(0, cfg.vocab_size, {1, 7}).to(kGpu);
  EXPECT_TRUE(test::bitwise_equal(on_device.forward(prompt).to(Device::cpu()), on_cpu.forward(prompt).to(Device::cpu())));
}

// The CUDA backend against PyTorch on the same GPU (bench/torch_peer.py, suite "cuda"): bf16 GEMMs
// (both sides call cuBLAS: the rows measure overhead), elementwise add and GELU on 1 GiB held to a
// device-to-device copy of the same traffic, causal bf16 attention and a decode step against
// PyTorch's SDPA backends, bf16 2:4 layers against dense ones and PyTorch's 2:4, a gpt2-124m bf16 training step (B=16, T=1024) and greedy generation of
// 256 tokens at batch 1. Every timing ends with the device's queue drained.
#include <sinter/cuda.h>
#include <sinter/sinter.h>
#include <sinter/sparse.h>

#include <cstdlib>
#include <sinter/train.h>

#include "harness.h"

namespace sinter::bench {
namespace {

const Device kGpu = Device::cuda(0);

// f run n times, then a wait for the device: per-call time.
template <class F> Timing gpu_time(F&& f, int n, int reps = 9) {
  const Timing t = time_it([&] {
    for (int i = 0; i < n; ++i) f();
    cuda::synchronize();
  }, 2, reps, 0.2);
  return {t.best_ms / n, t.median_ms / n};
}

void gemm_rows(const Options& o, Report& r) {
  const std::vector<int64_t> ms = o.quick ? std::vector<int64_t>{1, 1024} : std::vector<int64_t>{1, 16, 128, 1024, 4096};
  for (auto [K, N] : {std::pair<int64_t, int64_t>{4096, 4096}, {4096, 11008}}) {
    const Tensor w = (randn({K, N}, DType::f32, kGpu) * 0.02).to(DType::bf16);
    for (int64_t M : ms) {
      const Tensor x = randn({M, K}, DType::f32, kGpu).to(DType::bf16);
      const Timing t = gpu_time([&] { (void)matmul(x, w); }, M >= 1024 ? 20 : 100);
      char note[64];
      std::snprintf(note, sizeof note, "%.0f TFLOP/s", 2.0 * double(M * K * N) / (t.best_ms * 1e-3) / 1e12);
      r.ours_only("cuda matmul bf16 M=" + std::to_string(M) + " K=" + std::to_string(K) + " N=" + std::to_string(N), t, note);
    }
  }
}

// Each op's bytes read and written, against a copy moving as many (half read, half written).
void elementwise_rows(Report& r) {
  const int64_t n = int64_t(1) << 29;  // 1 GiB of bf16
  const Tensor x = randn({n}, DType::f32, kGpu).to(DType::bf16), y = randn({n}, DType::f32, kGpu).to(DType::bf16);
  struct Case {
    const char* name;
    std::function<void()> run;
    int64_t bytes;  // read + written
  };
  for (const Case& c : {Case{"cuda add bf16 1 GiB", [&] { (void)add(x, y); }, 6 * n}, Case{"cuda gelu bf16 1 GiB", [&] { (void)gelu(x); }, 4 * n}}) {
    const Tensor dst = Tensor::empty({c.bytes / 2}, DType::u8, kGpu), src = Tensor::empty({c.bytes / 2}, DType::u8, kGpu);
    const Timing ours = gpu_time(c.run, 3, 7);
    const Timing copy = gpu_time([&] { cuda::copy_device_bytes(dst.data_ptr(), src.data_ptr(), c.bytes / 2); }, 3, 7);
    char note[96];
    std::snprintf(note, sizeof note, "ours %.0f GB/s, copy %.0f GB/s (bytes read + written)", double(c.bytes) / (ours.best_ms * 1e6),
                  double(c.bytes) / (copy.best_ms * 1e6));
    r.add(c.name, ours, "device-to-device copy of the same traffic", copy, note);
  }
}

// Causal bf16 attention at B=4, H=32, D=128: forward, and forward with backward, in TFLOP/s
// (causal: half of the forward's 4 B H S^2 D; the backward 2.5 times the forward, as FlashAttention-2
// counts). PyTorch's SDPA backends are the peers (bench/torch_peer.py).
void attention_rows(const Options& o, Report& r) {
  const int64_t B = 4, H = 32, D = 128;
  for (int64_t S : o.quick ? std::vector<int64_t>{1024} : std::vector<int64_t>{1024, 4096, 16384}) {
    auto bf16 = [&] { return randn({B, H, S, D}, DType::f32, kGpu).to(DType::bf16); };
    const Tensor q = bf16(), k = bf16(), v = bf16(), g = bf16();
    const std::string name = "cuda sdpa causal bf16 B=4 H=32 S=" + std::to_string(S) + " D=128";
    const double fwd = 2.0 * double(B * H * D) * double(S) * double(S);
    const int n = S >= 16384 ? 2 : S >= 4096 ? 5 : 20;
    char note[96];
    Timing t;
    {
      NoGradGuard no_grad;
      t = gpu_time([&] { (void)scaled_dot_product_attention(q, k, v, {}, 0.0, true); }, n, 5);
    }
    std::snprintf(note, sizeof note, "%.0f TFLOP/s; %s", fwd / (t.best_ms * 1e-3) / 1e12, sdpa_choose(q, k, {}, 0.0).reason.c_str());
    r.ours_only(name + " forward", t, note);
    const Tensor qg = q.detach().requires_grad_(), kg = k.detach().requires_grad_(), vg = v.detach().requires_grad_();
    t = gpu_time([&] { (void)autograd::grad({scaled_dot_product_attention(qg, kg, vg, {}, 0.0, true)}, {qg, kg, vg}, {g}); }, n, 5);
    std::snprintf(note, sizeof note, "%.0f TFLOP/s", 3.5 * fwd / (t.best_ms * 1e-3) / 1e12);
    r.ours_only(name + " forward+backward", t, note);
  }
  // Decode: one query per head over a full cache of 8192 positions, 32 query heads on 8 KV heads;
  // held to a copy moving as many bytes as reading the cache.
  NoGradGuard no_grad;
  const int64_t L = 8192;
  const Tensor q = randn({1, 32, 1, D}, DType::f32, kGpu).to(DType::bf16);
  const Tensor k = randn({1, 8, L, D}, DType::f32, kGpu).to(DType::bf16), v = randn({1, 8, L, D}, DType::f32, kGpu).to(DType::bf16);
  const int64_t bytes = 2 * k.numel() * 2;
  const Tensor dst = Tensor::empty({bytes / 2}, DType::u8, kGpu), src = Tensor::empty({bytes / 2}, DType::u8, kGpu);
  const Timing ours = gpu_time([&] { (void)scaled_dot_product_attention(q, k, v, {}, 0.0, false, {}, true); }, 50);
  const Timing copy = gpu_time([&] { cuda::copy_device_bytes(dst.data_ptr(), src.data_ptr(), bytes / 2); }, 50);
  char note[96];
  std::snprintf(note, sizeof note, "reads the cache at %.0f GB/s; the copy moves %.0f GB/s", double(bytes) / (ours.best_ms * 1e6),
                double(bytes) / (copy.best_ms * 1e6));
  r.add("cuda sdpa decode bf16 Lq=1 cache=8192 GQA 32:8 D=128", ours, "device copy of the same traffic", copy, note);
}

// bf16 2:4 linear layers against dense cuBLASLt on the same pruned weight (both Sinter's), with
// PyTorch's to_sparse_semi_structured as the peer of each row (bench/torch_peer.py). Ours is the
// layer as a user calls it (the timed choice per M); the note has cuSPARSELt alone.
void sparse_rows(const Options& o, Report& r) {
  NoGradGuard no_grad;
  const std::vector<int64_t> ms = o.quick ? std::vector<int64_t>{1, 4096} : std::vector<int64_t>{1, 16, 128, 1024, 4096, 16384};
  for (auto [K, N] : {std::pair<int64_t, int64_t>{4096, 4096}, {4096, 11008}, {8192, 28672}}) {
    manual_seed(1);
    const SemiStructuredSparse host = to_sparse_semi_structured(prune_2_4(randn({N, K}) * 0.02), DType::bf16);
    const SemiStructuredSparse w{host.values.to(kGpu), host.meta.to(kGpu), host.scales.to(kGpu)};
    const Tensor dense = w.to_dense();
    for (int64_t M : ms) {
      const Tensor x = randn({M, K}, DType::f32, kGpu).to(DType::bf16);
      const int n = M >= 4096 ? 3 : 20;
      (void)linear(x, w);  // the first call at this M makes the choice
      const Timing ours = gpu_time([&] { (void)linear(x, w); }, n, 5);
      const Timing dense_t = gpu_time([&] { (void)linear(x, dense); }, n, 5);
      char note[160];
      setenv("SINTER_SPARSE24_CUDA", "sparse", 1);
      try {
        const Timing alone = gpu_time([&] { (void)linear(x, w); }, n, 5);
        std::snprintf(note, sizeof note, "cuSPARSELt alone %.3f ms (%.2fx dense)", alone.best_ms, dense_t.best_ms / alone.best_ms);
      } catch (const Error& e) {
        std::snprintf(note, sizeof note, "%s", e.what());
      }
      unsetenv("SINTER_SPARSE24_CUDA");
      r.add("cuda 2:4 linear bf16 M=" + std::to_string(M) + " K=" + std::to_string(K) + " N=" + std::to_string(N), ours,
            "dense cuBLASLt, same pruned weight", dense_t, note);
    }
  }
}

// gpt2-124m, bf16 autocast (f32 master weights, AdamW), B=16 x T=1024, attention on its math path.
void train_rows(const Options& o, Report& r) {
  const int64_t B = 16, T = 1024;
  manual_seed(0);
  nn::GPT model(nn::ModelConfig::preset("gpt2-124m"));
  model.init_weights(0);
  model.to(kGpu);
  model.train();
  optim::AdamW opt(model.named_parameters(), 6e-4, 0.9, 0.95, 1e-8, 0.1);
  const int64_t V = model.config().vocab_size;
  const Tensor x = randint(0, V, {B, T}).to(kGpu), y = randint(0, V, {B, T}).to(kGpu);
  const Timing t = time_it([&] {
    (void)train::step(model, opt, x, y, 1.0, DType::bf16).item_double();  // reading the loss drains the queue
  }, 2, o.quick ? 3 : 8, 0);
  // PaLM's count: 6 N per token for the weights, 12 L C T for attention's scores and values.
  const double flops_per_token = 6.0 * double(model.num_parameters()) + 12.0 * 12 * 768 * double(T);
  const double tok_s = double(B * T) / (t.best_ms * 1e-3);
  char note[160];
  std::snprintf(note, sizeof note, "%.0f tokens/s, MFU %.1f%% of 989 TFLOP/s (H100/H200 SXM bf16 dense; llm.c reaches ~60%%)", tok_s,
                100.0 * tok_s * flops_per_token / 989e12);
  // PyTorch times it three ways (bench/torch_peer.py): math attention, its best attention, torch.compile.
  r.ours_only("cuda train bf16 gpt2-124m B=16 T=1024 step", t, note);
}

// Greedy generation of 256 tokens at batch 1 (per-token time) of a bf16 model on the GPU.
Timing generate_time(const nn::ModelConfig& cfg, bool sparse) {
  NoGradGuard no_grad;
  manual_seed(0);
  nn::GPT model(cfg);
  model.init_weights(0);
  model.eval();
  if (sparse) model.sparsify(DType::bf16);  // as `sinter sparsify --values bf16` leaves it
  model.to(DType::bf16);
  model.to(kGpu);
  const Tensor prompt = randint(0, cfg.vocab_size, {16});
  const train::Sampling greedy{.temperature = 0};
  const int64_t n_new = 256;
  const Timing t = time_it([&] { (void)train::generate(model, prompt, n_new, greedy, true); }, 1, 3, 0);
  return {t.best_ms / n_new, t.median_ms / n_new};
}

// gpt2-124m against PyTorch eager; it and a 24-layer, 1024-wide model (GPT-2 medium's shape)
// sparsified to 2:4 against their dense selves.
void generate_rows(Report& r) {
  const nn::ModelConfig small = nn::ModelConfig::preset("gpt2-124m");
  nn::ModelConfig medium = small;
  medium.hidden_size = 1024, medium.num_hidden_layers = 24, medium.num_attention_heads = 16, medium.num_key_value_heads = 16;
  medium.intermediate_size = 4096;
  const Timing dense_small = generate_time(small, false);
  char note[64];
  std::snprintf(note, sizeof note, "%.0f tokens/s", 1e3 / dense_small.best_ms);
  r.ours_only("cuda generate bf16 gpt2-124m batch=1 256 tokens (per token)", dense_small, note);
  const Timing sparse_small = generate_time(small, true);
  std::snprintf(note, sizeof note, "%.0f tokens/s", 1e3 / sparse_small.best_ms);
  r.add("cuda generate bf16 gpt2-124m 2:4 (per token)", sparse_small, "the dense model (Sinter)", dense_small, note);
  const Timing dense_medium = generate_time(medium, false), sparse_medium = generate_time(medium, true);
  std::snprintf(note, sizeof note, "%.0f tokens/s", 1e3 / sparse_medium.best_ms);
  r.add("cuda generate bf16 24x1024 2:4 (per token)", sparse_medium, "the dense model (Sinter)", dense_medium, note);
}

}  // namespace

void suite_cuda(const Options& o, Report& r) {
  cuda::require_device(0);  // "no CUDA device: <reason>" (the command line exits 1)
  r.line("GPU: " + cuda::device_name(0));
  manual_seed(0);
  r.expect(o.quick ? 4 + 2 + 2 + 1 + 6 + 1 + 3 : 10 + 2 + 6 + 1 + 18 + 1 + 3);
  {
    NoGradGuard no_grad;
    gemm_rows(o, r);
    elementwise_rows(r);
  }
  attention_rows(o, r);
  sparse_rows(o, r);
  train_rows(o, r);
  generate_rows(r);
  const cuda::MemoryStats m = cuda::memory_stats();
  r.line("cuda:0 memory: peak " + std::to_string(m.peak >> 20) + " MiB held by tensors");
}

}  // namespace sinter::bench

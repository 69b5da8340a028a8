// The CUDA backend against PyTorch on the same GPU (bench/torch_peer.py, suite "cuda"): bf16 GEMMs
// (both sides call cuBLAS: the rows measure overhead), elementwise add and GELU on 1 GiB held to a
// device-to-device copy of the same traffic, causal bf16 attention and a decode step against
// PyTorch's SDPA backends, bf16 2:4 layers against dense ones and PyTorch's 2:4, a gpt2-124m bf16
// training step (B=16, T=1024), greedy generation of 256 tokens at batch 1 and a token drawn with
// top-k/top-p from 50257 logits. Every timing ends with the device's queue drained. On the CUDA
// emulator the same code runs once per row at tiny sizes (`Sizes::emulated`): CI checks that the
// suite runs; its times there mean nothing.
#include <sinter/cuda.h>
#include <sinter/sinter.h>
#include <sinter/sparse.h>
#include <sinter/train.h>

#include <cstdlib>

#include "harness.h"

namespace sinter::bench {
namespace {

const Device kGpu = Device::cuda(0);

using Shape2 = std::pair<int64_t, int64_t>;

// What the suite times: the issues' sizes on a GPU (names match bench/torch_peer.py's rows).
struct Sizes {
  std::vector<int64_t> gemm_m;
  std::vector<Shape2> gemm_kn;
  int64_t elementwise_n;                   // bf16 elements
  int64_t attn_b, attn_h, attn_d;
  std::vector<int64_t> attn_s;
  int64_t decode_cache, decode_heads, decode_kv_heads;
  std::vector<int64_t> sparse_m;
  std::vector<Shape2> sparse_kn;           // (K, N) of the weight
  nn::ModelConfig model, large;            // trained and generated; `large` generated dense and 2:4
  std::string model_name;                  // the model's preset, as the rows name it
  int64_t train_b, train_t, new_tokens;
  bool once = false;                       // one call per timing, no warm-up (the emulator)
  int64_t vocab = 50257;                   // logits a sampled token is drawn from (GPT-2's vocabulary)

  static Sizes gpu(bool quick) {
    Sizes s{quick ? std::vector<int64_t>{1, 1024} : std::vector<int64_t>{1, 16, 128, 1024, 4096}, {{4096, 4096}, {4096, 11008}},
            int64_t(1) << 29, 4, 32, 128, quick ? std::vector<int64_t>{1024} : std::vector<int64_t>{1024, 4096, 16384}, 8192, 32, 8,
            quick ? std::vector<int64_t>{1, 4096} : std::vector<int64_t>{1, 16, 128, 1024, 4096, 16384},
            {{4096, 4096}, {4096, 11008}, {8192, 28672}}, nn::ModelConfig::preset("gpt2-124m"), {}, "gpt2-124m", 16, 1024, 256};
    s.large = s.model;  // GPT-2 medium's shape
    s.large.hidden_size = 1024, s.large.num_hidden_layers = 24, s.large.num_attention_heads = 16, s.large.num_key_value_heads = 16;
    s.large.intermediate_size = 4096;
    return s;
  }
  static Sizes emulated() {
    Sizes s{{1, 16}, {{64, 64}, {64, 96}}, 4096, 1, 2, 64, {64}, 128, 4, 2, {1, 16}, {{64, 64}, {128, 64}},
            nn::ModelConfig::preset("tiny"), {}, "tiny", 2, 32, 4, true};
    s.large = s.model;
    s.large.num_hidden_layers = 2 * s.model.num_hidden_layers;
    s.vocab = 300;
    return s;
  }
  int rows() const {
    return int(gemm_m.size() * gemm_kn.size() + 2 + 4 * attn_s.size() + 1 + sparse_m.size() * sparse_kn.size() + 1 + 4 + 2);
  }
};

std::string bytes_label(int64_t bytes) {
  return bytes >= int64_t(1) << 30 ? std::to_string(bytes >> 30) + " GiB" : std::to_string(bytes >> 10) + " KiB";
}

// f run n times, then a wait for the device: per-call time.
template <class F> Timing gpu_time(const Sizes& z, F&& f, int n, int reps = 9) {
  if (z.once) n = 1;
  const Timing t = time_it([&] {
    for (int i = 0; i < n; ++i) f();
    cuda::synchronize();
  }, z.once ? 0 : 2, z.once ? 1 : reps, z.once ? 0 : 0.2);
  return {t.best_ms / n, t.median_ms / n};
}

void gemm_rows(const Sizes& z, Report& r) {
  for (auto [K, N] : z.gemm_kn) {
    const Tensor w = (randn({K, N}, DType::f32, kGpu) * 0.02).to(DType::bf16);
    for (int64_t M : z.gemm_m) {
      const Tensor x = randn({M, K}, DType::f32, kGpu).to(DType::bf16);
      const Timing t = gpu_time(z, [&] { (void)matmul(x, w); }, M >= 1024 ? 20 : 100);
      char note[64];
      std::snprintf(note, sizeof note, "%.0f TFLOP/s", 2.0 * double(M * K * N) / (t.best_ms * 1e-3) / 1e12);
      r.ours_only("cuda matmul bf16 M=" + std::to_string(M) + " K=" + std::to_string(K) + " N=" + std::to_string(N), t, note);
    }
  }
}

// Each op's bytes read and written, against a copy moving as many (half read, half written).
void elementwise_rows(const Sizes& z, Report& r) {
  const int64_t n = z.elementwise_n;
  const Tensor x = randn({n}, DType::f32, kGpu).to(DType::bf16), y = randn({n}, DType::f32, kGpu).to(DType::bf16);
  struct Case {
    std::string name;
    std::function<void()> run;
    int64_t bytes;  // read + written
  };
  const std::string size = bytes_label(2 * n);
  for (const Case& c : {Case{"cuda add bf16 " + size, [&] { (void)add(x, y); }, 6 * n},
                        Case{"cuda gelu bf16 " + size, [&] { (void)gelu(x); }, 4 * n}}) {
    const Tensor dst = Tensor::empty({c.bytes / 2}, DType::u8, kGpu), src = Tensor::empty({c.bytes / 2}, DType::u8, kGpu);
    const Timing ours = gpu_time(z, c.run, 3, 7);
    const Timing copy = gpu_time(z, [&] { cuda::copy_device_bytes(dst.data_ptr(), src.data_ptr(), c.bytes / 2); }, 3, 7);
    char note[96];
    std::snprintf(note, sizeof note, "ours %.0f GB/s, copy %.0f GB/s (bytes read + written)", double(c.bytes) / (ours.best_ms * 1e6),
                  double(c.bytes) / (copy.best_ms * 1e6));
    r.add(c.name, ours, "device-to-device copy of the same traffic", copy, note);
  }
}

// fn() with cuDNN's attention turned off (Sinter's own flash kernels), the caller's setting restored.
template <class Fn> auto without_cudnn(Fn&& fn) {
  const char* was = std::getenv("SINTER_CUDNN_ATTENTION");
  const std::string before = was ? was : "";
  setenv("SINTER_CUDNN_ATTENTION", "0", 1);
  auto out = fn();
  if (was) setenv("SINTER_CUDNN_ATTENTION", before.c_str(), 1);
  else unsetenv("SINTER_CUDNN_ATTENTION");
  return out;
}

// Causal bf16 attention (B=4, H=32, D=128 on a GPU): forward, and forward with backward, in TFLOP/s
// (causal: half of the forward's 4 B H S^2 D; the backward 2.5 times the forward, as FlashAttention-2
// counts). PyTorch's SDPA backends are the peers (bench/torch_peer.py); Sinter's own kernels (cuDNN
// turned off: the tensor-core flash kernels) are held to the rows' calls, which cuDNN runs where it
// is found.
void attention_rows(const Sizes& z, Report& r) {
  const int64_t B = z.attn_b, H = z.attn_h, D = z.attn_d;
  for (int64_t S : z.attn_s) {
    auto bf16 = [&] { return randn({B, H, S, D}, DType::f32, kGpu).to(DType::bf16); };
    const Tensor q = bf16(), k = bf16(), v = bf16(), g = bf16();
    const std::string name = "cuda sdpa causal bf16 B=" + std::to_string(B) + " H=" + std::to_string(H) + " S=" + std::to_string(S) +
                             " D=" + std::to_string(D);
    const double fwd = 2.0 * double(B * H * D) * double(S) * double(S);
    const int n = S >= 16384 ? 2 : S >= 4096 ? 5 : 20;
    char note[160];
    auto forward = [&] {  // the forward's time; its rate and kernel in `note`
      NoGradGuard no_grad;
      const Timing t = gpu_time(z, [&] { (void)scaled_dot_product_attention(q, k, v, {}, 0.0, true); }, n, 5);
      std::snprintf(note, sizeof note, "%.0f TFLOP/s; %s", fwd / (t.best_ms * 1e-3) / 1e12, sdpa_choose(q, k, {}, 0.0).reason.c_str());
      return t;
    };
    const Tensor qg = q.detach().requires_grad_(), kg = k.detach().requires_grad_(), vg = v.detach().requires_grad_();
    auto both = [&] {  // forward and backward's time; the rate in `note`
      const Timing t =
          gpu_time(z, [&] { (void)autograd::grad({scaled_dot_product_attention(qg, kg, vg, {}, 0.0, true)}, {qg, kg, vg}, {g}); }, n, 5);
      std::snprintf(note, sizeof note, "%.0f TFLOP/s", 3.5 * fwd / (t.best_ms * 1e-3) / 1e12);
      return t;
    };
    const Timing t = forward();
    r.ours_only(name + " forward", t, note);
    const Timing own = without_cudnn(forward);  // before `note` is read: arguments have no order
    r.add(name + " forward, Sinter's flash kernel", own, "the forward row's call", t, note);
    const Timing tb = both();
    r.ours_only(name + " forward+backward", tb, note);
    const Timing own_b = without_cudnn(both);
    r.add(name + " forward+backward, Sinter's flash kernels", own_b, "the forward+backward row's call", tb, note);
  }
  // Decode: one query per head over a full cache (8192 positions, 32 query heads on 8 KV heads on a
  // GPU), held to a copy moving as many bytes as reading the cache.
  NoGradGuard no_grad;
  const int64_t L = z.decode_cache, Hq = z.decode_heads, Hkv = z.decode_kv_heads;
  const Tensor q = randn({1, Hq, 1, D}, DType::f32, kGpu).to(DType::bf16);
  const Tensor k = randn({1, Hkv, L, D}, DType::f32, kGpu).to(DType::bf16), v = randn({1, Hkv, L, D}, DType::f32, kGpu).to(DType::bf16);
  const int64_t bytes = 2 * k.numel() * 2;
  const Tensor dst = Tensor::empty({bytes / 2}, DType::u8, kGpu), src = Tensor::empty({bytes / 2}, DType::u8, kGpu);
  const Timing ours = gpu_time(z, [&] { (void)scaled_dot_product_attention(q, k, v, {}, 0.0, false, {}, true); }, 50);
  const Timing copy = gpu_time(z, [&] { cuda::copy_device_bytes(dst.data_ptr(), src.data_ptr(), bytes / 2); }, 50);
  char note[96];
  std::snprintf(note, sizeof note, "reads the cache at %.0f GB/s; the copy moves %.0f GB/s", double(bytes) / (ours.best_ms * 1e6),
                double(bytes) / (copy.best_ms * 1e6));
  r.add("cuda sdpa decode bf16 Lq=1 cache=" + std::to_string(L) + " GQA " + std::to_string(Hq) + ":" + std::to_string(Hkv) +
            " D=" + std::to_string(D),
        ours, "device copy of the same traffic", copy, note);
}

// bf16 2:4 linear layers against dense cuBLASLt on the same pruned weight (both Sinter's), with
// PyTorch's to_sparse_semi_structured as the peer of each row (bench/torch_peer.py). Ours is the
// layer as a user calls it (the timed choice per M); the note has cuSPARSELt alone.
void sparse_rows(const Sizes& z, Report& r) {
  NoGradGuard no_grad;
  for (auto [K, N] : z.sparse_kn) {
    manual_seed(1);
    const SemiStructuredSparse w = to_sparse_semi_structured(prune_2_4(randn({N, K}, DType::f32, kGpu) * 0.02), DType::bf16);  // on the GPU
    const Tensor dense = w.to_dense();
    for (int64_t M : z.sparse_m) {
      const Tensor x = randn({M, K}, DType::f32, kGpu).to(DType::bf16);
      const int n = M >= 4096 ? 3 : 20;
      (void)linear(x, w);  // the first call at this M makes the choice
      const Timing ours = gpu_time(z, [&] { (void)linear(x, w); }, n, 5);
      const Timing dense_t = gpu_time(z, [&] { (void)linear(x, dense); }, n, 5);
      char note[160];
      setenv("SINTER_SPARSE24_CUDA", "sparse", 1);
      try {
        const Timing alone = gpu_time(z, [&] { (void)linear(x, w); }, n, 5);
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

// The model (gpt2-124m on a GPU), bf16 autocast (f32 master weights, AdamW), attention on its math
// path.
void train_rows(const Options& o, const Sizes& z, Report& r) {
  const int64_t B = z.train_b, T = z.train_t;
  manual_seed(0);
  nn::GPT model(z.model);
  model.init_weights(0);
  model.to(kGpu);
  model.train();
  optim::AdamW opt(model.named_parameters(), 6e-4, 0.9, 0.95, 1e-8, 0.1);
  const int64_t V = model.config().vocab_size;
  const Tensor x = randint(0, V, {B, T}).to(kGpu), y = randint(0, V, {B, T}).to(kGpu);
  const Timing t = time_it([&] {
    (void)train::step(model, opt, x, y, 1.0, DType::bf16).item_double();  // reading the loss drains the queue
  }, z.once ? 0 : 2, z.once ? 1 : o.quick ? 3 : 8, 0);
  // PaLM's count: 6 N per token for the weights, 12 L C T for attention's scores and values.
  const double flops_per_token =
      6.0 * double(model.num_parameters()) + 12.0 * double(z.model.num_hidden_layers * z.model.hidden_size) * double(T);
  const double tok_s = double(B * T) / (t.best_ms * 1e-3);
  char note[160];
  std::snprintf(note, sizeof note, "%.0f tokens/s, MFU %.1f%% of 989 TFLOP/s (H100/H200 SXM bf16 dense; llm.c reaches ~60%%)", tok_s,
                100.0 * tok_s * flops_per_token / 989e12);
  // PyTorch times it three ways (bench/torch_peer.py): math attention, its best attention, torch.compile.
  r.ours_only("cuda train bf16 " + z.model_name + " B=" + std::to_string(B) + " T=" + std::to_string(T) + " step", t, note);
}

// Greedy generation at batch 1 (per-token time) of a bf16 model on the GPU; `decode` says how its
// decode steps ran (a CUDA graph unless `eager` or refused).
Timing generate_time(const Sizes& z, const nn::ModelConfig& cfg, bool sparse, std::string* decode = nullptr, bool eager = false) {
  NoGradGuard no_grad;
  manual_seed(0);
  nn::GPT model(cfg);
  model.init_weights(0);
  model.eval();
  model.to(kGpu);
  if (sparse) model.sparsify(DType::bf16);  // on the GPU, as `sinter sparsify --values bf16` leaves it
  model.to(DType::bf16);
  const Tensor prompt = randint(0, cfg.vocab_size, {16});
  const train::Sampling greedy{.temperature = 0};
  if (eager) setenv("SINTER_CUDA_GRAPHS", "0", 1);
  const Timing t = time_it([&] { (void)train::generate(model, prompt, z.new_tokens, greedy, true, nullptr, {}, false, {}, decode); },
                           z.once ? 0 : 1, z.once ? 1 : 3, 0);
  if (eager) unsetenv("SINTER_CUDA_GRAPHS");
  return {t.best_ms / double(z.new_tokens), t.median_ms / double(z.new_tokens)};
}

// The model against PyTorch eager; it and a larger one (24 layers, 1024 wide on a GPU: GPT-2
// medium's shape) sparsified to 2:4 against their dense selves.
void generate_rows(const Sizes& z, Report& r) {
  const std::string large = std::to_string(z.large.num_hidden_layers) + "x" + std::to_string(z.large.hidden_size);
  std::string decode;
  const Timing dense_small = generate_time(z, z.model, false, &decode);
  const Timing dense_eager = generate_time(z, z.model, false, nullptr, true);
  char note[160];
  std::snprintf(note, sizeof note, "%.0f tokens/s; decode steps: %.100s", 1e3 / dense_small.best_ms, decode.c_str());
  const std::string tokens = std::to_string(z.new_tokens);
  r.ours_only("cuda generate bf16 " + z.model_name + " batch=1 " + tokens + " tokens (per token)", dense_small, note);
  r.add("cuda generate bf16 " + z.model_name + " CUDA graph decode steps (per token)", dense_small, "eager steps (Sinter)", dense_eager, "");
  const Timing sparse_small = generate_time(z, z.model, true);
  std::snprintf(note, sizeof note, "%.0f tokens/s", 1e3 / sparse_small.best_ms);
  r.add("cuda generate bf16 " + z.model_name + " 2:4 (per token)", sparse_small, "the dense model (Sinter)", dense_small, note);
  const Timing dense_large = generate_time(z, z.large, false), sparse_large = generate_time(z, z.large, true);
  std::snprintf(note, sizeof note, "%.0f tokens/s", 1e3 / sparse_large.best_ms);
  r.add("cuda generate bf16 " + large + " 2:4 (per token)", sparse_large, "the dense model (Sinter)", dense_large, note);
}

// One token drawn from a row of logits with top-k and top-p (on the device, the id read on the
// host: one wait), against PyTorch drawing the same way (topk or a sort, cumsum, multinomial).
void sampling_rows(const Sizes& z, Report& r) {
  const Tensor logits = randn({z.vocab}, DType::f32, kGpu) * 3;
  const std::string vocab = " vocab=" + std::to_string(z.vocab) + " (per token)";
  const train::Sampling top_k_p{.temperature = 0.8, .top_k = 50, .top_p = 0.9}, top_p{.temperature = 0.8, .top_p = 0.9};
  r.ours_only("cuda sample top-k 50 top-p 0.9" + vocab, gpu_time(z, [&] { (void)train::sample(logits, top_k_p); }, 20));
  r.ours_only("cuda sample top-p 0.9" + vocab, gpu_time(z, [&] { (void)train::sample(logits, top_p); }, 20));
}

}  // namespace

void suite_cuda(const Options& o, Report& r) {
  cuda::require_device(0);  // "no CUDA device: <reason>" (the command line exits 1)
  const Sizes z = cuda::emulated() ? Sizes::emulated() : Sizes::gpu(o.quick);
  r.line("GPU: " + cuda::device_name(0) + (z.once ? " (the CUDA emulator: tiny sizes, one call per row; the times mean nothing)" : ""));
  manual_seed(0);
  r.expect(z.rows());
  {
    NoGradGuard no_grad;
    gemm_rows(z, r);
    elementwise_rows(z, r);
  }
  attention_rows(z, r);
  sparse_rows(z, r);
  train_rows(o, z, r);
  generate_rows(z, r);
  sampling_rows(z, r);
  const cuda::MemoryStats m = cuda::memory_stats();
  r.line("cuda:0 memory: peak " + std::to_string(m.peak >> 20) + " MiB held by tensors");
}

}  // namespace sinter::bench

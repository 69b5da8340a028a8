// `sinter bench sweep`: shapes nobody tuned for, each row against PyTorch in the same run (eager
// rows against PyTorch eager, compiled rows against torch.compile; bench/torch_peer.py times the
// same cases) and 2:4 rows against Sinter's dense linear on the same weights. Attention at head
// dims that are no multiple of the vector width, decode and prefill, MHA and GQA, f32 and bf16;
// linear at small and odd sizes; the row ops at odd widths; reductions, cumsum, a transposing
// copy, embedding and layer_norm forward + backward; a compiled LLaMA block and GPT-2 block
// at three sizes, forward and forward + backward.
#include <sinter/compile.h>
#include <sinter/sinter.h>
#include <sinter/sparse.h>

#include "harness.h"

namespace sinter::bench {
namespace {

struct SdpaCase {
  int64_t D, Lq, Lkv, group;
  DType dt;
  bool backward;
};

std::string sdpa_name(const SdpaCase& c) {
  return std::string("sdpa ") + dtype_name(c.dt) + " D=" + std::to_string(c.D) + " Lq=" + std::to_string(c.Lq) +
         " Lkv=" + std::to_string(c.Lkv) + (c.group > 1 ? " GQA 4:1" : " MHA") + (c.backward ? " fwd+bwd" : " fwd");
}

// B = 1, 8 query heads, causal (bottom-right: a decode row sees the whole cache).
void sdpa_row(const SdpaCase& c, Report& r) {
  const int64_t Hq = 8, Hkv = Hq / c.group;
  Tensor q = randn({1, Hq, c.Lq, c.D}).to(c.dt), k = randn({1, Hkv, c.Lkv, c.D}).to(c.dt), v = randn({1, Hkv, c.Lkv, c.D}).to(c.dt);
  Tensor dout = randn({1, Hq, c.Lq, c.D}).to(c.dt);
  auto run = [&] {
    if (!c.backward) {
      NoGradGuard g;
      (void)scaled_dot_product_attention(q, k, v, {}, 0.0, true, {}, c.group > 1);
      return;
    }
    Tensor qg = q.detach().requires_grad_(), kg = k.detach().requires_grad_(), vg = v.detach().requires_grad_();
    scaled_dot_product_attention(qg, kg, vg, {}, 0.0, true, {}, c.group > 1).backward(dout);
  };
  const double work = double(Hq) * double(c.Lq) * double(c.Lkv) * double(c.D);
  const int reps = work > 2e9 ? 2 : work > 2e8 ? 4 : 10;
  const SDPAChoice choice = sdpa_choose(q, k, {}, 0.0);
  r.ours_only(sdpa_name(c), time_it(run, 1, reps, 0.2), choice.backend == SDPABackend::flash ? "flash" : "math");
}

void sdpa_rows(const Options& o, Report& r) {
  const std::vector<int64_t> dims = o.quick ? std::vector<int64_t>{16, 40, 80, 128} : std::vector<int64_t>{16, 40, 64, 80, 96, 112, 128, 256};
  const std::vector<int64_t> lengths = o.quick ? std::vector<int64_t>{1, 37, 512} : std::vector<int64_t>{1, 37, 512, 2048};
  for (DType dt : {DType::f32, DType::bf16})
    for (int64_t group : {1, 4})
      for (int64_t D : dims)
        for (int64_t L : lengths)
          for (bool backward : {false, true}) {
            if (L == 1 && backward) continue;  // a decode step has no backward
            if (o.quick && (dt == DType::bf16 || backward) && L > 37) continue;
            sdpa_row({D, L, L == 1 ? 4096 : L, group, dt, backward}, r);
          }
}

void linear_rows(const Options& o, Report& r) {
  NoGradGuard g;
  std::vector<std::pair<int64_t, int64_t>> kn = {{96, 288}, {768, 3072}, {1000, 1000}, {5120, 13824}};
  if (o.quick) kn.pop_back();
  for (DType dt : {DType::f32, DType::bf16})
    for (auto [K, N] : kn) {
      const Tensor w = prune_2_4(randn({N, K}) * 0.02).to(dt);
      const SemiStructuredSparse s = to_sparse_semi_structured(w);
      for (int64_t M : {1, 3, 17, 64, 333}) {
        const Tensor x = randn({M, K}).to(dt);
        const std::string shape = std::string(dtype_name(dt)) + " M=" + std::to_string(M) + " K=" + std::to_string(K) + " N=" + std::to_string(N);
        const double flop = 2.0 * double(M) * double(K) * double(N);
        const int reps = flop > 2e9 ? 4 : 15;
        // Against PyTorch the dense linear alone, its calls back to back as the peer's are (a weight
        // that fits the caches stays there); against 2:4 the two alternating, each call finding the
        // caches as the other left them.
        r.ours_only("linear " + shape, time_it([&] { (void)linear(x, w); }, 2, reps, 0.2));
        const auto [sparse, dense] = time_pair([&] { (void)linear(x, s); }, [&] { (void)linear(x, w); }, 2, reps, 0.2);
        r.add("2:4 linear " + shape, sparse, "dense linear, Sinter", dense, sparse_kernel_for(s, dt, M));
      }
    }
}

void row_op_rows(Report& r) {
  NoGradGuard g;
  for (auto [rows, width] : std::vector<std::pair<int64_t, int64_t>>{{37, 96}, {4096, 1000}, {16, 50257}}) {
    const Tensor x = randn({rows, width}), w = randn({width}), b = randn({width});
    const Tensor target = randint(0, width, {rows});
    const std::string shape = " f32 " + std::to_string(rows) + "x" + std::to_string(width);
    r.ours_only("layer_norm" + shape, time_it([&] { (void)layer_norm(x, w, b); }));
    r.ours_only("rms_norm" + shape, time_it([&] { (void)rms_norm(x, w); }));
    r.ours_only("softmax" + shape, time_it([&] { (void)softmax(x, -1); }));
    r.ours_only("gelu" + shape, time_it([&] { (void)gelu(x); }));
    r.ours_only("cross_entropy" + shape, time_it([&] { (void)cross_entropy(x, target); }));
  }
}

// Reductions over each kind of dim, argmax over a vocabulary, cumsum, a transposing copy, softmax
// over the leading dim, bf16 elementwise ops, indexing, topk, tril, log, sin, cos, and an
// embedding's and a layer_norm's forward + backward (the embedding's gradient a whole vocabulary's rows).
void tensor_op_rows(Report& r) {
  const Tensor x = randn({2048, 768}), x3 = randn({8, 256, 768}), logits = randn({1, 50257}), sq = randn({4096, 4096});
  const Tensor logits4 = randn({4, 50257}), sq2 = randn({2048, 2048});
  {
    NoGradGuard g;
    r.ours_only("sum f32 2048x768 dim 1", time_it([&] { (void)sum(x, {1}); }));
    r.ours_only("sum f32 2048x768 dim 0", time_it([&] { (void)sum(x, {0}); }));
    r.ours_only("sum f32 8x256x768 dim 1", time_it([&] { (void)sum(x3, {1}); }));
    r.ours_only("sum f32 2048x768 all", time_it([&] { (void)sum(x); }));
    r.ours_only("max f32 2048x768 all", time_it([&] { (void)max(x); }));
    r.ours_only("argmax f32 1x50257", time_it([&] { (void)argmax(logits, -1); }));
    r.ours_only("cumsum f32 2048x768 dim 1", time_it([&] { (void)cumsum(x, 1); }));
    r.ours_only("transpose copy f32 4096x4096", time_it([&] { (void)sq.t().contiguous(); }, 1, 6, 0.2));
    r.ours_only("softmax f32 2048x768 dim 0", time_it([&] { (void)softmax(x, 0); }));
    r.ours_only("pow 2 f32 2048x768", time_it([&] { (void)pow(x, 2.0); }));
    r.ours_only("clamp f32 2048x768", time_it([&] { (void)clamp(x, -0.5, 0.5); }));
    const Tensor xb = x.to(DType::bf16), wb = randn({768}).to(DType::bf16);
    r.ours_only("silu bf16 2048x768", time_it([&] { (void)silu(xb); }));
    r.ours_only("mul bf16 2048x768 by a row", time_it([&] { (void)mul(xb, wb); }));
    r.ours_only("softmax bf16 2048x768", time_it([&] { (void)softmax(xb, -1); }));
    r.ours_only("sum bf16 2048x768 dim 1", time_it([&] { (void)sum(xb, {1}); }));
    const Tensor rows = randint(0, 2048, {4096}), cols = randint(0, 768, {2048, 64}), src = randn({2048, 64});
    r.ours_only("index_select f32 2048x768 4096 rows", time_it([&] { (void)index_select(x, 0, rows); }));
    r.ours_only("gather f32 2048x768 dim 1 64 a row", time_it([&] { (void)gather(x, 1, cols); }));
    r.ours_only("scatter_add f32 2048x768 dim 1 64 a row", time_it([&] { (void)scatter_add(x, 1, cols, src); }));
    r.ours_only("topk 50 f32 4x50257", time_it([&] { (void)topk(logits4, 50); }));
    r.ours_only("tril f32 2048x2048", time_it([&] { (void)tril(sq2); }));
    const Tensor xp = rand({2048, 768}) + 0.5;
    r.ours_only("log f32 2048x768", time_it([&] { (void)log(xp); }));
    r.ours_only("sin f32 2048x768", time_it([&] { (void)sin(x); }));
    r.ours_only("cos f32 2048x768", time_it([&] { (void)cos(x); }));
    r.ours_only("logsumexp f32 2048x768 dim 1", time_it([&] { (void)logsumexp(x, {1}); }));
    r.ours_only("randn f32 1M", time_it([&] { (void)randn({1024, 1024}); }));
    r.ours_only("randint i64 1M", time_it([&] { (void)randint(0, 1000, {1024, 1024}); }));
    r.ours_only("arange i64 1M", time_it([&] { (void)arange(int64_t(1 << 20)); }));
  }
  const Tensor w = randn({50257, 768}).requires_grad_(), idx = randint(0, 50257, {8, 256}), dy = randn({8, 256, 768});
  r.ours_only("embedding fwd+bwd f32 50257x768 8x256", time_it([&] { embedding(w, idx).backward(dy); }, 1, 6, 0.2));
  const Tensor xg = x.detach().requires_grad_(), lw = randn({768}).requires_grad_(), lb = randn({768}).requires_grad_();
  r.ours_only("layer_norm fwd+bwd f32 2048x768", time_it([&] { layer_norm(xg, lw, lb).backward(x); }));
}

struct BlockCase {
  bool llama;
  int64_t d, heads, kv_heads, T, B;
};

nn::ModelConfig block_config(const BlockCase& c) {
  nn::ModelConfig m;
  m.model_type = c.llama ? "llama" : "gpt2";
  m.hidden_size = c.d;
  m.num_attention_heads = c.heads;
  m.num_key_value_heads = c.llama ? c.kv_heads : c.heads;
  m.intermediate_size = c.llama ? (c.d * 8 / 3 + 31) / 32 * 32 : 4 * c.d;
  m.max_position_embeddings = c.T;
  return m;
}

// One block compiled, forward without grad and forward + backward (the loss sum(y * dy)), against
// torch.compile of the same block (bench/torch_peer.py).
void block_rows(const BlockCase& c, Report& r) {
  manual_seed(3);
  const nn::ModelConfig m = block_config(c);
  nn::TransformerBlock block(m);
  {
    NoGradGuard g;
    for (auto& [name, p] : block.named_parameters()) p->copy_(randn(p->shape()) * 0.05);
  }
  Tensor cos, sin;
  if (c.llama) cos = rope_cos_sin(c.T, m.head_dim(), m.rope_theta, false), sin = rope_cos_sin(c.T, m.head_dim(), m.rope_theta, true);
  const Tensor x = randn({c.B, c.T, c.d}), dy = randn({c.B, c.T, c.d});
  const std::string base = std::string("compiled ") + (c.llama ? "llama" : "gpt2") + " block d=" + std::to_string(c.d) + " T=" +
                           std::to_string(c.T) + " B=" + std::to_string(c.B);
  {
    NoGradGuard g;
    CompiledFunction f = compile([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{block.forward(in[0], cos, sin, nullptr)}; },
                                 {.name = "sweep_block"});
    (void)f({x});
    const auto [tc, te] = time_pair([&] { (void)f({x}); }, [&] { (void)block.forward(x, cos, sin, nullptr); }, 1, 8, 0.2);
    r.add(base + " fwd", tc, "eager Sinter", te);
  }
  CompiledFunction f = compile([&](const std::vector<Tensor>& in) {
    Tensor loss = sum(block.forward(in[0], cos, sin, nullptr) * in[1]);
    loss.backward();
    return std::vector<Tensor>{loss};
  }, {.name = "sweep_block_train"});
  (void)f({x, dy});
  const auto [tc, te] = time_pair([&] { (void)f({x, dy}); }, [&] { sum(block.forward(x, cos, sin, nullptr) * dy).backward(); }, 1, 6, 0.2);
  r.add(base + " fwd+bwd", tc, "eager Sinter", te);
}

}  // namespace

void suite_sweep(const Options& o, Report& r) {
  manual_seed(0);
  std::vector<BlockCase> blocks;
  for (bool llama : {true, false}) {
    blocks.push_back({llama, 96, 6, 2, 37, 3});
    if (!o.quick) blocks.push_back({llama, 512, 8, 2, 128, 4}), blocks.push_back({llama, 1024, 16, 4, 512, 1});
  }
  r.expect(o.quick ? 164 : 360);  // attention 56 or 224, linear and 2:4 60 or 80, row ops 15, tensor ops 29, blocks 4 or 12
  sdpa_rows(o, r);
  linear_rows(o, r);
  row_op_rows(r);
  tensor_op_rows(r);
  for (const BlockCase& c : blocks) block_rows(c, r);
}

}  // namespace sinter::bench

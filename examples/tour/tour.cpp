// A tour of Sinter's C++ API in one program: tensors and autograd, safetensors, a LLaMA-style model
// trained a step and saved for Hugging Face, attention, 2:4 sparse weights, the compiler, 2-D
// parallel training (alone, or under `mpirun -np 4`), the op profile and errors. Built with the
// project and run by its tests (ctest: example_tour), which check what each part printed.
#include <cmath>
#include <cstdio>
#include <filesystem>

#include <sinter/sinter.h>
using namespace sinter;

namespace {
int failures = 0;
void check(bool ok, const char* what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what);
  failures += !ok;
}
// |a - b| <= 1e-5 (1 + |b|) everywhere.
bool close(const Tensor& a, const Tensor& b) {
  const Tensor x = a.detach().to(DType::f64), r = b.detach().to(DType::f64);
  return max(abs(x - r) - abs(r) * 1e-5).item<double>() <= 1e-5;
}
}  // namespace

int main() {
  const auto dir = std::filesystem::temp_directory_path() / "sinter_tour";
  std::filesystem::create_directories(dir);
  std::filesystem::current_path(dir);

  manual_seed(0);                                   // Philox: same values on any thread count
  Tensor x = randn({4, 8});                         // f32 by default
  Tensor w = (randn({16, 8}) * 0.1).requires_grad_();
  Tensor b = zeros({16}).requires_grad_();
  Tensor y = gelu(linear(x, w, b));                 // y(4, 16) = gelu(x w^T + b)
  Tensor loss = mean(y * y);
  loss.backward();                                  // w.grad(), b.grad()
  {
    NoGradGuard g;                                  // in-place updates outside the graph
    w.add_(w.grad(), -0.1);
  }

  Tensor t = arange(0, 24, 1, DType::f32).reshape({2, 3, 4});
  Tensor v = t.transpose(0, 2).slice(0, 1, 4, 2);   // views share storage, no copy
  Tensor m = matmul(t, t.transpose(-1, -2));        // NumPy semantics: batched, broadcast
  auto [vals, idx] = topk(t, 2, -1);
  Tensor h = t.to(DType::bf16);                     // round-to-nearest-even

  Tensor loss2 = mean(gelu(linear(x, w, b)));
  auto g = autograd::grad({loss2}, {w});

  Tensor s = matmul(Tensor::symbolic({32, 128}), Tensor::symbolic({128, 10}));  // shape (32, 10)

  io::save_safetensors("model.safetensors", {{"w", w}, {"b", b}}, {{"format", "pt"}});
  auto st = io::load_safetensors("model.safetensors");  // st.tensors.at("w")

  nn::GPT gpt(nn::ModelConfig::preset("llama-tiny"));          // RMSNorm, RoPE, SwiGLU, GQA
  optim::AdamW opt(gpt.named_parameters(), 3e-3, 0.9, 0.95, 1e-8, 0.1);
  gpt.checkpoint_activations = true;                           // blocks recomputed in the backward
  Tensor ids = data::encode("hello world, hello sinter");
  Tensor inp = ids.narrow(0, 0, 24).reshape({1, 24}), tgt = ids.narrow(0, 1, 24).reshape({1, 24});
  Tensor lm_loss = cross_entropy(gpt.forward(inp).reshape({-1, 256}), tgt.reshape({-1}));
  opt.zero_grad();
  lm_loss.backward();
  opt.step();
  gpt.save_pretrained("llama-hf");                                 // a folder transformers loads
  auto hf = nn::GPT::from_pretrained("llama-hf");                  // any save_pretrained GPT-2 / LLaMA folder

  Tensor q = randn({1, 8, 64, 32}), kv = randn({1, 2, 64, 32});      // 8 query heads share 2 KV heads
  Tensor att = scaled_dot_product_attention(q, kv, kv, {}, 0.0, /*is_causal=*/true, {}, /*enable_gqa=*/true);
  SDPAChoice why = sdpa_choose(q, kv, {}, 0.0);                    // why.backend, why.reason

  SemiStructuredSparse sw = to_sparse_semi_structured(prune_2_4(randn({16, 8})));
  Tensor ys = linear(x, sw, b, "gelu");                            // == gelu(linear(x, sw.to_dense(), b))
  sw.prepack();                                                    // + the kernels' layout (same bytes again):
  Tensor yp = linear(x, sw);                                       // the kernel reads it where it is faster
  SemiStructuredSparse so = to_sparse_semi_structured(prune_2_4(randn({16, 8})), DType::i8);
  so.prepack(/*replace=*/true);                                    // that layout as the only copy: serving
  Tensor yo = linear(x, so);                                       // (no gradient; so.unpack() gives values back)
  nn::Linear sl(8, 16);
  sl.sparsify(DType::i8);                                          // a 2:4 layer, int8 values; one this small
  Tensor yl = sl.forward(x);                                       // (<= 256 KiB dense) computes densely

  // Compiling: trace once through the op table, fuse, generate C++, compile (g++), cache on disk
  CompiledFunction cf = compile([](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{gelu(in[0] * 1.5 + in[1], true) * sigmoid(in[0]) + in[0] * 0.5};
  });
  Tensor yc = cf({x, randn({8})})[0];                              // one fused kernel, bit for bit eager's
  std::string report = cf.explain({x, randn({8})}).text;           // graphs, breaks, kernels, guards, bytes
  CompiledFunction cfwd = compile_forward(gpt);                    // a model's forward, with a compiled backward:
  Tensor closs = cross_entropy(cfwd({inp})[0].reshape({-1, 256}), tgt.reshape({-1}));
  closs.backward();                                                // gradients reach gpt's parameters

  // 2-D parallel: the same code alone (a 1 x 1 mesh) or under `mpirun -np 4` (dp = 2 x tp = 2)
  const int64_t tp = dist::world_size() % 2 == 0 ? 2 : 1;
  dist::DeviceMesh mesh({{"dp", dist::world_size() / tp}, {"tp", tp}});
  nn::GPT pm(nn::ModelConfig::preset("tiny"));
  pm.init_weights(1337);                                          // the same full model on every rank
  dist::parallelize_gpt(pm, mesh["tp"]);                          // Megatron TP, vocabulary-parallel loss
  dist::fully_shard_gpt(pm, mesh["dp"]);                          // FSDP: one unit per block, then the root
  optim::AdamW popt(pm.named_parameters(), 4e-3);                 // steps (and keeps state for) the shards
  Tensor ploss = pm.parallel_loss(pm.forward(inp), tgt);          // logits never gathered
  ploss.backward();                                               // gradients reduce-scattered into the shards
  dist::clip_grad_norm(pm.parameters(), 1.0);                     // global norm, each element counted once
  popt.step();
  dist::DTensor wq = *dist::parameter_layout(pm.blocks[0]->attn->q_proj->weight);  // placements, global shape
  Tensor whole = wq.full_tensor();                                // (128, 128) on every rank

  // Where the time goes: kernel time per op, backward formulas broken down ("mul < gelu_tanh")
  set_op_profiling(true);
  Tensor sm = softmax(linear(x, w, b), -1);
  set_op_profiling(false);
  std::string profile = op_profile_table();

  // Errors name the op (or file) and show the shapes
  // matmul(randn({2, 3}), randn({4, 5}))
  //   -> sinter::ShapeError: [matmul] inner dimensions differ: a(2, 3) b(4, 5)

  // What each part gave.
  check(y.shape() == Shape({4, 16}) && g[0].shape() == w.shape(), "autograd: y (4, 16), dloss2/dw shaped like w");
  check(v.shape() == Shape({2, 3, 2}) && v.storage() == t.storage(), "a view shares its tensor's storage");
  check(m.shape() == Shape({2, 3, 3}) && vals.to_vector<float>()[0] == 3.0f && idx.to_vector<int64_t>()[0] == 3, "matmul, topk");
  check(h.dtype() == DType::bf16 && s.shape() == Shape({32, 10}), "bf16 cast, symbolic shape inference");
  check(close(st.tensors.at("w"), w), "safetensors round trip");
  check(opt.steps() == 1 && gpt.tok_emb->weight.grad().defined() && std::fabs(lm_loss.item<double>() - std::log(256.0)) < 0.5,
        "a LLaMA step: loss near log(256), gradients, one AdamW step");
  check(hf->config().llama(), "the Hugging Face folder loads back as LLaMA");
  check(att.shape() == Shape({1, 8, 64, 32}) && why.backend == SDPABackend::flash, "GQA attention, flash chosen");
  check(close(ys, gelu(linear(x, sw.to_dense(), b))) && sw.packed_current() && close(yp, linear(x, sw.to_dense())),
        "2:4 linear equals the dense one, prepacked too");
  check(so.packed_only() && close(yo, linear(x, so.to_dense())), "a weight held only prepacked");
  check(close(yl, linear(x, sl.sparse.to_dense(), sl.bias)), "a 2:4 nn::Linear");
  check(yc.shape() == Shape({4, 8}) && report.find("1 fused kernels") != std::string::npos, "one fused kernel");
  check(std::isfinite(closs.item<double>()), "a compiled forward with its backward");
  check(popt.steps() == 1 && std::fabs(ploss.item<double>() - std::log(256.0)) < 0.5 && whole.shape() == Shape({128, 128}),
        "2-D parallel step");
  check(profile.find("softmax") != std::string::npos, "the op profile lists softmax");
  try {
    matmul(randn({2, 3}), randn({4, 5}));
    check(false, "a shape error");
  } catch (const ShapeError& e) {
    check(std::string(e.what()) == "[matmul] inner dimensions differ: a(2, 3) b(4, 5)", "the error names the op and the shapes");
  }
  std::printf("tour: %d check(s) failed\n", failures);
  return failures == 0 ? 0 : 1;
}

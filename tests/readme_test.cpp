// The README's C++ example, compiled and run as written, so the front page cannot rot.
#include <cmath>
#include <filesystem>
#include <fstream>

#include "test_util.h"

using namespace sinter;

TEST(Readme, ExampleRunsAsWritten) {
  const auto dir = std::filesystem::temp_directory_path() / "sinter_readme_test";
  std::filesystem::create_directories(dir);
  std::filesystem::current_path(dir);

  // README:begin
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
  // README:end

  EXPECT_NE(profile.find("softmax"), std::string::npos) << profile;
  EXPECT_EQ(whole.shape(), Shape({128, 128}));
  EXPECT_EQ(popt.steps(), 1);
  EXPECT_NEAR(ploss.item<float>(), std::log(256.0), 0.5);
  EXPECT_EQ(att.shape(), Shape({1, 8, 64, 32}));
  EXPECT_EQ(why.backend, SDPABackend::flash);
  EXPECT_TRUE(test::all_close(ys, gelu(linear(x, sw.to_dense(), b)), 1e-5, 1e-5));
  EXPECT_TRUE(sw.packed_current());
  EXPECT_TRUE(test::all_close(yp, linear(x, sw.to_dense()), 1e-5, 1e-5));
  EXPECT_TRUE(so.packed_only());
  EXPECT_TRUE(test::all_close(yo, linear(x, so.to_dense()), 1e-5, 1e-5));
  EXPECT_TRUE(test::all_close(yl, linear(x, sl.sparse.to_dense(), sl.bias), 1e-5, 1e-5));
  EXPECT_EQ(yc.shape(), Shape({4, 8}));
  EXPECT_NE(report.find("1 fused kernels"), std::string::npos) << report;
  EXPECT_EQ(opt.steps(), 1);
  EXPECT_TRUE(hf->config().llama());
  EXPECT_TRUE(std::isfinite(closs.item<double>()));
  EXPECT_TRUE(gpt.tok_emb->weight.grad().defined());
  EXPECT_NEAR(lm_loss.item<float>(), std::log(256.0), 0.5);
  EXPECT_EQ(y.shape(), Shape({4, 16}));
  EXPECT_EQ(v.shape(), Shape({2, 3, 2}));
  EXPECT_EQ(v.storage(), t.storage());
  EXPECT_EQ(m.shape(), Shape({2, 3, 3}));
  EXPECT_EQ(vals.to_vector<float>()[0], 3.0f);
  EXPECT_EQ(idx.to_vector<int64_t>()[0], 3);
  EXPECT_EQ(h.dtype(), DType::bf16);
  EXPECT_EQ(g[0].shape(), w.shape());
  EXPECT_EQ(s.shape(), Shape({32, 10}));
  EXPECT_TRUE(test::all_close(st.tensors.at("w"), w.detach()));
  try {
    matmul(randn({2, 3}), randn({4, 5}));
    ADD_FAILURE() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_STREQ(e.what(), "[matmul] inner dimensions differ: a(2, 3) b(4, 5)");
  }
}

// The README shows the block above line for line (so what this test runs is what a reader copies).
TEST(Readme, ShowsTheExampleThisTestRuns) {
  auto lines = [](const std::string& path) {
    std::ifstream f(path);
    EXPECT_TRUE(f.good()) << path;
    std::vector<std::string> out;
    for (std::string l; std::getline(f, l);) out.push_back(l);
    return out;
  };
  auto trim = [](std::string l) {
    l.erase(0, std::min(l.find_first_not_of(' '), l.size()));
    return l;
  };
  std::vector<std::string> ours;
  bool in = false;
  for (const std::string& l : lines(__FILE__)) {
    if (trim(l) == "// README:end") break;
    if (in) ours.push_back(trim(l));
    if (trim(l) == "// README:begin") in = true;
  }
  std::vector<std::string> readme;
  in = false;
  for (const std::string& l : lines(std::string(SINTER_SOURCE_DIR) + "/README.md")) {
    if (in && l == "```") break;
    if (in) readme.push_back(trim(l));
    if (l == "```cpp") in = true;
  }
  const std::vector<std::string> head{"#include <sinter/sinter.h>", "using namespace sinter;", ""};
  ASSERT_GE(readme.size(), head.size());
  EXPECT_EQ(std::vector<std::string>(readme.begin(), readme.begin() + 3), head);
  EXPECT_EQ(std::vector<std::string>(readme.begin() + 3, readme.end()), ours);
}

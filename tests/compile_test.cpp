// sinter::compile against eager: elementwise chains bit for bit (the same functors run), fusion
// counts from explain(), a GPT forward and a whole training step, guards, graph breaks, a
// failing compiler and a corrupt cache entry.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <sinter/compile.h>
#include <sinter/train.h>

#include "test_util.h"

using namespace sinter;
namespace fs = std::filesystem;

namespace {

using test::bitwise_equal;

using test::ScopedEnv;  // each test compiles into a cache folder of its own

std::string fresh_cache(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("sinter_compile_test_" + name);
  fs::remove_all(d);
  return d.string();
}

// The text the training tests batch from, and a model of a preset initialized from a seed.
data::ByteDataset toy_data() {
  return data::ByteDataset::from_text(std::string(3000, 'x') + "a quick brown fox jumps over the lazy dog", "t");
}
std::unique_ptr<nn::GPT> seeded_model(const char* preset, uint64_t seed) {
  auto m = std::make_unique<nn::GPT>(nn::ModelConfig::preset(preset));
  m->init_weights(seed);
  return m;
}

std::vector<Tensor> chain(const std::vector<Tensor>& in) {
  const Tensor &x = in[0], &a = in[1], &b = in[2];
  return {gelu(x * a + b) * sigmoid(x) + x * 0.5};
}

}  // namespace

TEST(Compile, AnElementwiseChainIsOneKernelAndEqualsEagerBitForBit) {
  ScopedEnv cache("SINTER_CACHE_DIR", fresh_cache("chain"));
  manual_seed(1);
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = randn({64, 300}).to(dt), a = randn({300}).to(dt), b = randn({64, 1}).to(dt);
    CompiledFunction f = compile(chain, {.name = "chain"});
    const Tensor y = f({x, a, b})[0], ref = chain({x, a, b})[0];
    EXPECT_TRUE(bitwise_equal(y, ref));
    const Explanation e = f.explain({x, a, b});
    EXPECT_EQ(e.fused_kernels, 1) << e.text;
    EXPECT_EQ(e.library_calls, 0) << e.text;
    EXPECT_EQ(f.compiles(), 1);
    // Non-contiguous inputs: another guard set, the same values.
    Tensor xt = randn({300, 64}).to(dt).t();
    EXPECT_TRUE(bitwise_equal(f({xt, a, b})[0], chain({xt, a, b})[0]));
    EXPECT_EQ(f.compiles(), 2);
  }
}

TEST(Compile, ANormWithItsElementwiseNeighboursIsOneKernel) {
  ScopedEnv cache("SINTER_CACHE_DIR", fresh_cache("norm"));
  manual_seed(7);
  for (bool rms : {false, true}) {
    SCOPED_TRACE(rms ? "rms_norm" : "layer_norm");
    Tensor x = randn({2, 37, 96}), r = randn({2, 37, 96}), w = randn({96}), b = randn({96});
    auto fn = [&](const std::vector<Tensor>& in) {
      Tensor h = in[0] + in[1];
      return std::vector<Tensor>{gelu(rms ? rms_norm(h, w) : layer_norm(h, w, b), true), h};
    };
    CompiledFunction f = compile(fn, {.name = rms ? "rms" : "ln"});
    const auto y = f({x, r}), ref = fn({x, r});
    EXPECT_TRUE(test::all_close(y[0], ref[0], 1e-6, 1e-6));
    EXPECT_TRUE(bitwise_equal(y[1], ref[1]));  // the prologue's value, stored on the way
    const Explanation e = f.explain({x, r});
    EXPECT_EQ(e.fused_kernels, 1) << e.text;
    EXPECT_EQ(e.library_calls, 0) << e.text;
  }
}

TEST(Compile, EveryElementwiseOpCompiledAloneEqualsEager) {
  ScopedEnv cache("SINTER_CACHE_DIR", fresh_cache("ops"));
  manual_seed(2);
  Tensor x = randn({33, 17}), y = add(rand({17}), 0.5), xi = randint(-5, 6, {33, 17}, DType::i32);
  for (const OpDef* op : all_ops()) {
    if (!op->fusable) continue;
    SCOPED_TRACE(op->name);
    std::vector<Tensor> in;
    Attrs attrs;
    if (op->name == "where") in = {gt(x, zeros({})), x, y};
    else if (op->name == "masked_fill") in = {x, gt(y, ones({}))}, attrs = {{"value", -2.5}};
    else if (op->name == "cast") in = {x}, attrs = {{"dtype", DType::bf16}};
    else if (op->name == "clamp") in = {x}, attrs = {{"min", -0.5}, {"max", 0.7}};
    else if (op->num_inputs == 1) in = {op->name == "log" || op->name == "sqrt" || op->name == "rsqrt" ? add(x * x, 0.1) : x};
    else in = {x, op->name == "pow" ? y : (op->name == "div" ? y : x.t().t() * 0.5 + y)};
    CompiledFunction f = compile([op, attrs](const std::vector<Tensor>& t) { return call(*op, t, attrs); }, {.name = op->name});
    EXPECT_TRUE(bitwise_equal(f(in)[0], call(*op, in, attrs)[0]));
    if (op->num_inputs == 2 && op->name != "pow" && op->name != "masked_fill") {  // integers (and int -> f32 true division)
      std::vector<Tensor> ii{xi, xi * 2 + 1};
      if (op->name.find("backward") == std::string::npos) {
        EXPECT_TRUE(bitwise_equal(f(ii)[0], call(*op, ii, attrs)[0]));
      }
    }
  }
}

TEST(Compile, AGptForwardMatchesEager) {
  ScopedEnv cache("SINTER_CACHE_DIR", fresh_cache("gpt"));
  manual_seed(3);
  for (const char* preset : {"tiny", "llama-tiny"}) {
    SCOPED_TRACE(preset);
    nn::GPT model(nn::ModelConfig::preset(preset));
    model.init_weights(3);
    model.eval();
    NoGradGuard no_grad;
    CompiledFunction f = compile_forward(model, {.name = std::string("gpt_") + preset});
    Tensor idx = randint(0, 256, {2, 40});
    EXPECT_TRUE(test::all_close(f({idx})[0], model.forward(idx), 1e-5, 1e-5));
    // Parameters are read by reference: a change to them is seen without tracing again.
    model.norm_f->named_parameters()[0].second->mul_(0.5);
    EXPECT_TRUE(test::all_close(f({idx})[0], model.forward(idx), 1e-5, 1e-5));
    EXPECT_EQ(f.compiles(), 1);
    const Explanation e = f.explain({idx});
    EXPECT_GT(e.fused_kernels, 0) << e.text;
    EXPECT_LT(e.planned_bytes, e.unplanned_bytes) << e.text;
  }
}

TEST(Compile, ALinearWithBiasAndGeluIsOneGemmAndNoExtraPass) {
  ScopedEnv cache("SINTER_CACHE_DIR", fresh_cache("epilogue"));
  manual_seed(11);
  Tensor x = randn({64, 96}), w1 = randn({256, 96}) * 0.1, b1 = randn({256}), w2 = randn({96, 256}) * 0.1, b2 = randn({96});
  auto one = [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{gelu(linear(in[0], w1, b1), true)}; };
  CompiledFunction f = compile(one, {.name = "linear_gelu"});
  EXPECT_TRUE(test::all_close(f({x})[0], one({x})[0], 1e-5, 1e-5));
  Explanation e = f.explain({x});
  EXPECT_EQ(e.fused_kernels, 0) << e.text;
  ASSERT_EQ(e.library, std::vector<std::string>{"linear_fused: bias + gelu_tanh"}) << e.text;
  // A GPT MLP with its residual: two GEMMs, the activation and the add on their output tiles.
  auto mlp = [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] + linear(gelu(linear(in[0], w1, b1), true), w2, b2)}; };
  CompiledFunction g = compile(mlp, {.name = "mlp"});
  EXPECT_TRUE(test::all_close(g({x})[0], mlp({x})[0], 1e-5, 1e-5));
  e = g.explain({x});
  EXPECT_EQ(e.fused_kernels, 0) << e.text;
  EXPECT_EQ(e.library, (std::vector<std::string>{"linear_fused: bias + gelu_tanh", "linear_fused: bias + residual"})) << e.text;
  // A value the function returns is not absorbed: the activation's input stays materialised.
  auto both = [&](const std::vector<Tensor>& in) {
    Tensor y = linear(in[0], w1, b1);
    return std::vector<Tensor>{y, gelu(y, true)};
  };
  CompiledFunction h = compile(both, {.name = "linear_returned"});
  const auto got = h({x}), want = both({x});
  EXPECT_TRUE(bitwise_equal(got[0], want[0]));
  EXPECT_TRUE(bitwise_equal(got[1], want[1]));
  EXPECT_EQ(h.explain({x}).library, std::vector<std::string>{"linear"});
}

TEST(Compile, TheOpProfileListsACompiledProgramsLibraryCallsAndFusedKernels) {
  ScopedEnv cache("SINTER_CACHE_DIR", fresh_cache("profile"));
  Tensor x = randn({64, 96}), w = randn({256, 96}) * 0.1, b = randn({256});
  auto fn = [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{sigmoid(linear(in[0], w, b) * 2.0 + 1.0)}; };
  CompiledFunction f = compile(fn, {.name = "profiled"});
  (void)f({x});
  reset_op_profile();
  set_op_profiling(true);
  for (int i = 0; i < 3; ++i) (void)f({x});
  set_op_profiling(false);
  const std::string table = op_profile_table();
  reset_op_profile();
  // One line per library op of the program (with its three calls), one for the rest of its time.
  EXPECT_NE(table.find("linear < compiled profiled"), std::string::npos) << table;
  EXPECT_NE(table.find("fused kernels < compiled profiled"), std::string::npos) << table;
  EXPECT_EQ(f.explain({x}).library, std::vector<std::string>{"linear"}) << f.explain({x}).text;
  EXPECT_EQ(table.find("sigmoid"), std::string::npos) << "a fused op has no line of its own:\n" << table;
  std::istringstream rows(table);
  for (std::string line; std::getline(rows, line);)
    if (line.starts_with("linear < compiled profiled")) {
      EXPECT_NE(line.find(" 3 "), std::string::npos) << line;
    }
}

TEST(Compile, TwoFourSparseLinearsAreNodesWithTheirActivationFused) {
  ScopedEnv cache("SINTER_CACHE_DIR", fresh_cache("sparse24"));
  manual_seed(13);
  Tensor x = randn({8, 64}), b1 = randn({128});
  SemiStructuredSparse w1 = to_sparse_semi_structured(prune_2_4(randn({128, 64}) * 0.1));
  SemiStructuredSparse w2 = to_sparse_semi_structured(prune_2_4(randn({96, 64}) * 0.1), DType::i8);
  SemiStructuredSparse w3 = to_sparse_semi_structured(prune_2_4(randn({64, 96}) * 0.1));
  w3.prepack();  // read through the prepacked copy, a graph input like the others
  auto fn = [&](const std::vector<Tensor>& in) {
    NoGradGuard no_grad;
    const Tensor h = silu(linear(in[0], w1, b1));                   // bias + silu on the output tiles
    const Tensor g = linear(relu(linear(in[0], w2, Tensor())), w3, Tensor());  // int8 values + relu; then prepacked
    return std::vector<Tensor>{h, gelu(g)};
  };
  CompiledFunction f = compile(fn, {.fullgraph = true, .name = "sparse24"});
  const auto got = f({x}), want = fn({x});
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(test::all_close(got[i], want[i], 1e-5, 1e-6)) << "result " << i;
  const Explanation e = f.explain({x});
  EXPECT_EQ(e.fused_kernels, 0) << e.text;
  EXPECT_EQ(e.library, (std::vector<std::string>{"sparse24_linear: bias + silu", "sparse24_linear: relu", "sparse24_linear: gelu"}))
      << e.text;
  // A 2:4 model compiled, forward and gradients: the sparse linears' backward (the weight
  // expanded to dense, the kept entries of the weight gradient gathered) traces like any op.
  auto eager = seeded_model("tiny", 7), compiled = seeded_model("tiny", 7);
  eager->sparsify(), compiled->sparsify();
  Tensor idx = randint(0, 256, {2, 24});
  auto loss_grads = [](nn::GPT& m) {
    return [&m](const std::vector<Tensor>& in) {
      Tensor loss = cross_entropy(m.forward(in[0]).reshape({-1, 256}), in[0].reshape({-1}));
      std::vector<Tensor> params;
      for (auto& [name, p] : m.named_parameters()) params.push_back(*p);
      std::vector<Tensor> out{loss.detach()};
      for (const Tensor& g : autograd::grad({loss}, params)) out.push_back(g);
      return out;
    };
  };
  CompiledFunction fg = compile(loss_grads(*compiled), {.name = "sparse24_grads"});
  const auto cg = fg({idx}), eg = loss_grads(*eager)({idx});
  ASSERT_EQ(cg.size(), eg.size());
  for (size_t i = 0; i < cg.size(); ++i) EXPECT_TRUE(test::all_close(cg[i], eg[i], 1e-5, 1e-5)) << "result " << i;
}

TEST(Compile, OneGptBlockForwardAndBackwardKernelCounts) {
  // The counts the README reports for one block of the default model (GPT-2 style, tiny).
  ScopedEnv cache("SINTER_CACHE_DIR", fresh_cache("block"));
  manual_seed(12);
  nn::GPT model(nn::ModelConfig::preset("tiny"));
  model.init_weights(4);
  nn::TransformerBlock& block = *model.blocks[0];
  Tensor x = randn({4, 32, model.config().hidden_size}), wout = randn(x.shape());
  auto fwd = [&](const std::vector<Tensor>& in) {
    NoGradGuard no_grad;
    return std::vector<Tensor>{block.forward(in[0], {}, {}, nullptr)};
  };
  std::vector<Tensor> params;
  for (auto& [name, p] : block.named_parameters()) params.push_back(*p);
  auto fwd_bwd = [&](const std::vector<Tensor>& in) {
    Tensor xl = in[0].detach().requires_grad_();
    Tensor y = block.forward(xl, {}, {}, nullptr);
    std::vector<Tensor> wrt{xl};
    wrt.insert(wrt.end(), params.begin(), params.end());
    std::vector<Tensor> out{y.detach()};
    for (const Tensor& gr : autograd::grad({sum(y * wout)}, wrt)) out.push_back(gr);
    return out;
  };
  CompiledFunction f = compile(fwd, {.fullgraph = true, .name = "block_fwd"});
  CompiledFunction fb = compile(fwd_bwd, {.fullgraph = true, .name = "block_fwd_bwd"});
  EXPECT_TRUE(test::all_close(f({x})[0], fwd({x})[0], 1e-5, 1e-5));
  const auto got = fb({x}), want = fwd_bwd({x});
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(test::all_close(got[i], want[i], 1e-5, 1e-5)) << "result " << i;
  const Explanation ef = f.explain({x}), eb = fb.explain({x});
  std::printf("one GPT block (tiny), forward: %d fused kernels + %d library calls; forward + backward: %d + %d\n",
              ef.fused_kernels, ef.library_calls, eb.fused_kernels, eb.library_calls);
  // Forward: the two norms, q, k and v as one call, attention (writing its heads joined, so no
  // copy), the output projection with its residual, fc with GELU, proj with its residual: 7 steps.
  // With backward (a GEMM whose output backward reads keeps its activation as a kernel; attention's
  // gradients written joined too): 36.
  EXPECT_EQ(ef.library, (std::vector<std::string>{"linear3", "sdpa", "linear_fused: bias + residual",
                                                  "linear_fused: bias + gelu_tanh", "linear_fused: bias + residual"}))
      << ef.text;
  EXPECT_LE(ef.fused_kernels + ef.library_calls, 7) << ef.text;
  EXPECT_LE(eb.fused_kernels + eb.library_calls, 36) << eb.text;
}

TEST(Compile, AWholeTrainingStepMatchesEager) {
  // Forward, backward, clipping and AdamW traced as one graph; the optimizer's writes to the
  // parameters and its state happen in the graph, on the captured tensors.
  ScopedEnv cache("SINTER_CACHE_DIR", fresh_cache("train"));
  auto data = toy_data();
  auto eager = seeded_model("tiny", 5), compiled = seeded_model("tiny", 5);
  optim::AdamW eager_opt(eager->named_parameters(), 3e-3, 0.9, 0.95, 1e-8, 0.1);
  optim::AdamW compiled_opt(compiled->named_parameters(), 3e-3, 0.9, 0.95, 1e-8, 0.1);
  CompiledFunction f = compile([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{train::step(*compiled, compiled_opt, in[0], in[1])}; },
                               {.name = "train_step"});
  for (int s = 0; s < 5; ++s) {
    auto [x, y] = data.batch(true, 4, 32, 1, uint64_t(s));
    eager_opt.set_lr(1e-3 * (s + 1)), compiled_opt.set_lr(1e-3 * (s + 1));  // a tensor the graph reads
    const double le = train::step(*eager, eager_opt, x, y).item<double>();
    const double lc = f({x, y})[0].item<double>();
    EXPECT_NEAR(lc, le, 1e-5 * std::fabs(le)) << "step " << s;
  }
  EXPECT_EQ(f.compiles(), 1);
  auto pc = compiled->named_parameters(), pe = eager->named_parameters();
  for (size_t i = 0; i < pc.size(); ++i) EXPECT_TRUE(test::all_close(*pc[i].second, *pe[i].second, 1e-4, 1e-5)) << pc[i].first;
  EXPECT_EQ(compiled_opt.steps(), 5);
}

TEST(Compile, GuardsRecompileAndTheLimitFallsBackToEager) {
  ScopedEnv cache("SINTER_CACHE_DIR", fresh_cache("guards"));
  const std::string debug = fresh_cache("guards_debug");
  ScopedEnv dbg("SINTER_COMPILE_DEBUG", debug);
  CompiledFunction f = compile(chain, {.recompile_limit = 2, .name = "guarded"});
  auto in = [](int64_t n, DType dt = DType::f32) {
    return std::vector<Tensor>{randn({n, 8}).to(dt), randn({8}).to(dt), randn({n, 1}).to(dt)};
  };
  (void)f(in(4));
  (void)f(in(4));
  EXPECT_EQ(f.compiles(), 1);
  EXPECT_EQ(f.traces(), 1);
  // A new size: a guard miss and a second trace, whose code is the first one's (sizes are
  // parameters of the generated code), so nothing is compiled and the limit does not count it.
  auto five = in(5);
  EXPECT_TRUE(bitwise_equal(f(five)[0], chain(five)[0]));
  EXPECT_EQ(f.traces(), 2);
  EXPECT_EQ(f.compiles(), 1);
  std::ifstream miss(debug + "/guarded.guard_miss.txt");
  std::string why((std::istreambuf_iterator<char>(miss)), std::istreambuf_iterator<char>());
  EXPECT_NE(why.find("input 0 shape (5, 8)"), std::string::npos) << why;
  for (const char* file : {"guarded.graph.txt", "guarded.passes.txt", "guarded.cpp", "guarded.cmd"})
    EXPECT_TRUE(fs::exists(debug + "/" + file)) << file;
  // Another dtype is other code: the second program, which reaches the limit of 2.
  auto f64 = in(4, DType::f64);
  EXPECT_TRUE(bitwise_equal(f(f64)[0], chain(f64)[0]));
  EXPECT_EQ(f.compiles(), 2);
  // Past the limit: eager, still right, no more traces, one warning.
  auto x = in(6, DType::bf16);
  std::string err;
  const WarningHandler before = set_warning_handler([&](const std::string& w) { err += w + "\n"; });
  testing::internal::CaptureStderr();
  EXPECT_TRUE(bitwise_equal(f(x)[0], chain(x)[0]));
  (void)f(in(7, DType::bf16));
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "") << "the library printed";
  set_warning_handler(before);
  EXPECT_EQ(f.compiles(), 2);
  EXPECT_EQ(f.traces(), 3);
  EXPECT_NE(err.find("recompile limit"), std::string::npos) << err;
  EXPECT_EQ(err.find("recompile limit", err.find("recompile limit") + 1), std::string::npos) << "warned more than once";
}

TEST(Compile, ATrainingStepServesEverySequenceLengthWithOneCompile) {
  // Lengths 17..128 through one compiled training step: each new length is traced again (the
  // shapes differ) and runs the same compiled program; losses track eager's step for step. At
  // 128 the model uses its whole position table, so the graph has no slice (and its backward no
  // padding): a second program, the only other one.
  ScopedEnv cache("SINTER_CACHE_DIR", fresh_cache("dynamic"));
  auto data = toy_data();
  auto eager = seeded_model("tiny", 6), compiled = seeded_model("tiny", 6);
  optim::AdamW eager_opt(eager->named_parameters(), 1e-3, 0.9, 0.95, 1e-8, 0.1);
  optim::AdamW compiled_opt(compiled->named_parameters(), 1e-3, 0.9, 0.95, 1e-8, 0.1);
  CompiledFunction f = compile([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{train::step(*compiled, compiled_opt, in[0], in[1])}; },
                               {.dynamic = {{0, 1, 17, 128}, {1, 1, 17, 128}}, .name = "train_step_dynamic"});
  int steps = 0;
  for (int64_t T = 17; T <= 128; ++T) {
    auto [x, y] = data.batch(true, 2, T, 1, uint64_t(T));
    const double lc = f({x, y})[0].item<double>();
    if (T == 127) {
      EXPECT_EQ(f.compiles(), 1) << "lengths 17..127 should share one program";
    }
    if (T % 8 == 1 || T == 128) {  // eager on a sample of the lengths (its weights follow the same steps)
      const double le = train::step(*eager, eager_opt, x, y).item<double>();
      EXPECT_NEAR(lc, le, 1e-4 * std::fabs(le)) << "T = " << T;
      ++steps;
    } else {
      (void)train::step(*eager, eager_opt, x, y);
    }
  }
  EXPECT_EQ(f.traces(), 112);
  EXPECT_EQ(f.compiles(), 2);
  // Outside the declared range: an error naming the input, the dim and the range.
  const auto [x, y] = data.batch(true, 2, 16, 1, 0);
  const std::vector<Tensor> short_batch{x, y};  // a lambda captures this, not the bindings (clang 14)
  EXPECT_TRUE(test::throws_naming("compile", [&] { (void)f(short_batch); }));
  try {
    (void)f({x, y});
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("input 0 dim 1 is 16, outside its declared range [17, 128]"), std::string::npos) << e.what();
  }
  EXPECT_EQ(f.traces(), 112);
  EXPECT_GT(steps, 10);
}

TEST(Compile, ADataDependentOpBreaksTheGraph) {
  ScopedEnv cache("SINTER_CACHE_DIR", fresh_cache("break"));
  auto fn = [](const std::vector<Tensor>& in) {
    const double m = max(in[0]).item<double>();  // the host needs a value
    return std::vector<Tensor>{in[0] / m};
  };
  Tensor x = randn({5});
  EXPECT_TRUE(test::throws_naming("compile", [&] {
    CompiledFunction f = compile(fn, {.fullgraph = true, .name = "strict"});
    (void)f({x});
  }));
  try {
    CompiledFunction f = compile(fn, {.fullgraph = true, .name = "strict"});
    (void)f({x});
  } catch (const CompileError& e) {
    EXPECT_NE(std::string(e.what()).find("item"), std::string::npos) << e.what();
  }
  CompiledFunction f = compile(fn, {.name = "loose"});
  EXPECT_TRUE(bitwise_equal(f({x})[0], fn({x})[0]));
  const Explanation e = f.explain({x});
  EXPECT_EQ(e.breaks, 1);
  ASSERT_EQ(e.break_reasons.size(), 1u);
  EXPECT_NE(e.break_reasons[0].find("item"), std::string::npos);
}

TEST(Compile, AMissingOrFailingCompilerIsNamedAndFallsBackToEager) {
  ScopedEnv cache("SINTER_CACHE_DIR", fresh_cache("cxx"));
  const std::string failing = fresh_cache("failing_cxx");
  fs::create_directories(failing);
  const std::string script = failing + "/cxx";
  std::ofstream(script) << "#!/bin/sh\ncase \"$1\" in --version) echo fake-cxx 1.0;; *) echo 'fake-cxx: internal error: out of ideas' >&2; exit 1;; esac\n";
  fs::permissions(script, fs::perms::owner_all);
  Tensor x = randn({3, 4}), a = randn({4}), b = randn({3, 1});
  for (const std::string& cxx : {std::string("/nonexistent/c++"), script}) {
    SCOPED_TRACE(cxx);
    ScopedEnv env("SINTER_CXX", cxx);
    try {
      CompiledFunction f = compile(chain, {.fullgraph = true, .name = "strict"});
      (void)f({x, a, b});
      ADD_FAILURE() << "no CompileError";
    } catch (const CompileError& e) {
      EXPECT_NE(std::string(e.what()).find(cxx), std::string::npos) << e.what();
      if (cxx == script) {
        EXPECT_NE(std::string(e.what()).find("out of ideas"), std::string::npos) << e.what();
      }
    }
    CompiledFunction f = compile(chain, {.name = "loose"});
    std::string err;
    const WarningHandler before = set_warning_handler([&](const std::string& w) { err += w + "\n"; });
    EXPECT_TRUE(bitwise_equal(f({x, a, b})[0], chain({x, a, b})[0]));
    set_warning_handler(before);
    EXPECT_NE(err.find("eagerly"), std::string::npos) << err;
  }
}

TEST(Compile, ACorruptCacheEntryIsRebuilt) {
  const std::string dir = fresh_cache("corrupt");
  ScopedEnv cache("SINTER_CACHE_DIR", dir);
  Tensor x = randn({7, 5}), a = randn({5}), b = randn({7, 1});
  const Tensor ref = chain({x, a, b})[0];
  auto entry = [&] {
    for (auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".so") return e.path().string();
    return std::string();
  };
  // A child process fills the cache (a process of its own: this one keeps what it loaded).
  auto in_child = [&](const std::function<bool()>& body) {
    const pid_t pid = fork();
    if (pid == 0) _exit(body() ? 0 : 1);
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
  };
  auto compiled_equals = [&] {
    CompiledFunction f = compile(chain, {.fullgraph = true, .name = "cached"});
    return bitwise_equal(f({x, a, b})[0], ref) && f.explain({x, a, b}).text.find("from the cache") != std::string::npos;
  };
  auto compiled_fresh = [&] {
    CompiledFunction f = compile(chain, {.fullgraph = true, .name = "cached"});
    return bitwise_equal(f({x, a, b})[0], ref) && f.explain({x, a, b}).text.find("from the cache") == std::string::npos;
  };
  ASSERT_TRUE(in_child(compiled_fresh));
  ASSERT_TRUE(in_child(compiled_equals));  // a warm start loads it
  const std::string so = entry();
  ASSERT_FALSE(so.empty());
  fs::resize_file(so, fs::file_size(so) / 2);  // truncated
  EXPECT_TRUE(in_child(compiled_fresh));
  {
    std::fstream f(so, std::ios::in | std::ios::out | std::ios::binary);  // one flipped byte
    f.seekp(4000);
    char c;
    f.seekg(4000);
    f.get(c);
    f.seekp(4000);
    f.put(char(c ^ 0x5a));
  }
  EXPECT_TRUE(in_child(compiled_fresh));
  EXPECT_TRUE(in_child(compiled_equals));
}

TEST(Compile, ProcessesCompilingTheSameGraphAtOnceShareOneEntry) {
  const std::string dir = fresh_cache("race");
  ScopedEnv cache("SINTER_CACHE_DIR", dir);
  Tensor x = randn({9, 4}), a = randn({4}), b = randn({9, 1});
  const Tensor ref = chain({x, a, b})[0];
  std::vector<pid_t> kids;
  for (int i = 0; i < 3; ++i) {
    const pid_t pid = fork();
    if (pid == 0) {
      CompiledFunction f = compile(chain, {.fullgraph = true, .name = "race"});
      _exit(bitwise_equal(f({x, a, b})[0], ref) ? 0 : 1);
    }
    kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  int entries = 0;
  for (auto& e : fs::directory_iterator(dir)) entries += e.path().extension() == ".so";
  EXPECT_EQ(entries, 1);
}

TEST(Compile, TrainingWithACompiledStepTracksEagerTraining) {
  // `sinter train --compile`: 200 steps of the default model over its full context (128
  // positions), the same losses as eager training.
  ScopedEnv cache("SINTER_CACHE_DIR", fresh_cache("train_cli"));
  train::Options o;
  o.steps = 200, o.batch = 4, o.seq_len = 128, o.val_every = 1000, o.save_every = 1000, o.quiet = true;
  o.out_dir = fresh_cache("train_eager");
  const train::Result eager = train::run(o);
  o.out_dir = fresh_cache("train_compiled"), o.compile = true;
  const train::Result compiled = train::run(o);
  ASSERT_EQ(eager.losses.size(), 200u);
  ASSERT_EQ(compiled.losses.size(), 200u);
  double worst = 0;
  for (size_t i = 0; i < 200; ++i) worst = std::max(worst, std::fabs(eager.losses[i] - compiled.losses[i]));
  EXPECT_LE(worst, 1e-4);
  EXPECT_LT(eager.losses.back(), eager.losses.front() - 1.0);  // it learned
}

TEST(Compile, OneCompiledDecodeStepServesEveryPosition) {
  // 300 tokens from a 128-position model: the window slides (the cache refilled eagerly) and the
  // decode step, traced once, runs at every position; greedy tokens equal eager generation's.
  ScopedEnv cache("SINTER_CACHE_DIR", fresh_cache("decode"));
  for (const char* preset : {"tiny", "llama-tiny"}) {
    SCOPED_TRACE(preset);
    nn::GPT model(nn::ModelConfig::preset(preset));
    model.init_weights(11);
    const Tensor prompt = data::encode("Once upon a time");
    const train::Sampling greedy{0.0, 0, 1.0, 1};
    const Tensor eager = train::generate(model, prompt, 300, greedy);
    int graphs = -1, fused = -1;
    const Tensor compiled = train::generate(model, prompt, 300, greedy, true, nullptr, {}, true, [&](CompiledFunction& f) {
      const Explanation e = f.explain({zeros({1, 1}, DType::i64)});
      graphs = e.graphs, fused = e.fused_kernels;
    });
    EXPECT_TRUE(test::all_close(compiled, eager, 0, 0));
    EXPECT_EQ(graphs, 1);
    EXPECT_GT(fused, 0);
  }
}

TEST(Compile, AGraphBreakSplitsTheFunctionIntoCompiledPieces) {
  // The host reads a value in the middle and branches on it: the work before the read is one
  // compiled piece, the work after it another (one per branch taken), each fused.
  ScopedEnv cache("SINTER_CACHE_DIR", fresh_cache("pieces"));
  auto fn = [](const std::vector<Tensor>& in) {  // op order spelled out: C++ leaves an operator's operands unordered
    Tensor sg = sigmoid(in[0]);
    Tensor h = gelu(in[0] * 1.5 + in[1]) * sg;
    const double s = sum(h).item<double>();
    Tensor y;
    if (s > 0) {
      y = tanh(h) * 2.0 + h;
    } else {
      Tensor half = h * 0.5;
      y = sigmoid(h) - half;
    }
    return std::vector<Tensor>{y, h};
  };
  CompiledFunction f = compile(fn, {.name = "pieces"});
  Tensor b = randn({64});
  for (int call = 0; call < 6; ++call) {
    SCOPED_TRACE(call);
    Tensor x = randn({32, 64}) + (call % 2 ? -4.0 : 4.0);  // both branches, each twice or more
    const std::vector<Tensor> got = f({x, b}), want = fn({x, b});
    ASSERT_EQ(got.size(), 2u);
    EXPECT_TRUE(bitwise_equal(got[0], want[0]));
    EXPECT_TRUE(bitwise_equal(got[1], want[1]));
  }
  EXPECT_EQ(f.compiles(), 3);  // the piece before the read, and one after it per branch
  const Explanation e = f.explain({randn({32, 64}), b});
  EXPECT_EQ(e.graphs, 2) << e.text;
  ASSERT_EQ(e.breaks, 1) << e.text;
  EXPECT_NE(e.break_reasons[0].find("item"), std::string::npos) << e.text;
  // Piece 1: the chain as one kernel, the sum and the item the host reads; piece 2: one kernel.
  EXPECT_EQ(e.library, (std::vector<std::string>{"sum", "item"})) << e.text;
  ASSERT_GE(e.kernels.size(), 2u) << e.text;
  EXPECT_EQ(e.kernels[0], "sigmoid -> mul -> add -> gelu -> mul") << e.text;
  EXPECT_EQ(e.kernels.back(), "mul -> sigmoid -> sub") << e.text;
  // fullgraph: the same function is refused, naming the op.
  EXPECT_THROW(compile(fn, {.fullgraph = true, .name = "strict_pieces"})({randn({4, 64}), b}), CompileError);

  // Random draws on both sides of a break take what eager takes, and new numbers every call.
  auto noisy = [](const std::vector<Tensor>& in) {
    Tensor h = dropout(in[0], 0.5) * 2.0;
    const double m = max(h).item<double>();
    // (a branch on the value; scaling by it would make m a constant of the next piece, one program per value)
    return std::vector<Tensor>{dropout(m > 0 ? h : -h, 0.25) + rand({in[0].size(0), 1})};
  };
  CompiledFunction g = compile(noisy, {.name = "noisy_pieces"});
  Tensor x = randn({64, 32});
  Tensor previous;
  for (int call = 0; call < 3; ++call) {
    manual_seed(uint64_t(40 + call % 2));
    const Tensor want = noisy({x})[0];
    const uint64_t offset = default_generator().offset;
    manual_seed(uint64_t(40 + call % 2));
    const Tensor got = g({x})[0];
    EXPECT_EQ(default_generator().offset, offset) << "call " << call;
    EXPECT_TRUE(bitwise_equal(got, want)) << "call " << call;
    if (previous.defined()) {
      EXPECT_FALSE(bitwise_equal(got, previous)) << "call " << call;
    }
    previous = got;
  }
  EXPECT_EQ(g.compiles(), 2);
}

TEST(Compile, ATrainingStepThatChecksItsLossBeforeTheUpdateMatchesEager) {
  // Forward and backward, a host check of the loss and gradient norm (item), then AdamW: two
  // compiled pieces, with autograd's saved tensors and the gradients carried between them.
  ScopedEnv cache("SINTER_CACHE_DIR", fresh_cache("checked_step"));
  auto data = toy_data();
  auto eager = seeded_model("tiny", 5), compiled = seeded_model("tiny", 5);
  optim::AdamW eager_opt(eager->named_parameters(), 3e-3, 0.9, 0.95, 1e-8, 0.1);
  optim::AdamW compiled_opt(compiled->named_parameters(), 3e-3, 0.9, 0.95, 1e-8, 0.1);
  auto checked_step = [](nn::GPT& m, optim::AdamW& opt, const Tensor& x, const Tensor& y) {
    auto [loss, norm] = train::loss_and_gradients(m, opt, x, y);
    if (std::isfinite(loss.item<double>()) && std::isfinite(norm.item<double>())) opt.step();
    return std::vector<Tensor>{loss};
  };
  CompiledFunction f = compile([&](const std::vector<Tensor>& in) { return checked_step(*compiled, compiled_opt, in[0], in[1]); },
                               {.name = "checked_step"});
  for (int s = 0; s < 4; ++s) {
    auto [x, y] = data.batch(true, 4, 32, 1, uint64_t(s));
    const double le = checked_step(*eager, eager_opt, x, y)[0].item<double>();
    const double lc = f({x, y})[0].item<double>();
    EXPECT_NEAR(lc, le, 1e-5 * std::fabs(le)) << "step " << s;
  }
  const Explanation e = f.explain({data.batch(true, 4, 32, 1, 0).first, data.batch(true, 4, 32, 1, 0).second});
  EXPECT_EQ(e.graphs, 2) << e.text;  // forward + backward + clipping, then AdamW
  EXPECT_EQ(e.breaks, 1) << e.text;  // the two reads sit together: one break (the second read is of a scalar)
  EXPECT_EQ(f.compiles(), 2) << e.text;
  auto pc = compiled->named_parameters(), pe = eager->named_parameters();
  for (size_t i = 0; i < pc.size(); ++i) EXPECT_TRUE(test::all_close(*pc[i].second, *pe[i].second, 1e-4, 1e-5)) << pc[i].first;
  EXPECT_EQ(compiled_opt.steps(), 4);
}

TEST(Compile, GradientsFlowThroughACompiledForward) {
  // compile_forward(model) in grad mode: the logits come back with an autograd node whose backward
  // is a second compiled program (forward and backward traced together, split at the gradients).
  ScopedEnv cache("SINTER_CACHE_DIR", fresh_cache("compiled_backward"));
  auto data = toy_data();
  for (const char* preset : {"tiny", "llama-tiny"}) {
    SCOPED_TRACE(preset);
    auto eager = seeded_model(preset, 7), compiled = seeded_model(preset, 7);
    CompiledFunction f = compile_forward(*compiled);
    for (int s = 0; s < 2; ++s) {  // the second call reuses both programs; gradients accumulate
      auto [x, y] = data.batch(true, 4, 32, 1, uint64_t(s));
      Tensor le = cross_entropy(eager->forward(x).reshape({-1, 256}), y.reshape({-1}));
      le.backward();
      Tensor logits = f({x})[0];
      ASSERT_TRUE(logits.requires_grad());
      Tensor lc = cross_entropy(logits.reshape({-1, 256}), y.reshape({-1}));
      lc.backward();
      EXPECT_NEAR(lc.item<double>(), le.item<double>(), 1e-5 * std::fabs(le.item<double>()));
    }
    EXPECT_EQ(f.compiles(), 2);  // the forward and the backward
    auto pc = compiled->named_parameters(), pe = eager->named_parameters();
    for (size_t i = 0; i < pc.size(); ++i) {
      ASSERT_TRUE(pc[i].second->grad().defined()) << pc[i].first;
      EXPECT_TRUE(test::all_close(pc[i].second->grad(), pe[i].second->grad(), 1e-5, 1e-6)) << pc[i].first;
    }
  }
  // An input that requires grad gets its gradient too, and a call without grad mode is plain.
  auto fn = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{gelu(in[0] * in[1] + 0.5) * sigmoid(in[0])}; };
  CompiledFunction g = compile(fn, {.name = "input_grads"});
  Tensor x = randn({16, 32}), a = randn({32});
  Tensor xe = x.clone().requires_grad_(), ae = a.clone().requires_grad_(), xc = x.clone().requires_grad_(), ac = a.clone().requires_grad_();
  { Tensor o = fn({xe, ae})[0]; sum(o * o).backward(); }
  { Tensor o = g({xc, ac})[0]; sum(o * o).backward(); }
  EXPECT_TRUE(test::all_close(xc.grad(), xe.grad(), 1e-6, 1e-7));
  EXPECT_TRUE(test::all_close(ac.grad(), ae.grad(), 1e-6, 1e-7));
  {
    NoGradGuard no_grad;
    EXPECT_FALSE(g({xc, ac})[0].requires_grad());
  }
}

TEST(Compile, ACompiledBackwardRecomputesCheapValuesInsteadOfKeepingThem) {
  // h = relu(x) + x * x feeds a matmul whose backward reads it; relu's and mul's backward read x.
  // With recomputation the backward computes h again from x (which it keeps anyway) and the
  // forward keeps only the matmul's output y (read by y * y's backward); without, h too.
  ScopedEnv cache("SINTER_CACHE_DIR", fresh_cache("recompute"));
  manual_seed(14);
  Tensor w = (randn({96, 32}) * 0.1).requires_grad_();
  auto fn = [&](const std::vector<Tensor>& in) {
    const Tensor y = matmul(relu(in[0]) + in[0] * in[0], w);
    return std::vector<Tensor>{y * y};
  };
  const Tensor x = randn({64, 96});
  Tensor xe = x.clone().requires_grad_();
  sum(fn({xe})[0]).backward();
  const Tensor we = w.grad().clone();
  const int64_t h_bytes = 64 * 96 * 4, y_bytes = 64 * 32 * 4;
  for (bool recompute : {true, false}) {
    w.set_grad(Tensor());
    CompiledFunction f = compile(fn, {.recompute = recompute, .name = recompute ? "recompute_on" : "recompute_off"});
    Tensor xc = x.clone().requires_grad_();
    sum(f({xc})[0]).backward();
    EXPECT_TRUE(test::all_close(xc.grad(), xe.grad(), 1e-5, 1e-6)) << "recompute " << recompute;
    EXPECT_TRUE(test::all_close(w.grad(), we, 1e-5, 1e-6)) << "recompute " << recompute;
    const Explanation e = f.explain({xc});
    // Kept: y, and without recomputation the matmul's input relu(x) + x * x (with it, its three
    // nodes run again from x).
    EXPECT_EQ(e.recomputed, recompute ? 3 : 0) << e.text;
    EXPECT_EQ(e.saved_bytes, recompute ? y_bytes : h_bytes + y_bytes) << e.text;
  }
}

TEST(Compile, ALazilyRunFunctionsOutputsCarryTheirGradients) {
  // A break inside a function whose outputs require grad: the pieces run compiled, and autograd's
  // graph, recorded while tracing, holds the pieces' real tensors, so backward() gives eager's
  // gradients.
  ScopedEnv cache("SINTER_CACHE_DIR", fresh_cache("lazy_grads"));
  Tensor w = randn({32}).requires_grad_(), we = w.detach().clone().requires_grad_();
  auto fn = [](const Tensor& x, const Tensor& weight) {
    Tensor h = gelu(x * weight + 0.5);
    return std::vector<Tensor>{sum(h).item<double>() > 0 ? h * sigmoid(h) : h * 2.0};
  };
  CompiledFunction f = compile([&](const std::vector<Tensor>& in) { return fn(in[0], w); }, {.name = "lazy_grads"});
  for (int call = 0; call < 2; ++call) {
    Tensor x = randn({16, 32});
    Tensor got = f({x})[0], want = fn(x, we)[0];
    EXPECT_TRUE(bitwise_equal(got, want));
    ASSERT_TRUE(got.requires_grad());
    sum(got * got).backward();
    sum(want * want).backward();
    EXPECT_TRUE(test::all_close(w.grad(), we.grad(), 1e-6, 1e-7)) << "call " << call;
  }
  // A tensor only autograd keeps (exp's output, saved as a detached copy; sum keeps nothing) is
  // made real too.
  Tensor u = randn({8}).requires_grad_(), ue = u.detach().clone().requires_grad_();
  auto gn = [](const Tensor& x) {
    const double m = max(x).item<double>();
    return std::vector<Tensor>{sum(exp(x * (m > 0 ? 0.5 : 0.25)))};
  };
  CompiledFunction h = compile([&](const std::vector<Tensor>&) { return gn(u); }, {.name = "lazy_saved"});
  h({})[0].backward();
  gn(ue)[0].backward();
  EXPECT_TRUE(test::all_close(u.grad(), ue.grad(), 1e-6, 1e-7));
}

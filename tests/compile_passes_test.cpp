// The compiler's single source of truth for fusion (OpDef::fusable and OpDef::spelling) and its
// pass switches (SINTER_COMPILE_DISABLE): an op flagged not fusable runs its own kernel in a
// compiled graph; each pass switched off, and all of them, still give eager's results.
#include <cstdlib>
#include <filesystem>

#include <sinter/compile.h>

#include "test_util.h"

using namespace sinter;
namespace fs = std::filesystem;

namespace {

using test::ScopedEnv;  // each test compiles into a cache folder of its own

std::string fresh_cache(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("sinter_compile_passes_" + name);
  fs::remove_all(d);
  return d.string();
}

// gelu under another name, its kernel and backward, with the fusable flag given.
const OpDef& gelu_copy(const std::string& name, bool fusable) {
  if (const OpDef* op = find_op(name)) return *op;
  const OpDef& gelu = get_op("gelu");
  OpDef d = gelu;
  d.name = name;
  d.fusable = fusable;
  d.kernels = {};
  const OpDef& out = register_op(d);
  register_kernel(name, DeviceType::cpu, gelu.kernels[size_t(DeviceType::cpu)]);
  return out;
}

bool mentions(const std::vector<std::string>& list, const std::string& what) {
  for (const std::string& s : list)
    if (s.find(what) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST(CompilePasses, AnOpFlaggedNotFusableNeverFusesAndOneFlaggedFusableDoes) {
  ScopedEnv cache("SINTER_CACHE_DIR", fresh_cache("flag"));
  manual_seed(3);
  const Tensor x = randn({64, 33}), b = randn({33});
  for (const bool fusable : {false, true}) {
    SCOPED_TRACE(fusable ? "fusable" : "not fusable");
    const OpDef& op = gelu_copy(fusable ? "test_gelu_fusable" : "test_gelu_opaque", fusable);
    auto fn = [&op](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{sigmoid(call1(op, {in[0] * 1.5 + in[1]})) * in[0]};
    };
    CompiledFunction f = compile(fn, {.name = op.name});
    EXPECT_TRUE(test::bitwise_equal(f({x, b})[0], fn({x, b})[0]));
    const Explanation e = f.explain({x, b});
    EXPECT_EQ(mentions(e.library, op.name), !fusable) << e.text;
    EXPECT_EQ(mentions(e.kernels, op.name), fusable) << e.text;
    // Not fusable: the chain is cut at it (a kernel before it, one after); fusable: one kernel.
    EXPECT_EQ(e.fused_kernels, fusable ? 1 : 2) << e.text;
  }
  // An op that claims to fuse must say how generated code spells it.
  OpDef d = get_op("gelu");
  d.name = "test_gelu_unspelled", d.kernels = {}, d.spelling = {};
  try {
    register_op(d);
    ADD_FAILURE() << "registered a fusable op without a spelling";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[register_op] op 'test_gelu_unspelled' is fusable but has no spelling"), std::string::npos) << e.what();
  }
}

TEST(CompilePasses, EachPassSwitchedOffStillGivesEagersResults) {
  // One GPT block forward and backward exercises every pass: common subexpressions, GEMM
  // epilogues, the q/k/v linears, attention's layout copy, elementwise and norm fusion; a
  // function whose output requires grad exercises the backward's recomputation.
  manual_seed(12);
  nn::GPT model(nn::ModelConfig::preset("tiny"));
  model.init_weights(4);
  nn::TransformerBlock& block = *model.blocks[0];
  const Tensor x = randn({2, 16, model.config().hidden_size}), wout = randn(x.shape());
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
  auto cheap = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{exp(relu(in[0] * 2.0 + 1.0) * in[0])}; };
  const std::vector<Tensor> want = fwd_bwd({x});
  const Tensor xr = randn({8, 16}).requires_grad_();
  Tensor eager_out = cheap({xr})[0];
  const Tensor eager_grad = autograd::grad({sum(eager_out)}, {xr})[0];
  for (const char* off : {"", "cse", "epilogues", "siblings", "layouts", "fuse", "recompute", "cse,epilogues,siblings,layouts,fuse,recompute"}) {
    SCOPED_TRACE(std::string("SINTER_COMPILE_DISABLE=") + off);
    ScopedEnv cache("SINTER_CACHE_DIR", fresh_cache(std::string("off_") + off));
    ScopedEnv disable("SINTER_COMPILE_DISABLE", off);
    CompiledFunction f = compile(fwd_bwd, {.fullgraph = true, .name = "block"});
    const std::vector<Tensor> got = f({x});
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(test::all_close(got[i], want[i], 1e-5, 1e-5)) << "result " << i;
    const Explanation e = f.explain({x});
    const std::string o = off;
    EXPECT_EQ(e.fused_kernels == 0, o.find("fuse") != std::string::npos) << e.text;
    EXPECT_EQ(mentions(e.library, "linear_fused"), o.find("epilogues") == std::string::npos) << e.text;
    EXPECT_EQ(mentions(e.library, "linear3"), o.find("siblings") == std::string::npos) << e.text;
    CompiledFunction g = compile(cheap, {.name = "cheap"});
    const Tensor out = g({xr})[0];
    EXPECT_TRUE(test::all_close(out, eager_out, 1e-6, 1e-6));
    EXPECT_TRUE(test::all_close(autograd::grad({sum(out)}, {xr})[0], eager_grad, 1e-6, 1e-6));
    EXPECT_EQ(g.explain({xr}).recomputed == 0, o.find("recompute") != std::string::npos) << g.explain({xr}).text;
  }
  ScopedEnv bad("SINTER_COMPILE_DISABLE", "fusion");
  try {
    compile(fwd_bwd, {.fullgraph = true, .name = "bad"})({x});
    ADD_FAILURE() << "an unknown pass name was accepted";
  } catch (const CompileError& e) {
    EXPECT_NE(std::string(e.what()).find("SINTER_COMPILE_DISABLE names 'fusion'"), std::string::npos) << e.what();
  }
}

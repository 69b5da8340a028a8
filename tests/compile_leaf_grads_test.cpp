// A compiled function that runs its own backward (loss.backward() inside): the gradients it leaves
// on the parameters are the ones eager leaves, set where there were none and added to what was
// there, bit for bit; a graph that reads them itself (an SGD step) matches eager too, whether the
// parameters held gradients when it was traced or not, and one that clears them first
// (zero_grad()) runs compiled on every call.
#include <filesystem>

#include <sinter/compile.h>

#include "test_util.h"

namespace sinter {
namespace {

namespace fs = std::filesystem;

std::string fresh_cache(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("sinter_leaf_grads_test_" + name);
  fs::remove_all(d);
  return d.string();
}

struct TwoLayers {
  nn::Linear a{24, 48}, b{48, 8};
  explicit TwoLayers(uint64_t seed) {
    manual_seed(seed);
    NoGradGuard g;
    for (nn::Linear* l : {&a, &b})
      for (auto& [name, p] : l->named_parameters()) p->copy_(randn(p->shape()) * 0.2);
  }
  Tensor loss(const Tensor& x, const Tensor& y) {
    const Tensor d = b.forward(gelu(a.forward(x))) - y;
    return sum(d * d);
  }
  std::vector<Tensor*> params() { return {&a.weight, &a.bias, &b.weight, &b.bias}; }
};

void expect_same_grads(TwoLayers& got, TwoLayers& want) {
  for (size_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(got.params()[i]->grad().defined()) << "parameter " << i;
    EXPECT_TRUE(test::bitwise_equal(got.params()[i]->grad(), want.params()[i]->grad())) << "parameter " << i;
  }
}

// The function under test: m's loss on (x, y), its backward run inside, the loss returned.
TensorFn backward_step(TwoLayers& m) {
  return [&m](const std::vector<Tensor>& in) {
    Tensor l = m.loss(in[0], in[1]);
    l.backward();
    return std::vector<Tensor>{l.detach()};
  };
}

TEST(CompileLeafGrads, ABackwardInsideLeavesTheGradientsEagerLeaves) {
  test::ScopedEnv cache("SINTER_CACHE_DIR", fresh_cache("backward"));
  TwoLayers eager(1), compiled(1);
  const Tensor x = randn({16, 24}), y = randn({16, 8});
  CompiledFunction f = compile(backward_step(compiled), {.fullgraph = true, .name = "leaf_grads"});
  for (int call = 0; call < 3; ++call) {  // none there, then added to what is there
    const Tensor le = backward_step(eager)({x, y})[0], lc = f({x, y})[0];
    EXPECT_TRUE(test::bitwise_equal(lc, le)) << "call " << call;
    expect_same_grads(compiled, eager);
  }
  EXPECT_EQ(f.compiles(), 1);
  const Explanation e = f.explain({x, y});
  EXPECT_EQ(e.graphs, 1) << e.text;
  EXPECT_EQ(e.breaks, 0) << e.text;
}

TEST(CompileLeafGrads, AnInputThatRequiresGradGetsItsGradientToo) {
  test::ScopedEnv cache("SINTER_CACHE_DIR", fresh_cache("input"));
  TwoLayers eager(4), compiled(4);
  const Tensor x = randn({16, 24}), y = randn({16, 8});
  CompiledFunction f = compile(backward_step(compiled), {.fullgraph = true, .name = "input_grad"});
  Tensor xe = x.clone().requires_grad_(), xc = x.clone().requires_grad_();
  for (int call = 0; call < 2; ++call) {  // the caller's tensor, set and then added to
    (void)backward_step(eager)({xe, y});
    (void)f({xc, y});
    ASSERT_TRUE(xc.grad().defined()) << "call " << call;
    EXPECT_TRUE(test::bitwise_equal(xc.grad(), xe.grad())) << "call " << call;
    expect_same_grads(compiled, eager);
  }
}

TEST(CompileLeafGrads, AGraphReadingTheGradientsMatchesEagerFromEitherStart) {
  const Tensor x = randn({16, 24}), y = randn({16, 8});
  auto sgd = [](TwoLayers& m) {
    return [&m](const std::vector<Tensor>& in) {
      Tensor l = m.loss(in[0], in[1]);
      l.backward();
      NoGradGuard g;
      for (Tensor* p : m.params()) p->sub_(p->grad() * 0.01);
      return std::vector<Tensor>{l.detach()};
    };
  };
  for (bool grads_before : {false, true}) {
    SCOPED_TRACE(grads_before ? "gradients there when traced" : "none there when traced");
    test::ScopedEnv cache("SINTER_CACHE_DIR", fresh_cache(grads_before ? "sgd_before" : "sgd"));
    TwoLayers eager(2), compiled(2);
    if (grads_before)
      for (TwoLayers* m : {&eager, &compiled}) m->loss(x, y).backward();
    CompiledFunction f = compile(sgd(compiled), {.name = "sgd"});
    for (int call = 0; call < 3; ++call) {
      const Tensor le = sgd(eager)({x, y})[0], lc = f({x, y})[0];
      EXPECT_TRUE(test::bitwise_equal(lc, le)) << "call " << call;
      expect_same_grads(compiled, eager);
      for (size_t i = 0; i < 4; ++i) EXPECT_TRUE(test::bitwise_equal(*compiled.params()[i], *eager.params()[i])) << i;
    }
    const Explanation e = f.explain({x, y});
    EXPECT_EQ(e.breaks, grads_before ? 1 : 0) << e.text;  // adding to a gradient already there breaks the trace
  }
}

TEST(CompileLeafGrads, AStepThatClearsItsGradientsFirstRunsCompiledEveryCall) {
  // zero_grad (set_grad({})) inside, then backward and an SGD step that reads the gradients: each
  // call sets them afresh, as eager's step does, without falling back to eager; a leaf the step
  // clears and gives no gradient (`frozen`) ends each call without one.
  test::ScopedEnv cache("SINTER_CACHE_DIR", fresh_cache("cleared"));
  const Tensor x = randn({16, 24}), y = randn({16, 8});
  Tensor frozen_eager = randn({3}).requires_grad_(), frozen_compiled = frozen_eager.detach().clone().requires_grad_();
  int bodies = 0;
  auto step = [&bodies](TwoLayers& m, Tensor& frozen) {
    return [&m, &frozen, &bodies](const std::vector<Tensor>& in) {
      ++bodies;
      for (Tensor* p : m.params()) p->set_grad({});
      frozen.set_grad({});
      Tensor l = m.loss(in[0], in[1]);
      l.backward();
      NoGradGuard g;
      for (Tensor* p : m.params()) p->sub_(p->grad() * 0.01);
      return std::vector<Tensor>{l.detach()};
    };
  };
  TwoLayers eager(3), compiled(3);
  CompiledFunction f = compile(step(compiled, frozen_compiled), {.fullgraph = true, .name = "cleared"});
  for (int call = 0; call < 3; ++call) {
    frozen_eager.set_grad(ones({3})), frozen_compiled.set_grad(ones({3}));
    const Tensor le = step(eager, frozen_eager)({x, y})[0];
    const int before = bodies;
    const Tensor lc = f({x, y})[0];
    if (call > 0) {
      EXPECT_EQ(bodies, before) << "call " << call << " ran the function eagerly";
    }
    EXPECT_TRUE(test::bitwise_equal(lc, le)) << "call " << call;
    expect_same_grads(compiled, eager);
    for (size_t i = 0; i < 4; ++i) EXPECT_TRUE(test::bitwise_equal(*compiled.params()[i], *eager.params()[i])) << i;
    EXPECT_FALSE(frozen_compiled.grad().defined());
  }
}

}  // namespace
}  // namespace sinter

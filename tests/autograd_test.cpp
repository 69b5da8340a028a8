#include <cmath>

#include "test_util.h"

using namespace sinter;
using sinter::test::all_close;
using sinter::test::throws_naming;

TEST(Autograd, AccumulatesIntoLeavesAcrossBackwardCalls) {
  Tensor x = tensor<double>({1, 2, 3}).requires_grad_();
  sum(x * x).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{2, 4, 6}));
  sum(x * 3.0).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{5, 7, 9}));
}

TEST(Autograd, SharedSubexpressionsSumTheirGradients) {
  Tensor x = tensor<double>({0.5, -1.0}).requires_grad_();
  Tensor y = exp(x);
  Tensor z = sum(y * y + y);  // dz/dx = 2e^{2x} + e^x
  z.backward();
  EXPECT_TRUE(all_close(x.grad(), std::vector<double>{2 * std::exp(1.0) + std::exp(0.5), 2 * std::exp(-2.0) + std::exp(-1.0)},
                        1e-12, 1e-12));
}

TEST(Autograd, NonScalarBackwardNeedsAGradient) {
  Tensor x = tensor<double>({1, 2}).requires_grad_();
  Tensor y = x * 2.0;
  EXPECT_TRUE(throws_naming("backward", [&] { y.backward(); }));
  y.backward(tensor<double>({1, 10}));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{2, 20}));
}

TEST(Autograd, RetainGraphAllowsASecondBackward) {
  Tensor x = tensor<double>({3}).requires_grad_();
  Tensor y = sum(sin(x));
  y.backward({}, true);
  y.backward();
  EXPECT_NEAR(x.grad().item<double>(), 2 * std::cos(3.0), 1e-12);
  EXPECT_TRUE(throws_naming("sum", [&] { y.backward(); }));
}

TEST(Autograd, NoGradRecordsNothing) {
  Tensor x = ones({2}).requires_grad_();
  {
    NoGradGuard g;
    Tensor y = x * 2.0;
    EXPECT_FALSE(y.requires_grad());
    EnableGradGuard e;
    EXPECT_TRUE((x * 2.0).requires_grad());
  }
  EXPECT_TRUE(grad_enabled());
  Tensor d = (x * 2.0).detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_TRUE(throws_naming("backward", [&] { sum(d).backward(); }));
}

TEST(Autograd, FunctionalGradLeavesDotGradAlone) {
  Tensor x = tensor<double>({1, 2}).requires_grad_();
  Tensor w = tensor<double>({3, 4}).requires_grad_();
  Tensor y = sum(x * w);
  auto g = autograd::grad({y}, {x, w});
  EXPECT_EQ(g[0].to_vector<double>(), (std::vector<double>{3, 4}));
  EXPECT_EQ(g[1].to_vector<double>(), (std::vector<double>{1, 2}));
  EXPECT_FALSE(x.grad().defined());
  Tensor unused = ones({1}, DType::f64).requires_grad_();
  Tensor y2 = sum(x * 2.0);
  EXPECT_TRUE(throws_naming("grad", [&] { autograd::grad({y2}, {unused}, {}, true); }));
  EXPECT_FALSE(autograd::grad({y2}, {unused}, {}, false, false, true)[0].defined());
}

TEST(Autograd, GradOfAnIntermediateTensor) {
  Tensor x = tensor<double>({2}).requires_grad_();
  Tensor h = x * x;
  Tensor y = sum(h * 3.0);
  EXPECT_EQ(autograd::grad({y}, {h})[0].item<double>(), 3.0);
}

TEST(Autograd, CreateGraphGivesSecondDerivatives) {
  Tensor x = tensor<double>({0.7}).requires_grad_();
  Tensor y = sum(x * x * x + sin(x));
  Tensor dy = autograd::grad({y}, {x}, {}, false, true)[0];  // 3x^2 + cos x
  EXPECT_TRUE(dy.requires_grad());
  Tensor d2 = autograd::grad({sum(dy)}, {x})[0];              // 6x - sin x
  EXPECT_NEAR(d2.item<double>(), 6 * 0.7 - std::sin(0.7), 1e-12);
  // Through an op that saves its output (tanh): d2/dx2 tanh = -2 tanh (1 - tanh^2).
  Tensor z = tensor<double>({0.3}).requires_grad_();
  Tensor g1 = autograd::grad({sum(tanh(z))}, {z}, {}, false, true)[0];
  Tensor g2 = autograd::grad({sum(g1)}, {z})[0];
  const double t = std::tanh(0.3);
  EXPECT_NEAR(g2.item<double>(), -2 * t * (1 - t * t), 1e-12);
}

TEST(Autograd, ModifyingASavedTensorInPlaceIsAnError) {
  Tensor a = tensor<double>({1, 2}).requires_grad_();
  Tensor b = tensor<double>({3, 4});
  Tensor y = sum(a * b);  // mul saves b for a's gradient
  b.add_(1.0);
  EXPECT_TRUE(throws_naming("mul", [&] { y.backward(); }));
}

TEST(Autograd, InPlaceOnATensorThatRequiresGradIsRefused) {
  Tensor a = ones({2}).requires_grad_();
  EXPECT_TRUE(throws_naming("add_", [&] { a.add_(1.0); }));
  NoGradGuard g;
  a.add_(1.0);  // the optimizer's way
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{2, 2}));
}

TEST(Autograd, GradientsFlowThroughViewsAndBroadcasting) {
  Tensor x = arange(0, 6, 1, DType::f64).reshape({2, 3}).detach().requires_grad_();
  Tensor b = tensor<double>({1, 2, 3}).requires_grad_();
  Tensor y = sum((x.t() * 2.0).slice(0, 1, 3) + b.reshape({3, 1}).slice(0, 1, 3));
  y.backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0, 2, 2, 0, 2, 2}));
  EXPECT_EQ(b.grad().to_vector<double>(), (std::vector<double>{0, 2, 2}));
}

TEST(Autograd, MixedPrecisionGradientsTakeTheInputDType) {
  Tensor x = ones({2}, DType::f32).requires_grad_();
  Tensor y = tensor<double>({1.5, 2.5});
  sum(x * y).backward();
  EXPECT_EQ(x.grad().dtype(), DType::f32);
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{1.5f, 2.5f}));
}

TEST(Autograd, OnlyFloatingLeavesCanRequireGrad) {
  Tensor i = zeros({2}, DType::i64);
  EXPECT_TRUE(throws_naming("requires_grad", [&] { i.requires_grad_(); }));
  Tensor x = ones({2}).requires_grad_();
  Tensor y = x * 2.0;
  EXPECT_TRUE(throws_naming("requires_grad", [&] { y.requires_grad_(false); }));
  // Integer outputs of differentiable ops never require grad.
  EXPECT_FALSE(argmax(x, 0).requires_grad());
  EXPECT_FALSE(max(x, 0).indices.requires_grad());
  EXPECT_TRUE(max(x, 0).values.requires_grad());
}

TEST(Autograd, DropoutBackwardReusesTheForwardMask) {
  manual_seed(3);
  Tensor x = ones({1000}, DType::f64).requires_grad_();
  Tensor y = dropout(x, 0.25);
  sum(y).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), y.detach().to_vector<double>());  // dy/dx = mask / (1 - p) = y for x = 1
  const double kept = sum(ne(y, zeros({}, DType::f64))).item<int64_t>();
  EXPECT_NEAR(kept / 1000.0, 0.75, 0.05);
}

// A checkpointed function (dropout inside, a parameter read from outside) against the same function
// recorded as usual and against finite differences; the generator continues as if nothing was
// recomputed.
TEST(Autograd, CheckpointRecomputesTheSameGraphAndItsGradientsMatchFiniteDifferences) {
  manual_seed(5);
  const Tensor w0 = randn({4, 3}, DType::f64), x0 = randn({2, 4}, DType::f64);
  const auto run = [&](const Tensor& x, const Tensor& w, bool ckpt) {
    const autograd::CheckpointFn f = [w](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{dropout(tanh(matmul(in[0], w)), 0.3) * 2.0};
    };
    manual_seed(11);
    const Tensor y = ckpt ? autograd::checkpoint(f, {x}, {w})[0] : f({x})[0];
    return sum(y * y);
  };
  Tensor next_draw[2];
  std::vector<Tensor> grads[2];
  for (const bool ckpt : {false, true}) {
    Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
    run(x, w, ckpt).backward();
    grads[ckpt] = {x.grad(), w.grad()};
    next_draw[ckpt] = rand({4}, DType::f64);
  }
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(all_close(grads[1][size_t(i)], grads[0][size_t(i)], 1e-12, 1e-12)) << i;
  EXPECT_TRUE(all_close(next_draw[1], next_draw[0], 0, 0));
  const double h = 1e-6;
  for (int which = 0; which < 2; ++which) {
    const Tensor& base = which == 0 ? x0 : w0;
    for (int64_t i = 0; i < base.numel(); ++i) {
      Tensor up = base.clone(), down = base.clone();
      up.data<double>()[i] += h, down.data<double>()[i] -= h;
      NoGradGuard g;
      const double fd = ((which == 0 ? run(up, w0, false) : run(x0, up, false)).item<double>() -
                         (which == 0 ? run(down, w0, false) : run(x0, down, false)).item<double>()) / (2 * h);
      EXPECT_NEAR(grads[1][size_t(which)].data<double>()[i], fd, 1e-6) << (which == 0 ? "x" : "w") << "[" << i << "]";
    }
  }
}

TEST(Autograd, ACheckpointedFunctionHasSecondDerivatives) {
  Tensor x = tensor(std::vector<double>{0.5, -1.5, 2.0}).requires_grad_();
  const Tensor y = autograd::checkpoint([](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] * in[0] * in[0]}; }, {x}, {})[0];
  const Tensor dy = autograd::grad({sum(y)}, {x}, {}, false, /*create_graph=*/true)[0];  // 3 x^2
  const Tensor d2y = autograd::grad({sum(dy)}, {x})[0];                                  // 6 x
  EXPECT_TRUE(all_close(dy, std::vector<double>{0.75, 6.75, 12.0}, 1e-12, 1e-12));
  EXPECT_TRUE(all_close(d2y, std::vector<double>{3.0, -9.0, 12.0}, 1e-12, 1e-12));
}

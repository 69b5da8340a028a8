// The sinter command line. Until the training CLI lands, `sinter demo` shows the library end to
// end: tensors, autograd, an MLP fitted by hand-written SGD, a safetensors round trip.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sinter/sinter.h>

using namespace sinter;

namespace {

int run_demo(int steps, int hidden, uint64_t seed, const std::string& out_dir) {
  manual_seed(seed);
  // Fit y = sin(3x) on [-1, 1] with a 2-layer tanh MLP.
  const int64_t n = 256;
  Tensor x = linspace(-1, 1, n).reshape({n, 1});
  Tensor y = sin(x * 3.0);
  Tensor w1 = (randn({hidden, 1}) * 1.0).requires_grad_(), b1 = zeros({hidden}).requires_grad_();
  Tensor w2 = (randn({1, hidden}) * (1.0 / std::sqrt(double(hidden)))).requires_grad_(), b2 = zeros({1}).requires_grad_();
  std::vector<Tensor> params{w1, b1, w2, b2};
  const double lr = 0.3;
  auto t0 = std::chrono::steady_clock::now();
  double loss_v = 0;
  std::printf("demo: fitting sin(3x) with a %d-unit MLP, %d steps of SGD (lr %.2f)\n", hidden, steps, lr);
  for (int step = 1; step <= steps; ++step) {
    Tensor pred = linear(tanh(linear(x, w1, b1)), w2, b2);
    Tensor loss = mean((pred - y) * (pred - y));
    loss.backward();
    {
      NoGradGuard g;
      for (Tensor& p : params) {
        p.add_(p.grad(), -lr);
        p.set_grad({});
      }
    }
    loss_v = loss.item<float>();
    if (step % 100 == 0 || step == steps) {
      const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double rate = step / el;
      std::printf("\rstep %5d/%d  loss %.5f  %.0f steps/s  ETA %.1fs   ", step, steps, loss_v, rate, (steps - step) / rate);
      std::fflush(stdout);
    }
  }
  std::printf("\n");
  std::filesystem::create_directories(out_dir);
  const std::string path = out_dir + "/demo_mlp.safetensors";
  io::save_safetensors(path, {{"w1", w1}, {"b1", b1}, {"w2", w2}, {"b2", b2}}, {{"task", "sin(3x) regression"}});
  auto loaded = io::load_safetensors(path);
  Tensor pred = linear(tanh(linear(x, loaded.tensors.at("w1"), loaded.tensors.at("b1"))), loaded.tensors.at("w2"),
                       loaded.tensors.at("b2"));
  const double reloaded = mean((pred - y) * (pred - y)).item<float>();
  std::printf("saved %s (%zu tensors); reloaded model loss %.5f\n", path.c_str(), loaded.tensors.size(), reloaded);
  std::printf("x = 0.5: model %.4f, sin(1.5) = %.4f\n",
              linear(tanh(linear(full({1, 1}, 0.5), w1, b1)), w2, b2).item<float>(), std::sin(1.5));
  return loss_v < 0.01 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"sinter: train and serve language models from C++"};
  app.require_subcommand(1);
  int steps = 2000, hidden = 32;
  uint64_t seed = 0;
  std::string out = "out";
  auto* demo = app.add_subcommand("demo", "fit a small MLP with autograd and round-trip it through safetensors");
  demo->add_option("--steps", steps, "SGD steps")->check(CLI::Range(1, 10000000));
  demo->add_option("--hidden", hidden, "hidden units")->check(CLI::Range(1, 1 << 20));
  demo->add_option("--seed", seed, "random seed");
  demo->add_option("--out", out, "output folder");
  CLI11_PARSE(app, argc, argv);
  try {
    if (*demo) return run_demo(steps, hidden, seed, out);
  } catch (const sinter::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  return 0;
}

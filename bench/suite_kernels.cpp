// User kernels in `sinter bench compile`: the swiglu example with its fused epilogue against the
// same math in eager ops; a compiled graph that calls a user kernel against the same calls made
// eagerly; what one eager call of a user kernel costs beyond the kernel itself; and the compile
// time of a graph of three user kernels against its slowest translation unit compiled alone.
#include <chrono>
#include <cstring>
#include <thread>
#include <sinter/compile.h>
#include <sinter/kernel.h>
#include <sinter/sinter.h>

#include "compiler/user_kernel.h"
#include "examples/kernels/kernels.h"
#include "harness.h"

namespace sinter::bench {
namespace {

const std::string kDir = std::string(SINTER_SOURCE_DIR) + "/examples/kernels";

double seconds(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A kernel computing x * S + 1 whose source carries `tag`, so each tag is a new translation unit.
const OpDef& tagged_kernel(const std::string& name, const std::string& tag) {
  return register_kernel_def({
      .name = name,
      .source = "// " + tag + "\ntemplate <class Cfg> void kernel(sinter::In<float> x, auto& y) {\n"
                "  for (int64_t i = 0; i < y.numel(); ++i) y.store(i, sinter::fn::Tanh{}(x[i]) * float(Cfg::S) + 1.0f);\n}\n",
      .inputs = {DType::f32},
      .outputs = {DType::f32},
      .shape = same_as_input(0),
      .configs = {{{"S", 2}}, {{"S", 3}}},
  });
}

void epilogue_row(const Options& o, Report& r) {
  NoGradGuard ng;
  const OpDef& swiglu = examples::swiglu_op(kDir);
  const int64_t rows = o.quick ? 1024 : 4096;
  const Tensor g = randn({rows, 2048}), u = randn({rows, 2048}), res = randn({rows, 2048});
  auto fused = [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{call1(swiglu, {in[0], in[1]}) * 0.5 + in[2]}; };
  auto eager = [&] { return silu(g) * u * 0.5 + res; };
  CompiledFunction f = compile(fused, {.fullgraph = true, .name = "swiglu_epilogue"});
  (void)f({g, u, res});
  const auto [c, e] = time_pair([&] { (void)f({g, u, res}); }, [&] { (void)eager(); });
  const Explanation x = f.explain({g, u, res});
  r.add("swiglu user kernel + epilogue f32 " + std::to_string(rows) + "x2048", c, "eager ops", e,
        "one call: " + (x.library.empty() ? std::string("?") : x.library[0]));
}

void graph_row(const Options& o, Report& r) {
  NoGradGuard ng;
  const OpDef& swiglu = examples::swiglu_op(kDir);
  const int64_t rows = o.quick ? 256 : 1024;
  const Tensor x = randn({rows, 512}), wg = randn({1408, 512}) * 0.05, wu = randn({1408, 512}) * 0.05, wd = randn({512, 1408}) * 0.05;
  auto mlp = [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{linear(call1(swiglu, {linear(in[0], wg), linear(in[0], wu)}), wd) + in[0]};
  };
  CompiledFunction f = compile(mlp, {.fullgraph = true, .name = "swiglu_mlp"});
  (void)f({x});
  const auto [c, e] = time_pair([&] { (void)f({x}); }, [&] { (void)mlp({x}); });
  r.add("graph with a user kernel: swiglu MLP f32 " + std::to_string(rows) + "x512x1408", c, "the same calls, eager", e);
}

void overhead_row(Report& r) {
  NoGradGuard ng;
  const OpDef& op = tagged_kernel("bench_overhead_kernel", "overhead");
  const Tensor x = randn({16});
  Tensor y = call1(op, {x});
  compiler::UserKernel& k = *compiler::user_kernel_of(&op);
  const compiler::UserKernelFn fn = compiler::user_kernel_code(k);
  const int64_t desc[] = {1, 16, 1, 1, 16, 1};
  char* p[] = {static_cast<char*>(x.data_ptr()), static_cast<char*>(y.data_ptr())};
  const Timing call = time_per_call([&] { (void)call1(op, {x}); }, 2000);
  const Timing alone = time_per_call([&] { fn(p, desc, 0); }, 2000);
  char note[160];
  std::snprintf(note, sizeof note, "%.2f us a call beyond the kernel's own (a PyTorch custom_op: ~10 us)", (call.best_ms - alone.best_ms) * 1e3);
  r.add("user kernel eager call, 16 f32", call, "the kernel's entry alone", alone, note);
}

// A graph calling three kernels: built-in ops between them, each kernel's output fed to the next.
CompiledFunction three_kernel_graph(const std::vector<const OpDef*>& ops, const std::string& name) {
  return compile([ops](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{call1(*ops[2], {call1(*ops[1], {call1(*ops[0], {in[0] * 2.0}) + 1.0}) * 0.5})};
  }, {.fullgraph = true, .name = name});
}

std::vector<const OpDef*> three_kernels(const std::string& tag) {
  std::vector<const OpDef*> ops;
  for (int i = 0; i < 3; ++i) ops.push_back(&tagged_kernel("bench_" + tag + "_" + std::to_string(i), tag + " " + std::to_string(i)));
  return ops;
}

void compile_cost_row(Report& r) {
  NoGradGuard ng;
  const std::string tag = std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
  const Tensor x = randn({64});
  // Each translation unit compiled alone, cold: three kernels one after another, then the graph
  // that calls them (its kernels already built). The slowest of the four is the bar.
  const std::vector<const OpDef*> alone = three_kernels("alone_" + tag);
  double slowest = 0;
  for (const OpDef* op : alone)
    slowest = std::max(slowest, seconds([&] { (void)compiler::user_kernel_code(*compiler::user_kernel_of(op)); }));
  CompiledFunction graph_alone = three_kernel_graph(alone, "graph_alone_" + tag);
  slowest = std::max(slowest, seconds([&] { (void)graph_alone.explain({x}); }));
  // Three new kernels and the graph that calls them, cold: their translation units side by side.
  const std::vector<const OpDef*> fresh = three_kernels("graph_" + tag);
  CompiledFunction f = three_kernel_graph(fresh, "three_kernels_" + tag);
  const double cold = seconds([&] { (void)f.explain({x}); });
  CompiledFunction g = three_kernel_graph(fresh, "three_kernels_" + tag);
  const double warm = seconds([&] { (void)g.explain({x}); });
  char note[200];
  std::snprintf(note, sizeof note, "4 translation units on %u threads; warm (code from the cache) %.3f s",
                std::thread::hardware_concurrency(), warm);
  r.add("compile: graph + 3 user kernels, cold", Timing{cold * 1e3, cold * 1e3}, "slowest translation unit alone",
        Timing{slowest * 1e3, slowest * 1e3}, note);
}

}  // namespace

void kernel_rows(const Options& o, Report& r) {
  epilogue_row(o, r);
  graph_row(o, r);
  overhead_row(r);
  compile_cost_row(r);
}

}  // namespace sinter::bench

// User-defined kernels (include/sinter/kernel.h) against plain references: results against loops
// and composite ops, gradients, effects (in place, through views, aliases, dead writes dropped),
// autotuning (the fastest config, reused by another process, per key bucket, a corrupt record
// rewritten), errors naming the kernel and the user's source lines, and compiled graphs that keep
// every user kernel in one graph.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <sinter/compile.h>
#include <sinter/kernel.h>

#include "test_util.h"

using namespace sinter;
namespace fs = std::filesystem;
using test::ScopedEnv;

namespace {

std::string fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("sinter_kernel_test_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

// y = x * x + 1, elementwise; backward 2 x g.
const OpDef& square_plus_one() {
  if (const OpDef* op = find_op("test_square_plus_one")) return *op;
  return register_kernel_def({
      .name = "test_square_plus_one",
      .source = R"(template <class Cfg> void kernel(sinter::In<float> x, auto& y) {
  for (int64_t i = 0; i < y.numel(); ++i) y.store(i, x[i] * x[i] + 1.0f);
})",
      .inputs = {DType::f32},
      .outputs = {DType::f32},
      .shape = same_as_input(0),
      .backward = [](BackwardCtx& c) { return std::vector<Tensor>{c.grads[0] * c.inputs[0] * 2.0}; },
  });
}

// x *= s in place (through x's strides: it may be a view); returns x.
const OpDef& scale_in_place() {
  if (const OpDef* op = find_op("test_scale_")) return *op;
  return register_kernel_def({
      .name = "test_scale_",
      .source = R"(template <class Cfg> void kernel(sinter::In<float> x, sinter::In<float> s, auto& y) {
  const float k = s[0];
  for (int64_t i = 0; i < y.size(0); ++i)
    for (int64_t j = 0; j < y.size(1); ++j) y(i, j) = y(i, j) * k;
})",
      .inputs = {DType::f32, DType::f32},
      .outputs = {DType::f32},
      .shape = same_as_input(0),
      .effects = {Effect::writes(0)},
  });
}

}  // namespace

TEST(UserKernel, ComputesWhatALoopComputesAndDifferentiates) {
  ScopedEnv cache("SINTER_CACHE_DIR", fresh_dir("basic"));
  manual_seed(1);
  const OpDef& op = square_plus_one();
  Tensor x = randn({7, 13}).requires_grad_();
  Tensor y = call1(op, {x});
  EXPECT_TRUE(test::bitwise_equal(y.detach(), (x.detach() * x.detach() + 1.0)));
  Tensor g = autograd::grad({sum(y * y)}, {x})[0];
  Tensor xr = x.detach().requires_grad_();
  Tensor gr = autograd::grad({sum((xr * xr + 1.0) * (xr * xr + 1.0))}, {xr})[0];
  EXPECT_TRUE(test::all_close(g, gr, 1e-5, 1e-5));
  // Finite differences in f32 on a few elements.
  for (int64_t i : {0, 17, 90}) {
    Tensor xp = x.detach().clone(), xm = x.detach().clone();
    const double h = 1e-2, v = xp.reshape({-1}).to_vector<float>()[size_t(i)];
    xp.reshape({-1}).narrow(0, i, 1).fill_(v + h), xm.reshape({-1}).narrow(0, i, 1).fill_(v - h);
    const double fd = (sum(call1(op, {xp}) * call1(op, {xp})).item<double>() - sum(call1(op, {xm}) * call1(op, {xm})).item<double>()) / (2 * h);
    EXPECT_NEAR(g.reshape({-1}).to_vector<float>()[size_t(i)], fd, 2e-2 * std::max(1.0, std::fabs(fd))) << i;
  }
}

TEST(UserKernel, WritesInPlaceThroughAViewAndTheCallerSeesIt) {
  ScopedEnv cache("SINTER_CACHE_DIR", fresh_dir("inplace"));
  const OpDef& op = scale_in_place();
  Tensor base = arange(0, 24, 1, DType::f32).reshape({4, 6}), s = full({1}, 3.0);
  Tensor view = base.slice(1, 1, 5, 2);  // columns 1 and 3: strided
  const uint64_t before = base.version();
  NoGradGuard ng;
  Tensor out = call1(op, {view, s});
  EXPECT_EQ(out.storage(), base.storage());
  EXPECT_GT(base.version(), before);
  const std::vector<float> v = base.to_vector<float>();
  for (int64_t i = 0; i < 24; ++i) EXPECT_EQ(v[size_t(i)], (i % 6 == 1 || i % 6 == 3) ? 3.0f * float(i) : float(i)) << i;
}

TEST(UserKernel, ACompiledWriteThroughAViewReachesItsBase) {
  ScopedEnv cache("SINTER_CACHE_DIR", fresh_dir("view_graph"));
  const OpDef& op = scale_in_place();
  // Through a view of an intermediate (read after, through the base) and of the caller's tensor.
  auto fn = [&](const std::vector<Tensor>& in) {
    NoGradGuard ng;
    Tensor b = in[0] + 1.0;
    call1(op, {b.slice(1, 1, 5, 2), in[1]});
    call1(op, {in[2].slice(0, 1, 3), in[1]});
    return std::vector<Tensor>{b * 2.0};
  };
  const Tensor x = arange(0, 24, 1, DType::f32).reshape({4, 6}), s = full({1}, 3.0);
  Tensor caller_eager = arange(0, 12, 1, DType::f32).reshape({4, 3}), caller_compiled = caller_eager.clone();
  const std::vector<Tensor> want = fn({x, s, caller_eager});
  CompiledFunction f = compile(fn, {.fullgraph = true, .name = "view_write"});
  const std::vector<Tensor> got = f({x, s, caller_compiled});
  EXPECT_TRUE(test::bitwise_equal(got[0], want[0]));
  EXPECT_TRUE(test::bitwise_equal(caller_compiled, caller_eager));
  EXPECT_EQ(want[0].to_vector<float>()[1], 2.0f * 3.0f * 2.0f);  // (1 + 1) * 3 * 2: the view's write is seen
  const Explanation e = f.explain({x, s, caller_compiled});
  EXPECT_EQ(e.graphs, 1) << e.text;
  EXPECT_EQ(e.breaks, 0) << e.text;
}

TEST(UserKernel, AnOutOfBoundsWriteIsReportedByAddressSanitizer) {
  if (!test::kAddressSanitizer) GTEST_SKIP() << "needs the AddressSanitizer build (scripts/sanitize.sh, SINTER_SANITIZE=1 scripts/test.sh)";
  ScopedEnv cache("SINTER_CACHE_DIR", fresh_dir("asan"));
  const OpDef& op = find_op("test_one_past_the_end") ? *find_op("test_one_past_the_end") : register_kernel_def({
      .name = "test_one_past_the_end",
      .source = R"(template <class Cfg> void kernel(sinter::In<float> x, auto& y) {
  for (int64_t i = 0; i <= y.numel(); ++i) y[i] = x[0];  // <=: one element too many
})",
      .inputs = {DType::f32},
      .outputs = {DType::f32},
      .shape = same_as_input(0),
  });
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const Tensor x = ones({7, 13});
  EXPECT_DEATH(call1(op, {x}), "heap-buffer-overflow");
}

TEST(UserKernel, CompiledGraphsKeepUserKernelsAsNodesWithTheirEffects) {
  ScopedEnv cache("SINTER_CACHE_DIR", fresh_dir("graph"));
  manual_seed(2);
  const OpDef &sq = square_plus_one(), &scale = scale_in_place();
  // Built-in ops around three user-kernel calls; one writes an intermediate the graph reads after
  // (read after write), one writes the caller's input (the caller reads it afterwards), and one
  // writes a buffer nothing reads afterwards (dropped, and said so).
  auto fn = [&](const std::vector<Tensor>& in) {
    NoGradGuard ng;
    Tensor h = call1(sq, {in[0] * 0.5});
    Tensor t = h * 2.0;
    call1(scale, {t, in[1]});              // t written, read below
    Tensor dead = in[0] + 1.0;
    call1(scale, {dead, in[1]});           // written, never read: dropped
    call1(scale, {in[2], in[1]});          // the caller's tensor, written
    return std::vector<Tensor>{sigmoid(t) + h};
  };
  const Tensor x = randn({8, 5}), s = full({1}, 1.5);
  Tensor target_eager = randn({3, 4}), target_compiled = target_eager.clone();
  const std::vector<Tensor> want = fn({x, s, target_eager});
  CompiledFunction f = compile(fn, {.fullgraph = true, .name = "user_kernels"});
  const std::vector<Tensor> got = f({x, s, target_compiled});
  EXPECT_TRUE(test::bitwise_equal(got[0], want[0]));
  EXPECT_TRUE(test::bitwise_equal(target_compiled, target_eager));  // the write reached the caller
  const Explanation e = f.explain({x, s, target_compiled});
  EXPECT_EQ(e.graphs, 1) << e.text;
  EXPECT_EQ(e.breaks, 0) << e.text;
  int user_calls = 0;
  for (const std::string& l : e.library) user_calls += l.rfind("test_", 0) == 0;
  EXPECT_EQ(user_calls, 3) << e.text;  // sq, the scale of t, the scale of the caller's tensor
  ASSERT_EQ(e.notes.size(), 1u) << e.text;
  EXPECT_NE(e.notes[0].find("dropped test_scale_"), std::string::npos) << e.text;
}

namespace {

// Two configs of deliberately different cost: SLOW = 1 runs a long busy loop first.
const OpDef& two_speeds() {
  if (const OpDef* op = find_op("test_two_speeds")) return *op;
  return register_kernel_def({
      .name = "test_two_speeds",
      .source = R"(template <class Cfg> void kernel(sinter::In<float> x, auto& y) {
  if constexpr (Cfg::SLOW) { volatile double s = 0; for (int i = 0; i < 3000000; ++i) s = s + 1e-9 * i; }
  for (int64_t i = 0; i < y.numel(); ++i) y.store(i, x[i] + float(Cfg::SLOW));
})",
      .inputs = {DType::f32},
      .outputs = {DType::f32},
      .shape = same_as_input(0),
      .configs = {{{"SLOW", 1}}, {{"SLOW", 0}}},
  });
}

// Runs body in a child process (a process of its own: nothing tuned or loaded in memory).
bool in_child(const std::function<bool()>& body) {
  const pid_t pid = fork();
  if (pid == 0) _exit(body() ? 0 : 1);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace

TEST(UserKernel, AutotuningKeepsTheFastestConfigPerKeyBucketOnDisk) {
  const std::string dir = fresh_dir("tune");
  ScopedEnv cache("SINTER_CACHE_DIR", dir);
  const OpDef& op = two_speeds();
  const Tensor x = randn({16, 8});
  // First process: times both configs, keeps the fast one (config 1: x + 0), writes the record.
  EXPECT_TRUE(in_child([&] {
    const bool right = test::bitwise_equal(call1(op, {x}), x + 0.0);
    const std::vector<TunedChoice> t = tuned_choices("test_two_speeds");
    return right && t.size() == 1 && t[0].config == 1 && t[0].ms.size() == 2 && t[0].ms[0] > t[0].ms[1];
  }));
  // A second process reads the choice back without timing (no times measured); a new key bucket
  // (another size) is timed.
  EXPECT_TRUE(in_child([&] {
    const bool right = test::bitwise_equal(call1(op, {x}), x + 0.0);
    std::vector<TunedChoice> t = tuned_choices("test_two_speeds");
    const bool reused = t.size() == 1 && t[0].config == 1 && t[0].ms.empty();
    (void)call1(op, {randn({64, 8})});
    t = tuned_choices("test_two_speeds");
    return right && reused && t.size() == 2 && (t[0].ms.size() == 2 || t[1].ms.size() == 2);
  }));
  // A corrupt record is ignored (the bucket is timed again) and written anew.
  std::string record;
  for (auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("tune-test_two_speeds", 0) == 0) record = e.path().string();
  ASSERT_FALSE(record.empty());
  std::ofstream(record) << "16,8 garbage\n";
  EXPECT_TRUE(in_child([&] {
    (void)call1(op, {x});
    const std::vector<TunedChoice> t = tuned_choices("test_two_speeds");
    return t.size() == 1 && t[0].ms.size() == 2 && t[0].config == 1;
  }));
  std::ifstream f(record);
  std::string line;
  std::getline(f, line);
  EXPECT_EQ(line, "16,8 1");
}

TEST(UserKernel, ErrorsNameTheKernelItsShapesAndTheSourceLines) {
  ScopedEnv cache("SINTER_CACHE_DIR", fresh_dir("errors"));
  const std::string file = fresh_dir("errors_src") + "/broken_kernel.cpp";
  std::ofstream(file) << "template <class Cfg> void kernel(sinter::In<float> x, auto& y) {\n"
                         "  for (int64_t i = 0; i < y.numel(); ++i)\n"
                         "    y.store(i, x[i] + undeclared_name);\n"
                         "}\n";
  const OpDef& broken = register_kernel_def({.name = "test_broken", .source_file = file, .inputs = {DType::f32},
                                             .outputs = {DType::f32}, .shape = same_as_input(0)});
  try {
    (void)call1(broken, {randn({4})});
    ADD_FAILURE() << "a kernel that does not compile ran";
  } catch (const CompileError& e) {
    EXPECT_NE(std::string(e.what()).find("broken_kernel.cpp:3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("undeclared_name"), std::string::npos) << e.what();
  }
  // The shape function refusing a call names the kernel and the shapes; so does a wrong dtype.
  const OpDef& rows = register_kernel_def({
      .name = "test_rows",
      .source = "template <class Cfg> void kernel(sinter::In<float> x, auto& y) {}",
      .inputs = {DType::f32},
      .outputs = {DType::f32},
      .shape = [](std::span<const TensorMeta> in, const Attrs&) {
        SINTER_CHECK_SHAPE(in[0].shape.size() == 2, "needs a matrix");
        return std::vector<TensorMeta>{{{in[0].shape[0]}, DType::f32, {}}};
      },
  });
  try {
    (void)call1(rows, {randn({2, 3, 4})});
    ADD_FAILURE() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("[test_rows] the shape function refused inputs f32(2, 3, 4)"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(test::throws_naming("test_rows", [&] { (void)call1(rows, {randn({2, 3}).to(DType::f64)}); }));
  EXPECT_TRUE(test::throws_naming("test_rows_bad", [&] {
    register_kernel_def({.name = "test_rows_bad", .source = "x", .inputs = {DType::u8}, .outputs = {DType::f32}, .shape = same_as_input(0)});
  }));
}

TEST(UserKernel, ElementwiseConsumersOfAPointwiseOutputRunInsideItsStore) {
  ScopedEnv cache("SINTER_CACHE_DIR", fresh_dir("epilogue"));
  manual_seed(3);
  const OpDef& swiglu = find_op("test_swiglu") ? *find_op("test_swiglu") : register_kernel_def({
      .name = "test_swiglu",
      .source = R"(template <class Cfg> void kernel(sinter::In<float> g, sinter::In<float> u, auto& y) {
  for (int64_t i = 0; i < y.numel(); ++i) y.store(i, sinter::fn::Silu{}(g[i]) * u[i]);
})",
      .inputs = {DType::f32, DType::f32},
      .outputs = {DType::f32},
      .shape = same_as_input(0),
      .pointwise = {true},
  });
  // The kernel's output scaled, a bias of its last dim added, a residual of its shape added: all in
  // the kernel's store(); the result equals eager's bit for bit (the same functors, in order).
  auto fn = [&](const std::vector<Tensor>& in) {
    Tensor y = call1(swiglu, {in[0], in[1]});
    return std::vector<Tensor>{y * 0.5 + in[2] + in[3]};
  };
  const std::vector<Tensor> in{randn({6, 16}), randn({6, 16}), randn({16}), randn({6, 16})};
  CompiledFunction f = compile(fn, {.fullgraph = true, .name = "swiglu_epilogue"});
  EXPECT_TRUE(test::bitwise_equal(f(in)[0], fn(in)[0]));
  const Explanation e = f.explain(in);
  EXPECT_EQ(e.fused_kernels, 0) << e.text;
  ASSERT_EQ(e.library.size(), 1u) << e.text;
  EXPECT_EQ(e.library[0], "test_swiglu -> mul -> add -> add") << e.text;
  // Off with the epilogue passes: the same result from the kernel and a fused elementwise kernel.
  ScopedEnv off("SINTER_COMPILE_DISABLE", "epilogues");
  CompiledFunction plain = compile(fn, {.fullgraph = true, .name = "swiglu_plain"});
  EXPECT_TRUE(test::bitwise_equal(plain(in)[0], fn(in)[0]));
  EXPECT_EQ(plain.explain(in).fused_kernels, 1);
}

TEST(UserKernel, AnOutputThatAliasesAnInputSharesItsBuffer) {
  ScopedEnv cache("SINTER_CACHE_DIR", fresh_dir("alias"));
  // Returns its input as a flat vector (its buffer, unwritten) and a fresh sum of it.
  const OpDef& op = find_op("test_flat_and_sum") ? *find_op("test_flat_and_sum") : register_kernel_def({
      .name = "test_flat_and_sum",
      .source = R"(template <class Cfg> void kernel(sinter::In<float> x, auto& flat, auto& total) {
  float s = 0;
  for (int64_t i = 0; i < flat.numel(); ++i) s += flat[i];
  total.store(0, s);
})",
      .inputs = {DType::f32},
      .outputs = {DType::f32, DType::f32},
      .shape = [](std::span<const TensorMeta> in, const Attrs&) {
        return std::vector<TensorMeta>{{{in[0].shape.numel()}, DType::f32, {}}, {{}, DType::f32, {}}};
      },
      .effects = {Effect::aliases(0), Effect::fresh()},
  });
  const Tensor x = arange(0, 12, 1, DType::f32).reshape({3, 4});
  const std::vector<Tensor> out = call(op, {x});
  EXPECT_EQ(out[0].storage(), x.storage());
  EXPECT_EQ(out[0].shape(), Shape({12}));
  EXPECT_EQ(out[1].item<float>(), 66.0f);
  auto fn = [&](const std::vector<Tensor>& in) {
    const std::vector<Tensor> r = call(op, {in[0] + 1.0});
    return std::vector<Tensor>{r[0] * 2.0, r[1]};
  };
  CompiledFunction f = compile(fn, {.fullgraph = true, .name = "alias"});
  const std::vector<Tensor> got = f({x}), want = fn({x});
  EXPECT_TRUE(test::bitwise_equal(got[0], want[0]));
  EXPECT_TRUE(test::bitwise_equal(got[1], want[1]));
}

// The op table as the one door to every kernel: a whole training step and a generation step run
// with every computation inside an op call, and trace to the same list of op calls; a second
// device's kernel is found by (op, device); attributes compare and hash by value.
#include <sinter/train.h>

#include "core/parallel.h"
#include "test_util.h"

using namespace sinter;

namespace {

// Records the name of every top-level op call; traces (symbolic outputs) when asked.
struct Recorder : OpObserver {
  explicit Recorder(bool trace) : trace(trace) {}
  bool tracing() const override { return trace; }
  void after(const OpDef& op, std::span<const Tensor>, const Attrs&, std::span<const Tensor>) override {
    calls.push_back(op.name);
  }
  bool trace;
  std::vector<std::string> calls;
};

std::unique_ptr<nn::GPT> default_model() {
  auto m = std::make_unique<nn::GPT>(nn::ModelConfig::preset("tiny"));
  m->init_weights(3);
  return m;
}

bool contains(const std::vector<std::string>& v, const std::string& s) { return std::find(v.begin(), v.end(), s) != v.end(); }

}  // namespace

TEST(OpTable, ATrainingStepRunsEntirelyInsideOpsAndTracesToTheSameCalls) {
  manual_seed(1);
  const auto data = data::ByteDataset::from_text(std::string(4000, 'a') + "the quick brown fox jumps over the lazy dog", "t");
  auto [x, y] = data.batch(true, 2, 16, 1, 0);
  auto eager_model = default_model(), traced_model = default_model();
  optim::AdamW eager_opt(eager_model->named_parameters(), 1e-3, 0.9, 0.95, 1e-8, 0.1);
  optim::AdamW traced_opt(traced_model->named_parameters(), 1e-3, 0.9, 0.95, 1e-8, 0.1);

  Recorder eager(false);
  kernel_entries() = {};
  {
    ObserveScope scope(&eager);
    (void)train::step(*eager_model, eager_opt, x, y);
  }
  const KernelEntries entries = kernel_entries();
  EXPECT_GT(entries.total, 100);
  EXPECT_EQ(entries.outside_ops, 0) << "a computation of the step ran outside every op call";

  Recorder traced(true);
  kernel_entries() = {};
  Tensor loss;
  {
    ObserveScope scope(&traced);
    loss = train::step(*traced_model, traced_opt, Tensor::symbolic(x.shape(), x.dtype()), Tensor::symbolic(y.shape(), y.dtype()));
  }
  EXPECT_EQ(kernel_entries().total, 0) << "tracing ran a kernel";
  EXPECT_TRUE(loss.is_symbolic());
  EXPECT_EQ(traced.calls, eager.calls);
  for (const char* op : {"embedding", "layer_norm", "linear", "sdpa", "cross_entropy", "cross_entropy_backward",
                         "sdpa_flash_backward", "sum_squares", "mul_", "adamw_update"})
    EXPECT_TRUE(contains(eager.calls, op)) << op;
  // The trace read the parameters and wrote none of them.
  for (auto& [name, p] : traced_model->named_parameters()) EXPECT_FALSE(p->is_symbolic()) << name;
  EXPECT_TRUE(test::all_close(traced_model->forward(x), default_model()->forward(x), 0, 0));
}

TEST(OpTable, AGenerationStepRunsEntirelyInsideOpsAndTracesToTheSameCalls) {
  manual_seed(2);
  auto model = default_model();
  model->eval();
  NoGradGuard no_grad;
  std::vector<nn::KVCache> eager_caches = model->make_caches(1, 32), traced_caches = model->make_caches(1, 32);
  const Tensor prompt = tensor<int64_t>({5, 9, 13, 2}).reshape({1, 4});
  (void)model->forward(prompt, &eager_caches);
  (void)model->forward(prompt, &traced_caches);
  const Tensor token = tensor<int64_t>({7}).reshape({1, 1});
  auto step = [&](std::vector<nn::KVCache>& caches) {
    Tensor logits = model->forward(token, &caches);
    return argmax(logits.select(1, 0), -1);
  };
  Recorder eager(false), traced(true);
  kernel_entries() = {};
  {
    ObserveScope scope(&eager);
    (void)step(eager_caches);
  }
  EXPECT_EQ(kernel_entries().outside_ops, 0);
  EXPECT_GT(kernel_entries().total, 20);
  {
    ObserveScope scope(&traced);
    EXPECT_TRUE(step(traced_caches).is_symbolic());
  }
  EXPECT_EQ(traced.calls, eager.calls);
  EXPECT_TRUE(contains(eager.calls, "kv_append_"));  // the KV cache writes are ops too
  EXPECT_TRUE(contains(eager.calls, "sdpa"));
}

TEST(OpTable, DispatchesByDeviceToTheRegisteredKernel) {
  // A device from outside the library: host memory behind the `external` slot, one kernel.
  register_allocator(DeviceType::external, {[](int64_t n, int) { return std::aligned_alloc(64, size_t((n + 63) / 64 * 64 + 64)); },
                                            [](void* p, int64_t, int) { std::free(p); }});
  static int calls = 0;
  register_kernel("add", DeviceType::external, [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
    ++calls;
    const float *a = in[0].data<float>(), *b = in[1].data<float>();
    float* o = out[0].data<float>();
    for (int64_t i = 0; i < out[0].numel(); ++i) o[i] = a[i] + b[i];
  });
  const Device ext{DeviceType::external, 0};
  Tensor a = Tensor::empty({2, 3}, DType::f32, ext), b = Tensor::empty({2, 3}, DType::f32, ext);
  for (int64_t i = 0; i < 6; ++i) a.data<float>()[i] = float(i), b.data<float>()[i] = 10.0f * float(i);
  Tensor c = add(a, b);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(c.device(), ext);
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(c.data<float>()[i], 11.0f * float(i));
  // An op with no kernel for the device, mixed devices, and symbolic tensors of the device.
  EXPECT_TRUE(test::throws_naming("mul", [&] { (void)mul(a, b); }));
  try {
    (void)mul(a, b);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no kernel for device external:0"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(test::throws_naming("add", [&] { (void)add(a, ones({2, 3})); }));
  Tensor s = mul(Tensor::symbolic({2, 3}, DType::f32, ext), Tensor::symbolic({3}, DType::f32, ext));
  EXPECT_TRUE(s.is_symbolic());
  EXPECT_EQ(s.device(), ext);
  EXPECT_EQ(calls, 1);
}

TEST(OpTable, AttributesCompareAndHashByValue) {
  const Attrs a{{"dims", Shape{1, 2}}, {"keepdim", true}, {"eps", 1e-5}, {"name", std::string("x")}};
  Attrs b{{"dims", Shape{1, 2}}, {"keepdim", true}, {"eps", 1e-5}, {"name", std::string("x")}};
  EXPECT_TRUE(a == b);
  EXPECT_EQ(a.hash(), b.hash());
  b.set("eps", 2e-5);
  EXPECT_FALSE(a == b);
  EXPECT_NE(a.hash(), b.hash());
  const Attrs c{{"dims", Shape{2, 1}}, {"keepdim", true}, {"eps", 1e-5}, {"name", std::string("x")}};
  EXPECT_NE(a.hash(), c.hash());
  EXPECT_NE(Attrs({{"n", int64_t(1)}}).hash(), Attrs({{"n", 1.0}}).hash());  // an int and a float differ
  EXPECT_NE(Attrs({{"d", Device{}}}).hash(), Attrs({{"d", Device{DeviceType::external, 0}}}).hash());
}

TEST(OpTable, SchemaDeclaresMutationAndDataDependence) {
  EXPECT_EQ(get_op("add_").mutates, 1u);
  EXPECT_EQ(get_op("adamw_update").mutates, 0b1101u);
  EXPECT_TRUE(get_op("item").data_dependent);
  EXPECT_FALSE(get_op("add").data_dependent);
  for (const OpDef* op : all_ops())  // ops that write their inputs give no gradient
    if (op->mutates) {
      EXPECT_FALSE(op->backward) << op->name;
    }
}

// Multi-rank tests: ctest runs this binary under `mpirun -np 2`, `-np 3` and `-np 4`, one job at a
// time. Every rank runs every test; each checks its own results against what a single process
// computes from the same seeds, and a failure on any rank fails the job.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "sinter/dist.h"
#include "sinter/sinter.h"
#include "sinter/train.h"
#include "core/allocator.h"
#include "test_util.h"

using namespace sinter;
using namespace sinter::dist;

namespace {

// The tensor rank r contributes, the same on every process that asks.
Tensor rank_tensor(int r, const Shape& s) {
  manual_seed(1000 + uint64_t(r));
  return randn(s);
}

::testing::AssertionResult same(const Tensor& a, const Tensor& b, double tol = 1e-6) {
  if (a.shape() != b.shape()) return ::testing::AssertionFailure() << "shapes " << a.shape() << " vs " << b.shape();
  return test::all_close(a, b.to_vector<double>(), tol, tol);
}

std::vector<Placement> all_placements() {
  return {Placement::Shard(0), Placement::Shard(1), Placement::Replicate(), Placement::Partial()};
}

std::string describe(const Placements& p) {
  std::string s = "[";
  for (size_t i = 0; i < p.size(); ++i) s += (i ? ", " : "") + p[i].to_string();
  return s + "]";
}

// distribute_tensor, but Partial pieces are not the value-plus-zeros split: every rank holds a
// nonzero share, so a reduction that skipped a rank would show.
DTensor distribute_spread(const Tensor& full, const DeviceMesh& mesh, const Placements& p) {
  DTensor d = distribute_tensor(full, mesh, p);
  Tensor local = d.to_local();
  manual_seed(77);
  Tensor noise = randn(full.shape());
  Placements no_partial = p;
  for (auto& q : no_partial) if (q.is_partial()) q = Placement::Replicate();
  Tensor piece = distribute_tensor(noise, mesh, no_partial).to_local();
  for (int64_t i = 0; i < mesh.ndim(); ++i) {
    if (!p[size_t(i)].is_partial()) continue;
    const double w = mesh.coordinate(i) == 0 ? -double(mesh.size(i) - 1) : 1.0;
    local = local + piece * w;
  }
  return DTensor(local.contiguous(), mesh, p, full.shape());
}

std::vector<std::vector<std::pair<std::string, int64_t>>> meshes_2d(int n) {
  std::vector<std::vector<std::pair<std::string, int64_t>>> out;
  for (int a = 1; a <= n; ++a)
    if (n % a == 0) out.push_back({{"a", a}, {"b", n / a}});
  return out;
}

// Every pair of placements on `mesh`, for an even and an uneven shape: the redistributed tensor
// holds the right piece and the right whole, and its gradient (of a loss every rank computes on
// the whole tensor) comes back to the source in the source's layout.
void check_every_pair(const DeviceMesh& mesh) {
  std::vector<Placements> all;
  if (mesh.ndim() == 1) {
    for (auto& p : all_placements()) all.push_back({p});
  } else {
    for (auto& p : all_placements())
      for (auto& q : all_placements()) all.push_back({p, q});
  }
  for (const Shape& shape : {Shape{4, 6}, Shape{5, 3}}) {
    manual_seed(5);
    const Tensor full = randn(shape), weight = randn(shape);
    for (const Placements& src : all)
      for (const Placements& dst : all) {
        SCOPED_TRACE(mesh.to_string() + " " + describe(src) + " -> " + describe(dst) + " shape " +
                     ::testing::PrintToString(std::vector<int64_t>(shape.begin(), shape.end())));
        DTensor a = distribute_spread(full, mesh, src);
        Tensor leaf = a.to_local().detach().requires_grad_();
        DTensor b = DTensor(leaf, mesh, src, shape).redistribute(dst);
        ASSERT_EQ(b.shape(), shape);
        bool has_partial = false;
        for (auto& q : dst) has_partial = has_partial || q.is_partial();
        if (!has_partial) {
          EXPECT_TRUE(same(b.to_local(), distribute_tensor(full, mesh, dst).to_local()));
        }
        Tensor whole = b.full_tensor();
        EXPECT_TRUE(same(whole, full, 1e-5));
        sum(whole * weight).backward();
        Placements grad_layout = src;
        for (auto& q : grad_layout) if (q.is_partial()) q = Placement::Replicate();
        ASSERT_TRUE(leaf.grad().defined());
        EXPECT_TRUE(same(leaf.grad(), distribute_tensor(weight, mesh, grad_layout).to_local(), 1e-5));
      }
  }
}

}  // namespace

TEST(Collectives, MatchWhatOneProcessComputesFromEveryRanksInput) {
  auto w = world();
  const int n = w->size(), r = w->rank();
  // all_reduce: sum, avg, max
  Tensor expect_sum = zeros({3, 5}), expect_max = full({3, 5}, -1e30);
  for (int q = 0; q < n; ++q) expect_sum = expect_sum + rank_tensor(q, {3, 5}), expect_max = maximum(expect_max, rank_tensor(q, {3, 5}));
  EXPECT_TRUE(same(all_reduce(rank_tensor(r, {3, 5}), *w), expect_sum, 1e-5));
  EXPECT_TRUE(same(all_reduce(rank_tensor(r, {3, 5}), *w, ReduceOp::avg), expect_sum / double(n), 1e-5));
  EXPECT_TRUE(same(all_reduce(rank_tensor(r, {3, 5}), *w, ReduceOp::max), expect_max));
  // all_gather along dim 1 with uneven pieces (rank q holds q + 1 columns)
  std::vector<int64_t> sizes;
  std::vector<Tensor> pieces;
  for (int q = 0; q < n; ++q) sizes.push_back(q + 1), pieces.push_back(rank_tensor(q, {2, q + 1}));
  EXPECT_TRUE(same(all_gather(rank_tensor(r, {2, r + 1}), *w, 1, sizes), cat(pieces, 1)));
  // reduce_scatter: rank r gets its block of the sum
  const int64_t total = n * (n + 1) / 2;
  Tensor rs_sum = zeros({total, 2});
  for (int q = 0; q < n; ++q) rs_sum = rs_sum + rank_tensor(q, {total, 2});
  EXPECT_TRUE(same(reduce_scatter(rank_tensor(r, {total, 2}), *w, 0, sizes), rs_sum.narrow(0, r * (r + 1) / 2, r + 1), 1e-5));
  // all_to_all: block j of rank q's rows goes to rank j, stacked along dim 1 in rank order
  std::vector<Tensor> got;
  for (int q = 0; q < n; ++q) got.push_back(rank_tensor(q, {2 * n, 3}).narrow(0, 2 * r, 2));
  EXPECT_TRUE(same(all_to_all(rank_tensor(r, {2 * n, 3}), *w, 0, 1), cat(got, 1)));
  // broadcast from the last rank
  EXPECT_TRUE(same(broadcast(rank_tensor(r, {4}), *w, n - 1), rank_tensor(n - 1, {4})));
  w->barrier().wait();
}

TEST(Collectives, CountBytesAsARingMovesThem) {
  auto w = world();
  const int64_t n = w->size();
  w->reset_traffic();
  Tensor x = zeros({n * 100});  // 400 n bytes
  all_reduce(x, *w);
  EXPECT_EQ(w->traffic().bytes, 2 * (n - 1) * 400 * n / n);
  w->reset_traffic();
  all_gather(zeros({100}), *w, 0, std::vector<int64_t>(size_t(n), 100));
  EXPECT_EQ(w->traffic().bytes, (n - 1) * 400 * n / n);
  w->reset_traffic();
  reduce_scatter(x, *w, 0, std::vector<int64_t>(size_t(n), 100));
  EXPECT_EQ(w->traffic().bytes, (n - 1) * 400 * n / n);
  EXPECT_EQ(w->traffic().calls, 1);
}

TEST(Collectives, GradientsFollowTheirAdjoints) {
  // Each rank's loss is its own term (grad_partial): the gradient of an all-gathered input is the
  // sum over ranks of their gradients of its block, i.e. a reduce_scatter.
  auto w = world();
  const int n = w->size(), r = w->rank();
  Tensor x = rank_tensor(r, {3, 2}).requires_grad_();
  std::vector<int64_t> sizes(size_t(n), 3);
  Tensor g = all_gather(x, *w, 0, sizes, /*grad_partial=*/true);
  sum(g * rank_tensor(100 + r, {3 * n, 2})).backward();
  Tensor expect = zeros({3, 2});
  for (int q = 0; q < n; ++q) expect = expect + rank_tensor(100 + q, {3 * n, 2}).narrow(0, 3 * r, 3);
  EXPECT_TRUE(same(x.grad(), expect, 1e-5));
  // copy_to_group: identity forward, gradients summed.
  Tensor y = rank_tensor(7, {4}).requires_grad_();
  sum(copy_to_group(y, *w) * double(r + 1)).backward();
  EXPECT_TRUE(same(y.grad(), full({4}, double(n * (n + 1) / 2))));
}

TEST(DeviceMesh, LaysRanksOutRowMajorWithAGroupPerDimension) {
  const int n = world_size();
  for (auto& dims : meshes_2d(n)) {
    DeviceMesh mesh(dims);
    const int64_t b = mesh.size(1);
    EXPECT_EQ(mesh.coordinate(0), rank() / b);
    EXPECT_EQ(mesh.coordinate(1), rank() % b);
    // The ranks of my "b" group are the consecutive world ranks of my row.
    Tensor me = full({1}, double(rank()), DType::i64);
    Tensor row = all_gather(me, mesh.group(1), 0, std::vector<int64_t>(size_t(b), 1));
    for (int64_t j = 0; j < b; ++j) EXPECT_EQ(row.data<int64_t>()[j], mesh.coordinate(0) * b + j);
    Tensor col = all_gather(me, mesh.group(0), 0, std::vector<int64_t>(size_t(mesh.size(0)), 1));
    for (int64_t i = 0; i < mesh.size(0); ++i) EXPECT_EQ(col.data<int64_t>()[i], i * b + mesh.coordinate(1));
    EXPECT_EQ(mesh["b"].size(0), b);
  }
  EXPECT_THROW(DeviceMesh({{"x", n + 1}}), DistError);
}

TEST(DTensor, RedistributesBetweenEveryPairOfPlacementsOn1DMesh) {
  check_every_pair(DeviceMesh({{"x", world_size()}}));
}

TEST(DTensor, RedistributesBetweenEveryPairOfPlacementsOn2DMeshes) {
  for (auto& dims : meshes_2d(world_size())) check_every_pair(DeviceMesh(dims));
}

TEST(DTensor, FromLocalFindsTheGlobalShapeOfUnevenShards) {
  const int n = world_size();
  DeviceMesh mesh({{"x", n}});
  const int64_t length = 2 * n - 1;  // torch.chunk's blocks of 2, the last one short
  const int64_t mine = shard_range(length, n, rank()).second;
  DTensor d = DTensor::from_local(zeros({mine, 2}), mesh, {Placement::Shard(0)});
  EXPECT_EQ(d.shape(), (Shape{length, 2}));
  // Pieces that do not follow the rule are refused, naming the rank and what was expected.
  EXPECT_THROW(DTensor::from_local(zeros({rank() == 0 ? 0 : 2, 2}), mesh, {Placement::Shard(0)}), DistError);
  EXPECT_THROW(DTensor(zeros({3, 2}), mesh, {Placement::Shard(0)}, Shape{3 * n + 5, 2}), DistError);
}

// ---- 2-D parallel training against one process ----

std::string g_job_dir;  // removed at exit
std::string job_dir() {  // one folder per job, named by rank 0's pid
  static std::string dir = [] {
    Tensor pid = broadcast(full({1}, double(::getpid()), DType::i64), *world(), 0);
    std::string d = (std::filesystem::temp_directory_path() / ("sinter_dist_" + std::to_string(pid.item<int64_t>()))).string();
    std::filesystem::create_directories(d);
    return g_job_dir = d;
  }();
  return dir;
}

train::Options parity_options(const std::string& out) {
  train::Options o;
  // Batch 12 splits over dp = 2, 3 and 4.
  o.steps = 20, o.batch = 12, o.out_dir = out, o.quiet = true, o.val_every = 1000, o.val_batches = 1, o.save_every = 1000;
  return o;
}

// The single-process run, once per job: rank 0 trains, everyone reads its losses and checkpoint.
const std::vector<double>& reference_losses() {
  static std::vector<double> losses = [] {
    const std::string out = job_dir() + "/reference";
    Tensor l = zeros({20}, DType::f64);
    if (rank() == 0) {
      train::Result r = train::run(parity_options(out));
      for (size_t i = 0; i < r.losses.size(); ++i) l.data<double>()[i] = r.losses[i];
    }
    l = broadcast(l, *world(), 0);  // its deadline covers rank 0's 20 steps
    return l.to_vector<double>();
  }();
  return losses;
}

// Bytes one rank sends in a training step of the default GPT-2 model, by the ring convention of
// Traffic. t = tp, d = dp, N = (B / d) T rows, A = N C 4 bytes of activations; P_local = the
// parameters a tp rank holds. TP: an all_reduce of A after the embedding, after o_proj and mlp.proj
// of every block (forward), at the shared input of q/k/v and of fc and at the head's input
// (backward): 4 L + 2; plus three of N floats in loss_parallel. FSDP: every parameter all-gathered
// once for the forward, once more for the backward (resharded after the forward: all but the
// LayerNorm biases, which no backward formula reads: 2 L + 1 vectors of C), and its gradient
// reduce-scattered once. Plus the gradient norm (8 bytes over the world) and the reported loss
// (8 bytes over dp).
// With sequence parallelism each block's two all_reduces per direction become an all_gather and a
// reduce_scatter (the same bytes); the embedding's all_reduce stays, the split into sequence slices
// all-gathers its gradient, the head all-gathers its input (and reduce-scatters the gradient), and
// the replicated parameters used on slices (LayerNorm weights and biases, row-parallel biases:
// 6 per block, 2 for the final norm) have their gradients all-reduced.
double analytic_step_bytes(const nn::ModelConfig& c, int64_t B, int64_t T, int64_t t, int64_t d, bool sp = false) {
  auto ar = [](int64_t n, double bytes) { return n > 1 ? 2.0 * double(n - 1) / double(n) * bytes : 0.0; };
  const double C = double(c.hidden_size), F = double(c.intermediate_size), V = double(c.vocab_size),
               P = double(c.max_position_embeddings), L = double(c.num_hidden_layers);
  const double N = double(B / d) * double(T), A = N * C * 4;
  const double sharded = V * C + L * (4 * C * C + 3 * C + 2 * C * F + F);  // split over tp
  const double replicated = P * C + L * (4 * C + 2 * C) + 2 * C;           // norms, pos_emb, row-parallel biases
  const double p_local = sharded / double(t) + replicated;
  const double gather = t > 1 ? double(t - 1) / double(t) * A : 0.0;  // one all_gather or reduce_scatter of A
  const double tp_bytes = sp ? 8 * L * gather + ar(t, A) + 3 * gather + ar(t, N * 4) * 3 + (6 * L + 2) * ar(t, 4 * C)
                             : ar(t, A) * (4 * L + 2) + ar(t, N * 4) * 3;
  const double read_by_backward = p_local - (2 * L + 1) * C;
  const double fsdp_bytes = d > 1 ? double(d - 1) / double(d) * (2 * p_local + read_by_backward) * 4 : 0.0;
  return tp_bytes + fsdp_bytes + ar(t * d, 8) + ar(d, 8);
}

TEST(Parallel, TrainingMatchesOneProcessStepByStepAndCountsItsBytes) {
  const int n = world_size();
  struct Layout {
    int64_t tp, dp;
    bool sp;
  };
  std::vector<Layout> layouts;
  if (4 % n == 0) layouts.push_back({n, 1, false}), layouts.push_back({n, 1, true});  // 4 heads split over tp
  layouts.push_back({1, n, false});
  if (n == 4) layouts.push_back({2, 2, false}), layouts.push_back({2, 2, true});
  const std::vector<double>& ref = reference_losses();
  for (auto [tp, dp, sp] : layouts) {
    const std::string name = "tp=" + std::to_string(tp) + (sp ? " (sp)" : "") + " dp=" + std::to_string(dp);
    SCOPED_TRACE(name);
    const std::string out = job_dir() + "/tp" + std::to_string(tp) + "_dp" + std::to_string(dp) + (sp ? "_sp" : "");
    train::Options o = parity_options(out);
    o.tp = tp, o.dp = dp, o.sequence_parallel = sp;
    train::Result r = train::run(o);
    ASSERT_EQ(r.losses.size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i)
      EXPECT_NEAR(r.losses[i], ref[i], 1e-5 * std::abs(ref[i])) << "step " << i + 1;
    // The same final weights: rank 0 wrote the gathered model; compare it with the reference's.
    world()->barrier().wait();
    auto got = load_sharded(out, "model");  // every rank's pieces, reassembled
    auto want = io::load_safetensors(job_dir() + "/reference/model.safetensors").tensors;
    ASSERT_EQ(got.size(), want.size());
    // Error measure: max |got - want| / max(max |want|, 1): relative for weights at unit scale,
    // absolute for small ones (k_proj's bias has a zero gradient in exact arithmetic, so AdamW
    // turns rounding noise into its updates: ~1e-6 either way).
    double worst = 0;
    std::string worst_name;
    for (auto& [name, w] : want) {
      ASSERT_TRUE(got.count(name)) << name;
      const double err = max(abs(got[name] - w)).item_double() / std::max(max(abs(w)).item_double(), 1.0);
      if (err > worst) worst = err, worst_name = name;
    }
    EXPECT_LE(worst, 1e-5) << worst_name;
    // Bytes per step, against the formula (the README states it).
    const double expect = analytic_step_bytes(nn::ModelConfig::preset("tiny"), o.batch, o.seq_len, tp, dp, sp);
    for (size_t i = 0; i < r.step_bytes.size(); ++i)
      EXPECT_NEAR(double(r.step_bytes[i]), expect, 0.01 * expect) << "step " << i + 1;
    if (rank() == 0)
      std::printf("  %s: final loss %.6f (one process %.6f), weights within %.1e (%s), %lld bytes/step sent by "
                  "rank 0 (formula %.0f)\n",
                  name.c_str(), r.losses.back(), ref.back(), worst, worst_name.c_str(), (long long)r.step_bytes.back(), expect);
  }
}

// Micro-batches and checkpointed activations under tensor parallelism and FSDP: each rank's rows
// run in parts whose gradients add up (through the sharded leaves) to the one-process step's, and
// each block's backward recomputes its forward, collectives included.
TEST(Parallel, GradientAccumulationAndCheckpointedActivationsMatchOneProcess) {
  const int n = world_size();
  std::vector<std::array<int64_t, 3>> layouts{{1, n, (12 / n) % 2 == 0 ? 2 : 3}};  // tp, dp, grad_accum
  if (4 % n == 0) layouts.push_back({n, 1, 2});
  const std::vector<double>& ref = reference_losses();
  for (auto [tp, dp, accum] : layouts) {
    SCOPED_TRACE("tp=" + std::to_string(tp) + " dp=" + std::to_string(dp) + " grad_accum=" + std::to_string(accum));
    const std::string out = job_dir() + "/accum_tp" + std::to_string(tp) + "_dp" + std::to_string(dp);
    train::Options o = parity_options(out);
    o.tp = tp, o.dp = dp, o.grad_accum = accum, o.checkpoint_activations = true;
    const train::Result r = train::run(o);
    ASSERT_EQ(r.losses.size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(r.losses[i], ref[i], 1e-5 * std::abs(ref[i])) << "step " << i + 1;
    world()->barrier().wait();
    auto got = load_sharded(out, "model");
    for (auto& [name, w] : io::load_safetensors(job_dir() + "/reference/model.safetensors").tensors) {
      ASSERT_TRUE(got.count(name)) << name;
      EXPECT_LE(max(abs(got[name] - w)).item_double() / std::max(max(abs(w)).item_double(), 1.0), 1e-5) << name;
    }
  }
}

TEST(Parallel, LlamaStyleModelsMatchOneProcessToo) {
  // GQA (4 query heads on 2 key/value heads), RoPE, RMSNorm under SequenceParallel, SwiGLU and an
  // untied head (column-parallel into loss_parallel): tp = 2 with sequence parallelism where the
  // job's size allows (2 key/value heads split over 2 only), the rest FSDP.
  const int n = world_size();
  const int64_t tp = n % 2 == 0 ? 2 : 1;
  auto options = [](const std::string& out) {
    train::Options o;
    o.preset = "llama-tiny", o.steps = 5, o.batch = 12, o.out_dir = out, o.quiet = true, o.val_every = 1000, o.val_batches = 1;
    return o;
  };
  const std::string dir = job_dir();  // collective on first use: every rank, before rank 0 goes alone
  Tensor ref = zeros({5}, DType::f64);
  if (rank() == 0) {
    train::Result r = train::run(options(dir + "/llama_ref"));
    for (size_t i = 0; i < r.losses.size(); ++i) ref.data<double>()[i] = r.losses[i];
  }
  const std::vector<double> want = broadcast(ref, *world(), 0).to_vector<double>();
  train::Options o = options(dir + "/llama_par");
  o.tp = tp, o.dp = n / tp, o.sequence_parallel = tp > 1;
  train::Result r = train::run(o);
  ASSERT_EQ(r.losses.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(r.losses[i], want[i], 1e-5 * want[i]) << "step " << i + 1;
}

TEST(FSDP, FreesGatheredWeightsAfterTheForwardAndGathersThemAgainForTheBackward) {
  const int n = world_size();
  DeviceMesh mesh({{"dp", n}});
  const nn::ModelConfig cfg = nn::ModelConfig::preset("tiny");
  manual_seed(8);
  Tensor x = randint(0, 256, {2, 32}), y = randint(0, 256, {2, 32});
  std::vector<std::map<std::string, Tensor>> grads;
  std::vector<int64_t> held;
  for (bool reshard : {false, true}) {
    nn::GPT model(cfg);
    model.init_weights(5);
    fully_shard_gpt(model, mesh["dp"], reshard);
    const int64_t before = cpu_live_bytes();
    const FSDPStats s0 = fsdp_stats();
    Tensor logits = model.forward(x);
    // Every parameter gathered once; all but the root unit's were started by the unit before.
    const int64_t params = int64_t(model.named_parameters().size());
    const int64_t root_params = params - int64_t(cfg.num_hidden_layers) * int64_t(model.blocks[0]->named_parameters().size());
    EXPECT_EQ(fsdp_stats().forward - s0.forward, params);
    EXPECT_EQ(fsdp_stats().prefetched - s0.prefetched, params - root_params);
    held.push_back(cpu_live_bytes() - before);
    if (reshard) {
      EXPECT_EQ(fsdp_gathered_bytes(), 0);
    }
    const FSDPStats s1 = fsdp_stats();
    cross_entropy(logits.reshape({-1, 256}), y.reshape({-1})).backward();
    EXPECT_EQ(fsdp_gathered_bytes(), 0);
    // Resharded: gathered again once for the backward, all but the 2 L + 1 LayerNorm biases.
    EXPECT_EQ(fsdp_stats().backward - s1.backward, reshard ? params - (2 * cfg.num_hidden_layers + 1) : 0);
    std::map<std::string, Tensor> g;
    for (auto& [name, p] : model.named_parameters()) g[name] = p->grad().clone();
    grads.push_back(g);
  }
  // Keeping the gathered weights costs about the whole model's bytes (the LayerNorm biases no
  // backward reads are freed either way); resharding gives the same gradients.
  const double model_bytes = double(nn::GPT(cfg).num_parameters() * 4);
  EXPECT_NEAR(double(held[0] - held[1]), model_bytes, 0.05 * model_bytes);
  if (rank() == 0)
    std::printf("  after the forward: %.2f MB held keeping the gathered weights, %.2f MB resharded (model %.2f MB)\n",
                double(held[0]) / 1e6, double(held[1]) / 1e6, model_bytes / 1e6);
  for (auto& [name, g] : grads[0]) EXPECT_TRUE(same(grads[1][name], g, 0.0)) << name;
}

// A two-layer MLP split by hand-written plan: colwise then rowwise, its input arriving split
// along the batch (PrepareModuleInput gathers it) and its output split again (PrepareModuleOutput).
struct TwoLayer : nn::Module {
  TwoLayer() {
    a = register_module("a", std::make_shared<nn::Linear>(6, 8));
    b = register_module("b", std::make_shared<nn::Linear>(8, 5));
  }
  Tensor forward(const Tensor& x) { return b->forward(relu(a->forward(x))); }
  std::shared_ptr<nn::Linear> a, b;
};

TEST(TensorParallel, APlanOnAnyModuleWithPreparedInputsAndOutputsMatchesOneProcess) {
  const int n = world_size();
  DeviceMesh tp({{"tp", n}});
  manual_seed(12);
  Tensor x = randn({2 * n, 6}), y = randn({2 * n, 5});
  TwoLayer ref, par;
  std::map<std::string, Tensor> ref_params;
  for (auto& [name, p] : ref.named_parameters()) ref_params[name] = *p;
  {
    NoGradGuard g;
    for (auto& [name, p] : par.named_parameters()) p->copy_(ref_params.at(name));
  }
  sum(ref.forward(x) * y).backward();
  parallelize_module(par, tp, {{"a", TPStyle::colwise}, {"b", TPStyle::rowwise}});
  prepare_module_io(par, tp, "a", {{Placement::Shard(0)}, {Placement::Replicate()}, {}, {}});
  prepare_module_io(par, tp, "b", {{}, {}, {Placement::Replicate()}, {Placement::Shard(0)}});
  const auto [start, len] = shard_range(2 * n, n, rank());
  Tensor out = par.forward(x.narrow(0, start, len).contiguous());  // this rank's rows in, its rows out
  EXPECT_TRUE(same(out, ref.forward(x).narrow(0, start, len), 1e-5));
  sum(out * y.narrow(0, start, len)).backward();
  for (auto& [name, p] : par.named_parameters()) {
    std::optional<DTensor> l = parameter_layout(*p);
    ASSERT_TRUE(l.has_value()) << name;
    EXPECT_TRUE(same(p->grad(), distribute_tensor(ref_params.at(name).grad(), tp, l->placements()).to_local(), 1e-5)) << name;
  }
}

// Embedding split both ways: by columns into a row-parallel Linear, and by vocabulary.
struct EmbedThenLinear : nn::Module {
  EmbedThenLinear() {
    e = register_module("e", std::make_shared<nn::Embedding>(10, 8));
    l = register_module("l", std::make_shared<nn::Linear>(8, 12));  // 12 outputs: no empty shard at 2-4 ranks
  }
  Tensor forward(const Tensor& ids) { return l->forward(e->forward(ids)); }
  std::shared_ptr<nn::Embedding> e;
  std::shared_ptr<nn::Linear> l;
};

TEST(TensorParallel, EmbeddingsSplitByColumnsOrByVocabularyMatchOneProcess) {
  DeviceMesh tp({{"tp", world_size()}});
  manual_seed(21);
  Tensor ids = randint(0, 10, {4, 5}), w = randn({4, 5, 12});
  for (TPStyle emb_style : {TPStyle::colwise, TPStyle::rowwise}) {
    EmbedThenLinear ref, par;
    std::map<std::string, Tensor> ref_params;
    for (auto& [name, p] : ref.named_parameters()) ref_params[name] = *p;
    {
      NoGradGuard g;
      for (auto& [name, p] : par.named_parameters()) p->copy_(ref_params.at(name));
    }
    Tensor want = ref.forward(ids);
    sum(want * w).backward();
    // colwise embedding -> its output is split on the last dim -> rowwise Linear; a vocabulary
    // split embedding gives the whole rows -> colwise Linear, gathered to compare.
    if (emb_style == TPStyle::colwise) {
      parallelize_module(par, tp, {{"e", TPStyle::colwise}, {"l", TPStyle::rowwise}});
    } else {
      parallelize_module(par, tp, {{"e", TPStyle::rowwise}, {"l", TPStyle::colwise}});
      prepare_module_io(par, tp, "l", {{}, {}, {Placement::Shard(2)}, {Placement::Replicate()}});
    }
    Tensor got = par.forward(ids);
    EXPECT_TRUE(same(got, want, 1e-5));
    sum(got * w).backward();
    for (auto& [name, p] : par.named_parameters())
      EXPECT_TRUE(same(p->grad(), distribute_tensor(ref_params.at(name).grad(), tp, parameter_layout(*p)->placements()).to_local(), 1e-5))
          << name;
  }
}

TEST(TensorParallel, TheSameInputFedToTwoForwardsGetsTwoGraphs) {
  // Column-parallel layers share the copy of an input they are fed; a later forward of the same
  // tensor, after a backward freed the first graph, must not reuse it.
  DeviceMesh tp({{"tp", world_size()}});
  TwoLayer m;
  parallelize_module(m, tp, {{"a", TPStyle::colwise}, {"b", TPStyle::rowwise}});
  manual_seed(4);
  Tensor x = randn({3, 6}).requires_grad_();
  sum(m.forward(x)).backward();
  const Tensor g1 = x.grad().clone();
  EXPECT_NO_THROW(sum(m.forward(x)).backward());
  EXPECT_TRUE(same(x.grad(), g1 * 2.0, 1e-6));
}

// ---- Resharding checkpoints: ctest runs SaveOn2x2 (4 ranks), then LoadOn1x2 (2 ranks) and
// LoadOnOneProcess (no mpirun) on the folder SINTER_CKPT_DIR names. ----

std::string ckpt_dir() {
  const char* d = std::getenv("SINTER_CKPT_DIR");
  return d ? d : "";
}

train::Options ckpt_options(const std::string& out) {
  train::Options o;
  o.steps = 6, o.batch = 12, o.out_dir = out, o.quiet = true, o.val_every = 1000, o.val_batches = 1, o.save_every = 1000;
  return o;
}

Tensor probe_batch() {
  manual_seed(31);
  return randint(0, 256, {3, 40});
}

// A copy of the saved checkpoint to resume in (each loader trains on from step 4 in its own folder).
std::string copy_of_saved(const std::string& name) {
  const std::string to = ckpt_dir() + "/" + name;
  if (rank() == 0) {
    std::filesystem::remove_all(to);
    std::filesystem::copy(ckpt_dir() + "/saved", to, std::filesystem::copy_options::recursive);
  }
  world()->barrier().wait();
  return to;
}

TEST(Checkpoint, SaveOn2x2) {
  ASSERT_EQ(world_size(), 4) << "run under mpirun -np 4";
  ASSERT_FALSE(ckpt_dir().empty()) << "set SINTER_CKPT_DIR";
  const std::string saved = ckpt_dir() + "/saved";
  if (rank() == 0) std::filesystem::remove_all(ckpt_dir()), std::filesystem::create_directories(ckpt_dir());
  world()->barrier().wait();
  train::Options o = ckpt_options(saved);
  o.tp = 2, o.dp = 2, o.stop_after = 4;  // interrupted at step 4: sharded model + optimizer on disk
  train::run(o);
  ASSERT_TRUE(dist::has_sharded(saved, "model"));
  if (rank() == 0) {
    // What the loaders must reproduce: the whole weights, the logits of a probe batch, and the
    // losses of steps 5 and 6 of the uninterrupted run.
    auto model = train::load_model(saved);
    model->eval();
    Tensor logits;
    {
      NoGradGuard g;
      logits = model->forward(probe_batch());
    }
    train::Result ref = train::run(ckpt_options(ckpt_dir() + "/uninterrupted"));
    io::save_safetensors(ckpt_dir() + "/expect.safetensors",
                         {{"logits", logits}, {"losses", tensor<double>(ref.losses)}});
  }
  world()->barrier().wait();
}

void check_loaded_and_resumed(const std::string& resumed_dir, const std::function<train::Result(const std::string&)>& resume) {
  auto expect = io::load_safetensors(ckpt_dir() + "/expect.safetensors").tensors;
  // Resume at step 4 on this layout: steps 5 and 6 match the uninterrupted run.
  train::Result r = resume(resumed_dir);
  ASSERT_EQ(r.losses.size(), 2u);
  const std::vector<double> want = expect["losses"].to_vector<double>();
  for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(r.losses[i], want[4 + i], 1e-5 * want[4 + i]) << "step " << 5 + i;
}

TEST(Checkpoint, LoadOn1x2) {
  ASSERT_EQ(world_size(), 2) << "run under mpirun -np 2";
  const std::string saved = ckpt_dir() + "/saved";
  auto expect = io::load_safetensors(ckpt_dir() + "/expect.safetensors").tensors;
  // The 2x2 pieces resharded onto dp=2: FSDP shards of the whole (untouched by tp) weights.
  DeviceMesh mesh({{"dp", 2}, {"tp", 1}});
  std::ifstream cf(saved + "/config.json");
  std::stringstream ss;
  ss << cf.rdbuf();
  nn::GPT model(nn::ModelConfig::from_json(ss.str(), "config.json"));
  fully_shard_gpt(model, mesh["dp"]);
  std::map<std::string, DTensor> pieces;
  for (auto& [name, p] : model.named_parameters()) pieces.emplace(name, *parameter_layout(*p));
  load_sharded_into(saved, "model", pieces);
  auto whole = load_sharded(saved, "model");
  for (auto& [name, p] : model.named_parameters())
    EXPECT_TRUE(same(full_parameter(*p), whole[name], 0.0)) << name << " differs from the saved tensor";
  model.eval();
  Tensor logits;
  {
    NoGradGuard g;
    logits = model.forward(probe_batch());
  }
  EXPECT_TRUE(same(logits, expect["logits"], 1e-6));
  check_loaded_and_resumed(copy_of_saved("resumed_1x2"), [](const std::string& dir) {
    train::Options o = ckpt_options(dir);
    o.dp = 2, o.resume = true;
    return train::run(o);
  });
}

TEST(Checkpoint, LoadOnOneProcess) {
  ASSERT_EQ(world_size(), 1) << "run without mpirun";
  const std::string saved = ckpt_dir() + "/saved";
  auto expect = io::load_safetensors(ckpt_dir() + "/expect.safetensors").tensors;
  auto model = train::load_model(saved);
  model->eval();
  Tensor logits;
  {
    NoGradGuard g;
    logits = model->forward(probe_batch());
  }
  EXPECT_TRUE(same(logits, expect["logits"], 0.0));
  check_loaded_and_resumed(copy_of_saved("resumed_1"), [](const std::string& dir) {
    train::Options o = ckpt_options(dir);
    o.resume = true;
    return train::run(o);
  });
}

// On ranks other than 0: failures only, each line prefixed with the rank.
class FailurePrinter : public ::testing::EmptyTestEventListener {
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank(), r.file_name() ? r.file_name() : "?", r.line_number(),
                   r.summary());
  }
};

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  init();
  if (rank() != 0) {  // one rank prints; the others only report failures through the exit code
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter);
  }
  const int rc = RUN_ALL_TESTS();
  world()->barrier().wait();
  if (rank() == 0 && !g_job_dir.empty()) std::filesystem::remove_all(g_job_dir);
  const int64_t worst = all_reduce(full({1}, double(rc), DType::i64), *world(), ReduceOp::max).item<int64_t>();
  if (rc != 0) std::fprintf(stderr, "rank %d: tests failed\n", rank());
  return worst != 0 ? 1 : 0;
}

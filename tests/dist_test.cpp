// Multi-rank tests: ctest runs this binary under `mpirun -np 2`, `-np 3` and `-np 4`, one job at a
// time. Every rank runs every test; each checks its own results against what a single process
// computes from the same seeds, and a failure on any rank fails the job.
#include <gtest/gtest.h>

#include "sinter/dist.h"
#include "sinter/sinter.h"
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
  const int64_t worst = all_reduce(full({1}, double(rc), DType::i64), *world(), ReduceOp::max).item<int64_t>();
  if (rc != 0) std::fprintf(stderr, "rank %d: tests failed\n", rank());
  return worst != 0 ? 1 : 0;
}

// DTensor: placements per mesh dimension and redistribution between any two of them, built from
// the collective ops (so it differentiates). Shards follow torch.chunk's rule and nest in mesh
// order: with [Shard(0), Shard(0)] mesh dimension 0 splits the tensor, dimension 1 splits that piece.
#include <sstream>

#include "sinter/dist.h"
#include "sinter/ops.h"

namespace sinter::dist {

namespace {

void check_placements(const char* op, const DeviceMesh& mesh, const Placements& p, int64_t ndim) {
  SINTER_CHECK_T(DistError, int64_t(p.size()) == mesh.ndim(), "[", op, "] ", p.size(), " placements for ", mesh.to_string());
  for (const Placement& q : p)
    SINTER_CHECK_T(DistError, !q.is_shard() || (q.dim >= 0 && q.dim < ndim), "[", op, "] ", q.to_string(),
                   " does not name a dimension of a ", ndim, "-d tensor");
}

// The length of tensor dimension `d` as mesh dimension `upto` sees it: the global length cut by the
// shards of the mesh dimensions before it (this rank's coordinates).
int64_t length_at(const Shape& global, const DeviceMesh& mesh, const Placements& p, int64_t d, int64_t upto) {
  int64_t len = global[size_t(d)];
  for (int64_t i = 0; i < upto; ++i)
    if (p[size_t(i)].is_shard() && p[size_t(i)].dim == d) len = shard_range(len, mesh.size(i), mesh.coordinate(i)).second;
  return len;
}

bool shards_dim(const Placements& p, int64_t d, int64_t except) {
  for (size_t i = 0; i < p.size(); ++i)
    if (int64_t(i) != except && p[i].is_shard() && p[i].dim == d) return true;
  return false;
}

}  // namespace

std::string Placement::to_string() const {
  if (is_shard()) return "Shard(" + std::to_string(dim) + ")";
  return is_partial() ? "Partial(sum)" : "Replicate()";
}

DTensor::DTensor(Tensor local, DeviceMesh mesh, Placements placements, Shape global_shape)
    : local_(std::move(local)), mesh_(std::move(mesh)), placements_(std::move(placements)), shape_(std::move(global_shape)) {
  check_placements("DTensor", mesh_, placements_, int64_t(shape_.size()));
  SINTER_CHECK_T(DistError, local_.dim() == int64_t(shape_.size()), "[DTensor] local piece ", local_.shape(),
                 " and global shape ", shape_, " differ in rank");
  for (int64_t d = 0; d < local_.dim(); ++d) {
    const int64_t want = length_at(shape_, mesh_, placements_, d, mesh_.ndim());
    SINTER_CHECK_T(DistError, local_.size(d) == want, "[DTensor] rank ", rank(), " holds ", local_.shape(), " but ",
                   to_string(), " puts ", want, " along dim ", d, " here");
  }
}

DTensor DTensor::from_local(Tensor local, DeviceMesh mesh, Placements placements) {
  check_placements("from_local", mesh, placements, local.dim());
  Shape global = local.shape();
  // Innermost shards first: each sum over a mesh dimension gives the length one level up.
  for (int64_t i = mesh.ndim() - 1; i >= 0; --i) {
    const Placement& p = placements[size_t(i)];
    if (!p.is_shard()) continue;
    Tensor len = full({1}, double(global[size_t(p.dim)]), DType::i64);
    global[size_t(p.dim)] = all_reduce(len, mesh.group(i), ReduceOp::sum).item<int64_t>();
  }
  // Every rank learns whether any piece breaks the layout, so all of them throw together.
  std::string problem;
  for (int64_t d = 0; d < local.dim() && problem.empty(); ++d) {
    const int64_t want = length_at(global, mesh, placements, d, mesh.ndim());
    if (local.size(d) != want)
      problem = "rank " + std::to_string(rank()) + " holds " + detail::cat_message(local.shape()) + " but torch.chunk's layout puts " +
                std::to_string(want) + " along dim " + std::to_string(d) + " there";
  }
  Tensor bad = full({1}, problem.empty() ? 0.0 : 1.0, DType::i64);
  for (int64_t i = 0; i < mesh.ndim(); ++i) bad = all_reduce(bad, mesh.group(i), ReduceOp::max);
  SINTER_CHECK_T(DistError, bad.item<int64_t>() == 0, "[from_local] the pieces do not form a DTensor of shape ", global, ": ",
                 problem.empty() ? "another rank's piece is off" : problem);
  return DTensor(std::move(local), std::move(mesh), std::move(placements), std::move(global));
}

DTensor DTensor::redistribute(const Placements& target, const Placements& grad_placements) const {
  check_placements("redistribute", mesh_, target, int64_t(shape_.size()));
  // The gradient of a Partial (a sum) is the same on every rank: Replicate.
  Placements gp = grad_placements;
  if (gp.empty())
    for (const Placement& q : target) gp.push_back(q.is_partial() ? Placement::Replicate() : q);
  check_placements("redistribute", mesh_, gp, int64_t(shape_.size()));
  const int64_t n = mesh_.ndim();
  Placements cur = placements_;
  Tensor x = local_;

  // Which mesh dimensions must change. A shard nested inside one whose tensor dimension changes
  // must be undone first and redone after.
  std::vector<bool> reset(size_t(n), false);
  for (int64_t i = 0; i < n; ++i) {
    if (cur[size_t(i)] == target[size_t(i)]) continue;
    reset[size_t(i)] = true;
    for (const Placement& q : {cur[size_t(i)], target[size_t(i)]})
      if (q.is_shard())
        for (int64_t j = i + 1; j < n; ++j)
          if ((cur[size_t(j)].is_shard() && cur[size_t(j)].dim == q.dim) || (target[size_t(j)].is_shard() && target[size_t(j)].dim == q.dim))
            reset[size_t(j)] = true;
  }

  // Down to Replicate, innermost first, with one-collective shortcuts where no other mesh dimension
  // shards the tensor dimensions involved.
  for (int64_t i = n - 1; i >= 0; --i) {
    if (!reset[size_t(i)]) continue;
    ProcessGroup& g = mesh_.group(i);
    const Placement from = cur[size_t(i)], to = target[size_t(i)];
    const bool grad_partial = gp[size_t(i)].is_partial() && to.is_replicate();
    if (from.is_partial() && to.is_shard() && !shards_dim(cur, to.dim, i) && !shards_dim(target, to.dim, i)) {
      x = reduce_scatter(x, g, to.dim, shard_sizes(x.size(to.dim), g.size()));
      cur[size_t(i)] = to, reset[size_t(i)] = false;
      continue;
    }
    if (from.is_shard() && to.is_shard() && !shards_dim(cur, from.dim, i) && !shards_dim(target, to.dim, i) &&
        !shards_dim(cur, to.dim, i) && shape_[size_t(from.dim)] % g.size() == 0 && x.size(to.dim) % g.size() == 0) {
      x = all_to_all(x, g, to.dim, from.dim);
      cur[size_t(i)] = to, reset[size_t(i)] = false;
      continue;
    }
    if (from.is_shard()) {
      x = all_gather(x, g, from.dim, shard_sizes(length_at(shape_, mesh_, cur, from.dim, i), g.size()), grad_partial);
    } else if (from.is_partial()) {
      x = all_reduce(x, g, ReduceOp::sum, grad_partial);
    } else if (grad_partial && to.is_replicate()) {
      x = copy_to_group(x, g);  // Replicate -> Replicate whose gradient is partial
    }
    cur[size_t(i)] = Placement::Replicate();
  }
  // Then out to the targets, outermost first.
  for (int64_t i = 0; i < n; ++i) {
    if (!reset[size_t(i)]) continue;
    const Placement to = target[size_t(i)];
    if (to.is_shard()) {
      x = shard(x, mesh_.group(i), to.dim);
    } else if (to.is_partial()) {  // coordinate 0 keeps the value; the gradient, replicated, is summed back
      x = copy_to_group(x, mesh_.group(i));
      if (mesh_.coordinate(i) != 0) x = x * 0.0;
    }
    cur[size_t(i)] = to;
  }
  return DTensor(x, mesh_, target, shape_);
}

Tensor DTensor::full_tensor() const {
  return redistribute(Placements(size_t(mesh_.ndim()), Placement::Replicate())).to_local();
}

std::string DTensor::to_string() const {
  std::ostringstream os;
  os << "DTensor(shape " << shape_ << ", " << mesh_.to_string() << ", [";
  for (size_t i = 0; i < placements_.size(); ++i) os << (i ? ", " : "") << placements_[i].to_string();
  os << "])";
  return os.str();
}

DTensor distribute_tensor(const Tensor& full, const DeviceMesh& mesh, const Placements& placements) {
  check_placements("distribute_tensor", mesh, placements, full.dim());
  return DTensor(full, mesh, Placements(size_t(mesh.ndim()), Placement::Replicate()), full.shape()).redistribute(placements);
}

}  // namespace sinter::dist

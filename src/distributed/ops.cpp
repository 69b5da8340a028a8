// The collectives as ops: one definition each serves eager calls, autograd and tracing; their CPU
// kernels (over the process groups) are in collective_kernels.cpp. Each op's attributes name its group by id and say how the backward treats
// the gradient: the same on every rank ("replicated": keep this rank's part) or each rank's own term
// ("partial": reduce it).
#include <cstring>

#include "distributed/backend.h"
#include "ops/common.h"
#include "sinter/dist.h"

namespace sinter::dist {

void (*detail::fsdp_release)(int64_t, int64_t) = nullptr;
Tensor (*detail::fsdp_prefetched)(int64_t, int64_t) = nullptr;

namespace {
using sinter::detail::add_op;
using sinter::detail::raw_view;
using sinter::detail::wrap_dim;

const char* reduce_name(ReduceOp op) { return op == ReduceOp::sum ? "sum" : op == ReduceOp::avg ? "avg" : "max"; }
ReduceOp parse_reduce(const std::string& s) {
  if (s == "sum") return ReduceOp::sum;
  if (s == "avg") return ReduceOp::avg;
  if (s == "max") return ReduceOp::max;
  SINTER_THROW(ValueError, "[dist] unknown reduction '", s, "' (sum, avg, max)");
}

std::vector<int64_t> as_vec(const Shape& s) { return std::vector<int64_t>(s.begin(), s.end()); }
int64_t offset_of(const Shape& sizes, int r) {
  int64_t off = 0;
  for (int i = 0; i < r; ++i) off += sizes[size_t(i)];
  return off;
}

// The group an op's attributes name, with an error that names the op.
ProcessGroup& group_for(const char* op, const Attrs& a) {
  try {
    return group_by_id(a.i("group"));
  } catch (const DistError& e) {
    SINTER_THROW(DistError, "[", op, "] ", e.what());
  }
}

void check_sizes(const char* op, const ProcessGroup& g, const Shape& sizes) {
  SINTER_CHECK_T(DistError, int64_t(sizes.size()) == g.size(), "[", op, "] ", sizes.size(), " shard sizes for group '",
                 g.name(), "' of ", g.size(), " ranks");
}

}  // namespace

void register_dist_ops() {
  OpDef ar;
  ar.name = "dist_all_reduce";  // attrs: group, op, grad_partial
  ar.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    group_for("dist_all_reduce", a);
    const DType t = in[0].dtype;
    SINTER_CHECK_DTYPE(t == DType::f32 || t == DType::f64 || t == DType::bf16 || t == DType::i32 || t == DType::i64,
                       "[dist_all_reduce] reduces f32, f64, bf16, i32 or i64 tensors, got ", t);
    return std::vector<TensorMeta>{in[0]};
  };
  ar.backward = [](BackwardCtx& c) {
    ProcessGroup& g = group_by_id(c.attrs.i("group"));
    const ReduceOp op = parse_reduce(c.attrs.str("op"));
    SINTER_CHECK_T(AutogradError, op != ReduceOp::max, "[all_reduce] max has no gradient here");
    Tensor grad = c.attrs.b("grad_partial") ? all_reduce(c.grads[0], g, ReduceOp::sum) : c.grads[0];
    return std::vector<Tensor>{op == ReduceOp::avg ? grad / double(g.size()) : grad};
  };
  ar.save_inputs = 0;
  add_op(std::move(ar));

  OpDef ag;
  ag.name = "dist_all_gather";  // attrs: group, dim, sizes, grad_partial, grad_op
  ag.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    const ProcessGroup& g = group_for("dist_all_gather", a);
    const Shape& sizes = a.ints("sizes");
    check_sizes("dist_all_gather", g, sizes);
    const int64_t d = wrap_dim("dist_all_gather", a.i("dim"), int64_t(in[0].shape.size()));
    SINTER_CHECK_SHAPE(in[0].shape[size_t(d)] == sizes[size_t(g.rank())], "[dist_all_gather] rank ", g.rank(), " holds ",
                       in[0].shape, " but its shard along dim ", d, " should have ", sizes[size_t(g.rank())]);
    TensorMeta m = in[0];
    m.shape[size_t(d)] = offset_of(sizes, g.size());
    return std::vector<TensorMeta>{m};
  };
  ag.backward = [](BackwardCtx& c) {
    ProcessGroup& g = group_by_id(c.attrs.i("group"));
    const Shape& sizes = c.attrs.ints("sizes");
    const int64_t d = c.attrs.i("dim");
    if (c.attrs.has("release_unit") && detail::fsdp_release) detail::fsdp_release(c.attrs.i("release_unit"), c.attrs.i("release_index"));
    if (c.attrs.b("grad_partial"))
      return std::vector<Tensor>{reduce_scatter(c.grads[0], g, d, as_vec(sizes), parse_reduce(c.attrs.str("grad_op")))};
    return std::vector<Tensor>{c.grads[0].narrow(d, offset_of(sizes, g.rank()), sizes[size_t(g.rank())]).contiguous()};
  };
  ag.save_inputs = 0;
  add_op(std::move(ag));

  OpDef rs;
  rs.name = "dist_reduce_scatter";  // attrs: group, dim, sizes, op
  rs.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    const ProcessGroup& g = group_for("dist_reduce_scatter", a);
    const Shape& sizes = a.ints("sizes");
    check_sizes("dist_reduce_scatter", g, sizes);
    const int64_t d = wrap_dim("dist_reduce_scatter", a.i("dim"), int64_t(in[0].shape.size()));
    SINTER_CHECK_SHAPE(in[0].shape[size_t(d)] == offset_of(sizes, g.size()), "[dist_reduce_scatter] input ", in[0].shape,
                       " has ", in[0].shape[size_t(d)], " along dim ", d, " but the shards sum to ", offset_of(sizes, g.size()));
    TensorMeta m = in[0];
    m.shape[size_t(d)] = sizes[size_t(g.rank())];
    return std::vector<TensorMeta>{m};
  };
  rs.backward = [](BackwardCtx& c) {
    ProcessGroup& g = group_by_id(c.attrs.i("group"));
    Tensor grad = all_gather(c.grads[0], g, c.attrs.i("dim"), as_vec(c.attrs.ints("sizes")));
    return std::vector<Tensor>{parse_reduce(c.attrs.str("op")) == ReduceOp::avg ? grad / double(g.size()) : grad};
  };
  rs.save_inputs = 0;
  add_op(std::move(rs));

  OpDef aa;
  aa.name = "dist_all_to_all";  // attrs: group, split_dim, concat_dim
  aa.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    const ProcessGroup& g = group_for("dist_all_to_all", a);
    const int64_t nd = int64_t(in[0].shape.size());
    const int64_t s = wrap_dim("dist_all_to_all", a.i("split_dim"), nd), cd = wrap_dim("dist_all_to_all", a.i("concat_dim"), nd);
    SINTER_CHECK_SHAPE(in[0].shape[size_t(s)] % g.size() == 0, "[dist_all_to_all] dim ", s, " of ", in[0].shape,
                       " does not split evenly over ", g.size(), " ranks");
    TensorMeta m = in[0];
    m.shape[size_t(s)] /= g.size();
    m.shape[size_t(cd)] *= g.size();
    return std::vector<TensorMeta>{m};
  };
  aa.backward = [](BackwardCtx& c) {
    ProcessGroup& g = group_by_id(c.attrs.i("group"));
    return std::vector<Tensor>{all_to_all(c.grads[0], g, c.attrs.i("concat_dim"), c.attrs.i("split_dim"))};
  };
  aa.save_inputs = 0;
  add_op(std::move(aa));

  OpDef bc;
  bc.name = "dist_broadcast";  // attrs: group, root
  bc.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    const ProcessGroup& g = group_for("dist_broadcast", a);
    SINTER_CHECK_T(DistError, a.i("root") >= 0 && a.i("root") < g.size(), "[dist_broadcast] root ", a.i("root"),
                   " is not a rank of group '", g.name(), "' (", g.size(), " ranks)");
    return std::vector<TensorMeta>{in[0]};
  };
  bc.backward = [](BackwardCtx& c) {  // the result is the root's input on every rank
    const ProcessGroup& g = group_by_id(c.attrs.i("group"));
    return std::vector<Tensor>{g.rank() == c.attrs.i("root") ? c.grads[0] : zeros_like(c.grads[0])};
  };
  bc.save_inputs = 0;
  add_op(std::move(bc));

  OpDef cp;
  cp.name = "dist_copy_to_group";  // attrs: group
  cp.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    group_for("dist_copy_to_group", a);
    return std::vector<TensorMeta>{in[0]};
  };
  cp.view = [](std::span<const Tensor> in, const Attrs&) {  // an alias: no copy (and FSDP still sees its weight)
    return std::vector<Tensor>{sinter::detail::raw_view(in[0], in[0].shape(), in[0].strides(), in[0].offset())};
  };
  cp.backward = [](BackwardCtx& c) {
    return std::vector<Tensor>{all_reduce(c.grads[0], group_by_id(c.attrs.i("group")), ReduceOp::sum)};
  };
  cp.save_inputs = 0;
  add_op(std::move(cp));

  OpDef sh;
  sh.name = "dist_shard";  // attrs: group, dim
  sh.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    const ProcessGroup& g = group_for("dist_shard", a);
    const int64_t d = wrap_dim("dist_shard", a.i("dim"), int64_t(in[0].shape.size()));
    TensorMeta m = in[0];
    m.shape[size_t(d)] = shard_range(in[0].shape[size_t(d)], g.size(), g.rank()).second;
    return std::vector<TensorMeta>{m};
  };
  sh.backward = [](BackwardCtx& c) {
    ProcessGroup& g = group_by_id(c.attrs.i("group"));
    const int64_t d = wrap_dim("dist_shard", c.attrs.i("dim"), int64_t(c.input_meta[0].shape.size()));
    return std::vector<Tensor>{all_gather(c.grads[0], g, d, shard_sizes(c.input_meta[0].shape[size_t(d)], g.size()))};
  };
  sh.save_inputs = 0;
  add_op(std::move(sh));
}

namespace {
const OpDef& op(const char* name) { return get_op(name); }
}  // namespace

std::pair<int64_t, int64_t> shard_range(int64_t length, int64_t parts, int64_t index) {
  const int64_t block = (length + parts - 1) / std::max<int64_t>(parts, 1);
  const int64_t start = std::min(length, block * index);
  return {start, std::min(length, start + block) - start};
}

std::vector<int64_t> shard_sizes(int64_t length, int64_t parts) {
  std::vector<int64_t> s;
  for (int64_t i = 0; i < parts; ++i) s.push_back(shard_range(length, parts, i).second);
  return s;
}

Tensor all_reduce(const Tensor& x, ProcessGroup& g, ReduceOp op_, bool grad_partial) {
  return call1(op("dist_all_reduce"), {x}, {{"group", g.id()}, {"op", std::string(reduce_name(op_))}, {"grad_partial", grad_partial}});
}

Tensor all_gather(const Tensor& x, ProcessGroup& g, int64_t dim, const std::vector<int64_t>& sizes, bool grad_partial,
                  ReduceOp grad_op) {
  return call1(op("dist_all_gather"), {x},
               {{"group", g.id()}, {"dim", dim}, {"sizes", Shape(sizes)}, {"grad_partial", grad_partial},
                {"grad_op", std::string(reduce_name(grad_op))}});
}

Tensor reduce_scatter(const Tensor& x, ProcessGroup& g, int64_t dim, const std::vector<int64_t>& sizes, ReduceOp op_) {
  SINTER_CHECK(op_ != ReduceOp::max, "[reduce_scatter] takes sum or avg");
  return call1(op("dist_reduce_scatter"), {x},
               {{"group", g.id()}, {"dim", dim}, {"sizes", Shape(sizes)}, {"op", std::string(reduce_name(op_))}});
}

Tensor all_to_all(const Tensor& x, ProcessGroup& g, int64_t split_dim, int64_t concat_dim) {
  return call1(op("dist_all_to_all"), {x}, {{"group", g.id()}, {"split_dim", split_dim}, {"concat_dim", concat_dim}});
}

Tensor broadcast(const Tensor& x, ProcessGroup& g, int root) {
  SINTER_CHECK_T(DistError, root >= 0 && root < g.size(), "[broadcast] root ", root, " is not a rank of group '", g.name(),
                 "' (", g.size(), " ranks)");
  return call1(op("dist_broadcast"), {x}, {{"group", g.id()}, {"root", int64_t(root)}});
}

Tensor copy_to_group(const Tensor& x, ProcessGroup& g) { return call1(op("dist_copy_to_group"), {x}, {{"group", g.id()}}); }

Tensor shard(const Tensor& x, ProcessGroup& g, int64_t dim) {
  return call1(op("dist_shard"), {x}, {{"group", g.id()}, {"dim", dim}});
}

}  // namespace sinter::dist

// CPU kernels of the collective ops (ops.cpp): the process group's collectives on contiguous
// buffers, with shards laid end to end in rank order.
#include "cpu/cpu.h"
#include "distributed/backend.h"
#include "ops/common.h"
#include "sinter/dist.h"

namespace sinter::dist {
namespace {

using cpu::contiguous_as;
using sinter::detail::raw_view;
using sinter::detail::wrap_dim;

ReduceOp parse_reduce(const std::string& s) {
  if (s == "sum") return ReduceOp::sum;
  if (s == "avg") return ReduceOp::avg;
  if (s == "max") return ReduceOp::max;
  SINTER_THROW(ValueError, "[dist] unknown reduction '", s, "' (sum, avg, max)");
}

// Blocks of x along `dim` (sizes[r] each), laid end to end in rank order: what allgatherv receives
// and reduce_scatter sends.
Tensor pack(const Tensor& x, int64_t dim, const Shape& sizes) {
  Tensor buf = Tensor::empty({x.numel()}, x.dtype());
  int64_t off = 0, elem = 0;
  for (int64_t len : sizes) {
    Shape s = x.shape();
    s[size_t(dim)] = len;
    if (s.numel() > 0) cpu::copy(sinter::detail::raw_slice(x, dim, off, off + len), raw_view(buf, s, sinter::detail::contiguous_strides(s), elem));
    off += len, elem += s.numel();
  }
  return buf;
}
void unpack(const Tensor& buf, int64_t dim, const Shape& sizes, const Tensor& out) {
  int64_t off = 0, elem = 0;
  for (int64_t len : sizes) {
    Shape s = out.shape();
    s[size_t(dim)] = len;
    if (s.numel() > 0) cpu::copy(raw_view(buf, s, sinter::detail::contiguous_strides(s), elem), sinter::detail::raw_slice(out, dim, off, off + len));
    off += len, elem += s.numel();
  }
}

void dist_all_reduce_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  SINTER_KERNEL_ENTRY();
  cpu::copy(in[0], out[0]);
  if (out[0].dtype() == DType::bf16 || out[0].dtype() == DType::f16) {
    Tensor f = contiguous_as(in[0], DType::f32);
    group_by_id(a.i("group")).all_reduce(f, parse_reduce(a.str("op"))).wait();
    cpu::copy(f, out[0]);
    return;
  }
  group_by_id(a.i("group")).all_reduce(out[0], parse_reduce(a.str("op"))).wait();
}

void dist_all_gather_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  SINTER_KERNEL_ENTRY();
  ProcessGroup& g = group_by_id(a.i("group"));
  const Shape& sizes = a.ints("sizes");
  const int64_t d = wrap_dim("dist_all_gather", a.i("dim"), in[0].dim());
  if (a.has("prefetch_unit") && detail::fsdp_prefetched) {  // FSDP started this gather earlier
    Tensor buf = detail::fsdp_prefetched(a.i("prefetch_unit"), a.i("prefetch_index"));
    if (buf.defined()) {
      unpack(buf, d, sizes, out[0]);
      return;
    }
  }
  Tensor x = contiguous_as(in[0], in[0].dtype());
  std::vector<int64_t> counts;
  for (int64_t len : sizes) counts.push_back(x.numel() / std::max<int64_t>(in[0].size(d), 1) * len);
  if (in[0].size(d) == 0) {  // an empty shard: the element count per slice comes from the output
    const int64_t per = out[0].numel() / std::max<int64_t>(out[0].size(d), 1);
    for (size_t r = 0; r < counts.size(); ++r) counts[r] = per * sizes[r];
  }
  Tensor buf = Tensor::empty({out[0].numel()}, out[0].dtype());
  g.all_gather(sinter::detail::raw_reshape_contiguous(x, {x.numel()}), buf, counts).wait();
  unpack(buf, d, sizes, out[0]);
}

void dist_reduce_scatter_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  SINTER_KERNEL_ENTRY();
  ProcessGroup& g = group_by_id(a.i("group"));
  const Shape& sizes = a.ints("sizes");
  const int64_t d = wrap_dim("dist_reduce_scatter", a.i("dim"), in[0].dim());
  const DType wire = in[0].dtype() == DType::bf16 || in[0].dtype() == DType::f16 ? DType::f32 : in[0].dtype();
  Tensor buf = pack(contiguous_as(in[0], wire), d, sizes);
  const int64_t per = in[0].numel() / std::max<int64_t>(in[0].size(d), 1);
  std::vector<int64_t> counts;
  for (int64_t len : sizes) counts.push_back(per * len);
  Tensor recv = wire == out[0].dtype() ? out[0] : Tensor::empty(out[0].shape(), wire);
  Tensor flat = sinter::detail::raw_reshape_contiguous(recv, {recv.numel()});
  g.reduce_scatter(buf, flat, counts, parse_reduce(a.str("op"))).wait();
  if (!recv.same(out[0])) cpu::copy(recv, out[0]);
}

void dist_all_to_all_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  SINTER_KERNEL_ENTRY();
  ProcessGroup& g = group_by_id(a.i("group"));
  const int64_t s = wrap_dim("dist_all_to_all", a.i("split_dim"), in[0].dim()), cd = wrap_dim("dist_all_to_all", a.i("concat_dim"), in[0].dim());
  const Shape send_sizes(size_t(g.size()), in[0].size(s) / g.size());
  const Shape recv_sizes(size_t(g.size()), out[0].size(cd) / g.size());
  Tensor buf = pack(in[0], s, send_sizes), recv = Tensor::empty({out[0].numel()}, out[0].dtype());
  g.all_to_all(buf, recv).wait();
  unpack(recv, cd, recv_sizes, out[0]);
}

void dist_broadcast_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  SINTER_KERNEL_ENTRY();
  cpu::copy(in[0], out[0]);
  group_by_id(a.i("group")).broadcast(out[0], int(a.i("root"))).wait();
}

void dist_shard_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  SINTER_KERNEL_ENTRY();
  const ProcessGroup& g = group_by_id(a.i("group"));
  const int64_t d = wrap_dim("dist_shard", a.i("dim"), in[0].dim());
  const auto [start, len] = shard_range(in[0].size(d), g.size(), g.rank());
  if (len > 0) cpu::copy(sinter::detail::raw_slice(in[0], d, start, start + len), out[0]);
}

}  // namespace

void register_collective_kernels() {
  sinter::detail::add_kernel("dist_all_reduce", DeviceType::cpu, dist_all_reduce_kernel);
  sinter::detail::add_kernel("dist_all_gather", DeviceType::cpu, dist_all_gather_kernel);
  sinter::detail::add_kernel("dist_reduce_scatter", DeviceType::cpu, dist_reduce_scatter_kernel);
  sinter::detail::add_kernel("dist_all_to_all", DeviceType::cpu, dist_all_to_all_kernel);
  sinter::detail::add_kernel("dist_broadcast", DeviceType::cpu, dist_broadcast_kernel);
  sinter::detail::add_kernel("dist_shard", DeviceType::cpu, dist_shard_kernel);
}

}  // namespace sinter::dist

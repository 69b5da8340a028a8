// CUDA kernels of the ops whose position along a dimension is a tensor: dynamic_slice, slice_update_
// and kv_append_ (src/ops/shape.cpp), as a decode step calls them with the KV cache's position. The
// position is read on the device, so a step never waits for the host; a range past the dimension is
// recorded as the device's fault (raised at the next wait, naming the op) and nothing is copied.
#include <span>

#include "core/view.h"
#include "cuda/launch.cuh"
#include "ops/common.h"
#include "sinter/op.h"

namespace sinter::cuda {
namespace {

using detail::raw_slice;

// dst[i] = src[i], with *start times dst_step (or src_step) elements added to dst's (src's) offset.
template <class S>
__global__ void shifted_copy_k(int64_t n, Indexer ix, S* dst, const S* src, const int64_t* start, int64_t length, int64_t size,
                               int64_t dst_step, int64_t src_step, DeviceFault* fault, const char* op, const char* what) {
  const int64_t s = *start;
  if (s < 0 || s + length > size) {
    if (blockIdx.x == 0 && threadIdx.x == 0) record_fault(fault, {1, s, 0, size, length, op, what});
    return;
  }
  SINTER_GRID_STRIDE(i, n) {
    int64_t off[2];
    ix.offsets(i, off);
    dst[off[0] + s * dst_step] = src[off[1] + s * src_step];
  }
}

__global__ void end_k(int64_t, const int64_t* start, int64_t length, int64_t* end) { *end = *start + length; }

// dst (a view at position 0 of its dimension) = src, one of them shifted along it by *start.
void shifted_copy(const char* op, const Tensor& dst, const Tensor& src, const Tensor& start, int64_t length, int64_t size,
                  int64_t dst_step, int64_t src_step) {
  if (dst.numel() == 0) return;
  const Tensor s = src.dtype() == dst.dtype() ? src : src.to(dst.dtype());
  const Tensor& pos = start;  // i64, 0-d (the op's rule), on this device
  const Indexer ix = make_indexer(op, dst, {&s});
  dispatch<Types::all>(dst.dtype(), op, [&](auto tag) {
    using S = decltype(tag);
    launch(op, dst, shifted_copy_k<S>, ix, ptr<S>(dst), ptr<const S>(s), ptr<const int64_t>(pos), length, size, dst_step, src_step,
           device_fault(dst.device().index), op, "positions");
  });
}

void dynamic_slice_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const int64_t dim = detail::wrap_dim("dynamic_slice", a.i("dim"), in[0].dim()), n = a.i("length");
  shifted_copy("dynamic_slice", out[0], raw_slice(in[0], dim, 0, n), in[1], n, in[0].size(dim), 0, in[0].stride(dim));
}

void slice_update_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const int64_t dim = detail::wrap_dim("slice_update_", a.i("dim"), out[0].dim()), n = in[1].size(dim);
  shifted_copy("slice_update_", raw_slice(out[0], dim, 0, n), in[1], in[2], n, out[0].size(dim), out[0].stride(dim), 0);
}

void kv_append_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const int64_t dim = detail::wrap_dim("kv_append_", a.i("dim"), out[0].dim()), n = in[2].size(dim);
  shifted_copy("kv_append_", raw_slice(out[0], dim, 0, n), in[2], in[4], n, out[0].size(dim), out[0].stride(dim), 0);
  shifted_copy("kv_append_", raw_slice(out[1], dim, 0, n), in[3], in[4], n, out[1].size(dim), out[1].stride(dim), 0);
  launch("kv_append_", out[2], end_k, ptr<const int64_t>(in[4]), n, ptr<int64_t>(out[2]));
}

}  // namespace

void register_position_kernels() {
  constexpr DeviceType kCuda = DeviceType::cuda;
  register_kernel("dynamic_slice", kCuda, dynamic_slice_kernel);
  register_kernel("slice_update_", kCuda, slice_update_kernel);
  register_kernel("kv_append_", kCuda, kv_append_kernel);
}

}  // namespace sinter::cuda

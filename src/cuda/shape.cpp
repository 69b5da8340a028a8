// CUDA kernels of cat, dynamic_slice, slice_update_ and kv_append_ (src/ops/shape.cpp): copies into
// and out of views (copy_convert). A position tensor on the device is read by the host (a copy)
// to check its range, as the CPU's kernels check theirs.
#include <span>

#include "core/view.h"
#include "cuda/cuda.h"
#include "ops/common.h"
#include "sinter/op.h"

namespace sinter::cuda {
namespace {

using detail::raw_slice;

void cat_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const int64_t dim = detail::wrap_dim("cat", a.i("dim"), in[0].dim());
  int64_t at = 0;
  for (const Tensor& t : in) {
    const int64_t n = t.size(dim);
    if (t.numel() > 0) copy_convert("cat", t, raw_slice(out[0], dim, at, at + n));
    at += n;
  }
}

int64_t start_of(const char* op, const Tensor& start, int64_t n, int64_t size) {
  const int64_t s = start.to(Device::cpu()).item<int64_t>();
  SINTER_CHECK_INDEX(s >= 0 && s + n <= size, "[", op, "] positions ", s, "..", s + n, " out of range for size ", size);
  return s;
}

void dynamic_slice_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const int64_t dim = detail::wrap_dim("dynamic_slice", a.i("dim"), in[0].dim()), n = a.i("length");
  const int64_t s = start_of("dynamic_slice", in[1], n, in[0].size(dim));
  if (out[0].numel() > 0) copy_convert("dynamic_slice", raw_slice(in[0], dim, s, s + n), out[0]);
}

void slice_update_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const int64_t dim = detail::wrap_dim("slice_update_", a.i("dim"), out[0].dim()), n = in[1].size(dim);
  const int64_t s = start_of("slice_update_", in[2], n, out[0].size(dim));
  if (in[1].numel() > 0) copy_convert("slice_update_", in[1], raw_slice(out[0], dim, s, s + n));
}

void kv_append_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const int64_t dim = detail::wrap_dim("kv_append_", a.i("dim"), out[0].dim()), n = in[2].size(dim);
  const int64_t s = start_of("kv_append_", in[4], n, out[0].size(dim));
  if (in[2].numel() > 0) copy_convert("kv_append_", in[2], raw_slice(out[0], dim, s, s + n));
  if (in[3].numel() > 0) copy_convert("kv_append_", in[3], raw_slice(out[1], dim, s, s + n));
  const int64_t end = s + n;
  copy_from_host(out[2].data_ptr(), &end, sizeof end, out[2].device().index);
}

}  // namespace

void register_shape_kernels() {
  constexpr DeviceType kCuda = DeviceType::cuda;
  register_kernel("cat", kCuda, cat_kernel);
  register_kernel("dynamic_slice", kCuda, dynamic_slice_kernel);
  register_kernel("slice_update_", kCuda, slice_update_kernel);
  register_kernel("kv_append_", kCuda, kv_append_kernel);
}

}  // namespace sinter::cuda

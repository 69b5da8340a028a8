// CPU kernels of copy and cat (src/ops/shape.cpp); the view ops need none.
#include "cpu/cpu.h"
#include "ops/common.h"

namespace sinter::cpu {
namespace {

void copy_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) { copy(in[0], out[0]); }

void cat_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const int64_t dim = detail::wrap_dim("cat", a.i("dim"), in[0].dim());
  int64_t at = 0;
  for (const Tensor& t : in) {
    const int64_t n = t.size(dim);
    copy(t, detail::raw_slice(out[0], dim, at, at + n));
    at += n;
  }
}

// The start a position tensor holds, checked against the room along dim.
int64_t start_of(const char* op, const Tensor& start, int64_t n, int64_t size) {
  const int64_t s = *start.data<int64_t>();
  SINTER_CHECK_INDEX(s >= 0 && s + n <= size, "[", op, "] positions ", s, "..", s + n, " out of range for size ", size);
  return s;
}

void dynamic_slice_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const int64_t dim = detail::wrap_dim("dynamic_slice", a.i("dim"), in[0].dim()), n = a.i("length");
  const int64_t s = start_of("dynamic_slice", in[1], n, in[0].size(dim));
  copy(detail::raw_slice(in[0], dim, s, s + n), out[0]);
}

void slice_update_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const int64_t dim = detail::wrap_dim("slice_update_", a.i("dim"), out[0].dim()), n = in[1].size(dim);
  const int64_t s = start_of("slice_update_", in[2], n, out[0].size(dim));
  copy(in[1], detail::raw_slice(out[0], dim, s, s + n));
}

void kv_append_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const int64_t dim = detail::wrap_dim("kv_append_", a.i("dim"), out[0].dim()), n = in[2].size(dim);
  const int64_t s = start_of("kv_append_", in[4], n, out[0].size(dim));
  copy(in[2], detail::raw_slice(out[0], dim, s, s + n));
  copy(in[3], detail::raw_slice(out[1], dim, s, s + n));
  *out[2].data<int64_t>() = s + n;
}

}  // namespace

void register_shape_kernels() {
  detail::add_kernels(DeviceType::cpu, {{"copy", copy_kernel}, {"cat", cat_kernel}, {"dynamic_slice", dynamic_slice_kernel},
                                        {"slice_update_", slice_update_kernel}, {"kv_append_", kv_append_kernel}});
}

}  // namespace sinter::cpu

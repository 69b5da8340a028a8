// CUDA kernels of the softmax family (src/ops/reduce.cpp): softmax and log_softmax over any dim,
// causal_softmax over the last (row i of each matrix sees columns i + offset - window < j <=
// i + offset; masked entries are 0, a row that sees nothing is 0), and the one-pass backwards over
// the last dim. One block per row of a contiguous (rows, n) copy, as the CPU's rows, with the
// CPU's exp (scalar_fns.h) and its rules for empty and all -inf rows.
#include <span>

#include "core/view.h"
#include "cuda/block_reduce.cuh"
#include "ops/common.h"
#include "sinter/op.h"

#define SINTER_HD __host__ __device__
#include "ops/scalar_fns.h"

namespace sinter::cuda {
namespace {

using detail::raw_reshape_contiguous;

// Row r: columns [first, last) visible. log: log_softmax. safe: rows that see nothing give 0, not NaN.
template <class S> __global__ void softmax_rows_k(int64_t rows, int64_t n, const S* x, S* y, bool log, bool causal, int64_t per_matrix,
                                                  int64_t offset, int64_t window, bool safe) {
  using C = compute_t<S>;
  SINTER_ROWS(r, rows) {
    const S* xr = x + r * n;
    S* yr = y + r * n;
    int64_t first = 0, last = n;
    if (causal) {
      last = r % per_matrix + offset + 1;
      last = last < 0 ? 0 : last > n ? n : last;
      first = window > 0 && last > window ? last - window : 0;
    }
    C m = identity<Red::max, C>();
    for (int64_t j = first + threadIdx.x; j < last; j += blockDim.x) m = combine<Red::max>(m, load(xr + j));
    m = block_reduce<Red::max>(m);
    const bool empty = first == last || (isinf(m) && m < 0);
    if (empty && !log) {
      const C fill = safe ? C(0) : C(NAN);
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x) store(yr + j, j >= first && j < last ? fill : (causal ? C(0) : fill));
      continue;
    }
    const C shift = isinf(m) && m < 0 ? C(0) : m;
    C s = 0;
    for (int64_t j = first + threadIdx.x; j < last; j += blockDim.x) s += fn::exp_nonpos_(C(load(xr + j) - shift));
    s = block_reduce<Red::sum>(s);
    if (log) {
      const C ls = ::log(s);
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x) store(yr + j, C(load(xr + j) - shift - ls));
    } else {
      const C inv = C(1) / s;
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
        store(yr + j, j >= first && j < last ? C(fn::exp_nonpos_(C(load(xr + j) - shift)) * inv) : C(0));
    }
  }
}

// softmax: dx = y (g - sum(g y)); log_softmax: dx = g - exp(y) sum(g).
template <class S> __global__ void softmax_backward_rows_k(int64_t rows, int64_t n, const S* g, const S* y, S* dx, bool log) {
  using C = compute_t<S>;
  SINTER_ROWS(r, rows) {
    C s = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s += log ? C(load(g + r * n + j)) : C(load(g + r * n + j) * load(y + r * n + j));
    s = block_reduce<Red::sum>(s);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const C gj = load(g + r * n + j), yj = load(y + r * n + j);
      store(dx + r * n + j, log ? C(gj - fn::exp_(yj) * s) : C(yj * (gj - s)));
    }
  }
}

struct Rows {
  Tensor x;         // contiguous (rows, n) on the device
  int64_t rows, n;
};

// x with `dim` last, contiguous.
Rows rows_along(const Tensor& x, int64_t dim) {
  if (x.dim() == 0) return {x.contiguous(), 1, 1};
  Shape order;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (d != dim) order.push_back(d);
  order.push_back(dim);
  const int64_t n = x.size(dim);
  return {x.permute(order).contiguous(), n ? x.numel() / n : 0, n};
}

// The rows written back into out (dim moved back where it was).
void put_back(const Tensor& rows, const Tensor& out, int64_t dim) {
  if (out.dim() == 0 || dim == out.dim() - 1) {
    if (!rows.same(out)) copy_convert("softmax", rows, out);
    return;
  }
  Shape order;
  for (int64_t d = 0; d < out.dim(); ++d)
    if (d != dim) order.push_back(d);
  order.push_back(dim);
  copy_convert("softmax", raw_reshape_contiguous(rows, out.permute(order).shape()), out.permute(order));
}

void softmax_op(bool log, std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const Tensor& x = in[0];
  if (x.numel() == 0) return;
  const int64_t dim = x.dim() ? detail::wrap_dim("softmax", a.i("dim"), x.dim()) : 0;
  const Rows r = rows_along(x, dim);
  const bool in_place = out[0].dim() == 0 || dim == out[0].dim() - 1;
  const Tensor y = in_place && out[0].is_contiguous() ? out[0] : Tensor::empty(r.x.shape(), x.dtype(), x.device());
  dispatch<Types::floating>(x.dtype(), log ? "log_softmax" : "softmax", [&](auto tag) {
    using S = decltype(tag);
    launch_rows("softmax", y, r.rows, softmax_rows_k<S>, r.n, ptr<const S>(r.x), ptr<S>(y), log, false, int64_t(1), int64_t(0),
                int64_t(0), false);
  });
  put_back(y, out[0], dim);
}

void causal_softmax_op(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const Tensor& x = in[0];
  if (x.numel() == 0) return;
  const Rows r = rows_along(x, x.dim() - 1);
  dispatch<Types::floating>(x.dtype(), "causal_softmax", [&](auto tag) {
    using S = decltype(tag);
    launch_rows("causal_softmax", out[0], r.rows, softmax_rows_k<S>, r.n, ptr<const S>(r.x), ptr<S>(out[0]), false, true, x.size(-2),
                a.i("offset"), a.i_or("window", 0), true);
  });
}

void softmax_backward_op(bool log, std::span<const Tensor> in, std::span<Tensor> out) {
  if (in[1].numel() == 0) return;
  const Tensor g = in[0].contiguous(), y = in[1].contiguous();
  const int64_t n = y.size(-1);
  dispatch<Types::floating>(y.dtype(), "softmax_backward", [&](auto tag) {
    using S = decltype(tag);
    launch_rows("softmax_backward", out[0], y.numel() / n, softmax_backward_rows_k<S>, n, ptr<const S>(g), ptr<const S>(y), ptr<S>(out[0]), log);
  });
}

}  // namespace

void register_softmax_kernels() {
  constexpr DeviceType kCuda = DeviceType::cuda;
  register_kernel("softmax", kCuda, [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) { softmax_op(false, in, out, a); });
  register_kernel("log_softmax", kCuda, [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) { softmax_op(true, in, out, a); });
  register_kernel("causal_softmax", kCuda, causal_softmax_op);
  register_kernel("softmax_backward", kCuda, [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) { softmax_backward_op(false, in, out); });
  register_kernel("log_softmax_backward", kCuda, [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) { softmax_backward_op(true, in, out); });
}

}  // namespace sinter::cuda

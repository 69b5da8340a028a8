// CPU kernels of the reductions, softmax and cumsum (src/ops/reduce.cpp): each sees a contiguous
// (outer, inner) layout with the reduced dims last (rows_last) and runs a row kernel (cpu/reduce.cpp).
#include "core/dispatch.h"
#include "core/parallel.h"
#include "cpu/cpu.h"
#include "cpu/simd/lanes.h"
#include "ops/common.h"

namespace sinter::cpu {
namespace {

using detail::raw_reshape_contiguous;
using detail::raw_view;
using detail::reduce_dims;
using detail::wrap_dim;

void reduce_into(ReduceOp op, const Tensor& x, const Tensor& out, const Attrs& a) {
  const auto dims = reduce_dims("reduce", a.ints("dims"), x.dim());
  // Reduced dims that are one run of a contiguous tensor's dims: x is (P, R, C) as it lies, with R
  // reduced; rows where C = 1, column sums otherwise; no transposing copy.
  bool run = x.is_contiguous() && !dims.empty() && x.numel() > 0;
  for (size_t i = 1; run && i < dims.size(); ++i) run = dims[i] == dims[i - 1] + 1;
  if (run) {
    const auto [P, R, C] = around(x, dims.front(), dims.back());
    if (C == 1) return reduce_rows(op, raw_reshape_contiguous(x, Shape{P, R}), raw_reshape_contiguous(out, Shape{P}));
    if (op == ReduceOp::Sum) return sum_cols(raw_reshape_contiguous(x, Shape{P, R, C}), raw_reshape_contiguous(out, Shape{P * C}));
  }
  Tensor x2 = rows_last(x, dims);
  reduce_rows(op, x2, raw_reshape_contiguous(out, Shape{x2.size(0)}));
}

void sum_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) { reduce_into(ReduceOp::Sum, in[0], out[0], a); }
void prod_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) { reduce_into(ReduceOp::Prod, in[0], out[0], a); }
void logsumexp_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  reduce_into(ReduceOp::LogSumExp, in[0], out[0], a);
}

void mean_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  reduce_into(ReduceOp::Sum, in[0], out[0], a);
  int64_t n = 1;
  for (int64_t d : reduce_dims("mean", a.ints("dims"), in[0].dim())) n *= in[0].size(d);
  Tensor count = Tensor::empty({}, out[0].dtype());
  fill(count, double(n));
  binary(BinaryOp::Div, out[0], count, out[0]);
}

void var_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  Tensor x2 = rows_last(in[0], reduce_dims("var", a.ints("dims"), in[0].dim()));
  var_rows(x2, a.i("correction"), raw_reshape_contiguous(out[0], Shape{x2.size(0)}));
}

template <bool is_max, bool with_values> void arg_reduce_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const std::vector<int64_t> dims = in[0].dim() ? std::vector<int64_t>{wrap_dim("arg", a.i("dim"), in[0].dim())}
                                                : std::vector<int64_t>{};
  Tensor x2 = rows_last(in[0], dims);
  const Shape rows{x2.size(0)};
  Tensor idx = raw_reshape_contiguous(out[with_values ? 1 : 0], rows);
  arg_reduce_rows(is_max, x2, with_values ? raw_reshape_contiguous(out[0], rows) : Tensor(), idx);
}

// Writes the rows of `rows` (a contiguous (rest, dim) result) back into out through a permuted view.
void scatter_rows_back(const Tensor& rows, const Tensor& out, int64_t dim) {
  Shape ps, pst;
  for (int64_t i = 0; i < out.dim(); ++i)
    if (i != dim) { ps.push_back(out.size(i)); pst.push_back(out.stride(i)); }
  if (out.dim()) { ps.push_back(out.size(dim)); pst.push_back(out.stride(dim)); }
  copy(raw_reshape_contiguous(rows, ps), raw_view(out, ps, pst, out.offset()));
}

template <bool log> void softmax_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const Tensor& x = in[0];
  if (x.numel() == 0) return;
  const int64_t dim = x.dim() ? wrap_dim("softmax", a.i("dim"), x.dim()) : 0;
  if (x.dim() == 0 || dim == x.dim() - 1) {
    const int64_t inner = x.dim() ? x.size(-1) : 1;
    Tensor x2 = raw_reshape_contiguous(contiguous_as(x, x.dtype()), Shape{x.numel() / inner, inner});
    softmax_rows(x2, raw_reshape_contiguous(out[0], x2.shape()), log);
    return;
  }
  if (x.dtype() == DType::f32 && x.is_contiguous() && out[0].is_contiguous()) {  // (P, R, C) as it lies
    const auto [P, R, C] = around(x, dim, dim);
    const Shape s3{P, R, C};
    return softmax_cols(raw_reshape_contiguous(x, s3), raw_reshape_contiguous(out[0], s3), log);
  }
  Tensor x2 = rows_last(x, {dim});  // (rest, dim): compute, then scatter back
  Tensor tmp = Tensor::empty(x2.shape(), x.dtype());
  softmax_rows(x2, tmp, log);
  scatter_rows_back(tmp, out[0], dim);
}

template <bool log> void softmax_backward_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
  const int64_t inner = in[1].size(-1);
  if (in[1].numel() == 0) return;
  const Shape s2{in[1].numel() / inner, inner};
  softmax_backward_rows(raw_reshape_contiguous(contiguous_as(in[0], in[0].dtype()), s2),
                        raw_reshape_contiguous(contiguous_as(in[1], in[1].dtype()), s2), raw_reshape_contiguous(out[0], s2), log);
}

void causal_softmax_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const Tensor& x = in[0];
  if (x.numel() == 0) return;
  const int64_t inner = x.size(-1);
  const Shape s2{x.numel() / inner, inner};
  causal_softmax_rows(raw_reshape_contiguous(contiguous_as(x, x.dtype()), s2), raw_reshape_contiguous(out[0], s2), x.size(-2),
                      a.i("offset"), a.i_or("window", 0));
}

void cumsum_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const Tensor& x = in[0];
  if (x.numel() == 0) return;
  const int64_t dim = x.dim() ? wrap_dim("cumsum", a.i("dim"), x.dim()) : 0;
  Tensor x2 = rows_last(x, x.dim() ? std::vector<int64_t>{dim} : std::vector<int64_t>{});
  if (out[0].is_contiguous() && (x.dim() == 0 || dim == x.dim() - 1))  // rows as they lie in out
    return cumsum_rows(x2, raw_reshape_contiguous(out[0], x2.shape()));
  Tensor tmp = Tensor::empty(x2.shape(), out[0].dtype());
  cumsum_rows(x2, tmp);
  scatter_rows_back(tmp, out[0], dim);
}

// Each tensor's squares summed in double over per-thread blocks, then the blocks in order.
void sum_squares_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
  SINTER_KERNEL_ENTRY();
  double total = 0;
  for (const Tensor& t : in) {
    const Tensor c = contiguous_as(t, t.dtype());
    const int64_t n = c.numel(), blocks = std::max<int64_t>(1, std::min<int64_t>(64, n / 4096));
    std::vector<double> part(size_t(blocks), 0.0);
    visit_dtype(c.dtype(), [&]<class T>() {
      if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
        const T* p = c.data<T>();
        parallel_for(0, blocks, 1, [&](int64_t lo, int64_t hi) {
          for (int64_t b = lo; b < hi; ++b) {
            // kLanes partial sums: one chain of dependent adds ran at 4 cycles per element
            const T* q = p + b * n / blocks;
            part[size_t(b)] = simd::lane_sum<double>((b + 1) * n / blocks - b * n / blocks, [&](int64_t i) {
              const double x = double(compute_t<T>(q[i]));
              return x * x;
            });
          }
        });
      }
    });
    for (double s : part) total += s;
  }
  *out[0].data<double>() = total;
}

}  // namespace

void register_reduce_kernels() {
  detail::add_kernels(DeviceType::cpu, {{"sum", sum_kernel}, {"mean", mean_kernel}, {"prod", prod_kernel},
                                        {"logsumexp", logsumexp_kernel}, {"var", var_kernel},
                                        {"max_dim", arg_reduce_kernel<true, true>},
                                        {"min_dim", arg_reduce_kernel<false, true>},
                                        {"argmax", arg_reduce_kernel<true, false>},
                                        {"argmin", arg_reduce_kernel<false, false>},
                                        {"softmax", softmax_kernel<false>}, {"log_softmax", softmax_kernel<true>},
                                        {"softmax_backward", softmax_backward_kernel<false>},
                                        {"log_softmax_backward", softmax_backward_kernel<true>},
                                        {"causal_softmax", causal_softmax_kernel}, {"cumsum", cumsum_kernel},
                                        {"sum_squares", sum_squares_kernel}});
}

}  // namespace sinter::cpu

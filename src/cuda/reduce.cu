// CUDA kernels of the reductions and the softmax family (src/ops/reduce.cpp), as the CPU's
// (cpu/op_reduce.cpp): the reduced dims are moved last into a contiguous (rows, n) copy, and one
// block reduces each row (a thread, for rows of up to 16), accumulating in f32 (f16, bf16, f32),
// f64 or i64. sum, mean and prod over consecutive dims of a contiguous tensor with kept dims after
// them (a bias gradient's rows) read it in place, by columns. Sums add in another order than the CPU's, so they agree within
// the specs' tolerances, not bit for bit.
#include <algorithm>
#include <array>
#include <optional>
#include <span>

#include "core/view.h"
#include "cuda/block_reduce.cuh"
#include "cuda/launch.cuh"
#include "ops/common.h"
#include "sinter/op.h"

namespace sinter::cuda {
namespace {

using detail::raw_reshape_contiguous;

template <class S> struct acc_of { using type = std::conditional_t<std::is_integral_v<S>, int64_t, compute_t<S>>; };
template <> struct acc_of<bool> { using type = int64_t; };
template <class S> using acc_t = typename acc_of<S>::type;

template <Red R, class S> using red_acc_t = std::conditional_t<R == Red::max || R == Red::min, compute_t<S>, acc_t<S>>;

// *out = the combination v of n values, converted to O (mean: divided by n in O's type).
template <class O, class A> __device__ void finish(O* out, A v, int64_t n, bool mean) {
  const compute_t<O> r = convert_to<O>(v);
  store(out, mean ? compute_t<O>(r / compute_t<O>(n)) : r);
}

// out[row] = the combination of x[row, 0..n).
template <Red R, class S, class O> __global__ void reduce_rows_k(int64_t rows, int64_t n, const S* x, O* out, bool mean) {
  using A = red_acc_t<R, S>;
  SINTER_ROWS(row, rows) {
    A v = identity<R, A>();
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) v = combine<R>(v, A(load(x + row * n + j)));
    v = block_reduce<R>(v);
    if (threadIdx.x == 0) finish(out + row, v, n, mean);
  }
}

// The same for short rows (n <= kShortRow), a thread per row: a block per row would leave most
// of its threads idle (a 2:4 check sums millions of rows of four).
constexpr int64_t kShortRow = 16;

template <Red R, class S, class O> __global__ void reduce_short_rows_k(int64_t rows, int64_t n, const S* x, O* out, bool mean) {
  using A = red_acc_t<R, S>;
  SINTER_GRID_STRIDE(row, rows) {
    A v = identity<R, A>();
    for (int64_t j = 0; j < n; ++j) v = combine<R>(v, A(load(x + row * n + j)));
    finish(out + row, v, n, mean);
  }
}

// x (outer, n, inner) reduced over n, by columns: a block takes kTileCols columns of one outer
// index over one of `splits` runs of rows, kTileRows rows at a time (a warp reads consecutive
// columns). One split writes out; several write their partial results to part (outer, splits,
// inner), which combine_splits_k combines.
constexpr int kTileCols = 32, kTileRows = kBlock / kTileCols;

template <Red R, class S, class A, class O>
__global__ void reduce_cols_k(int64_t outer, int64_t n, int64_t inner, int64_t splits, const S* x, A* part, O* out, bool mean) {
  const int64_t tiles = (inner + kTileCols - 1) / kTileCols, per = (n + splits - 1) / splits;
  const int tx = threadIdx.x % kTileCols, ty = threadIdx.x / kTileCols;
  __shared__ A vals[kTileRows][kTileCols];
  for (int64_t b = blockIdx.x; b < outer * tiles * splits; b += gridDim.x) {
    const int64_t s = b % splits, c = b / splits % tiles * kTileCols + tx, o = b / splits / tiles;
    const int64_t end = (s + 1) * per < n ? (s + 1) * per : n;
    A v = identity<R, A>();
    if (c < inner)
      for (int64_t r = s * per + ty; r < end; r += kTileRows) v = combine<R>(v, A(load(x + (o * n + r) * inner + c)));
    vals[ty][tx] = v;
    __syncthreads();
    if (ty == 0 && c < inner) {
      for (int k = 1; k < kTileRows; ++k) v = combine<R>(v, vals[k][tx]);
      if (part) part[(o * splits + s) * inner + c] = v;
      else finish(out + o * inner + c, v, n, mean);
    }
    __syncthreads();  // vals is written again by the next tile
  }
}

template <Red R, class A, class O>
__global__ void combine_splits_k(int64_t count, int64_t inner, int64_t splits, int64_t n, const A* part, O* out, bool mean) {
  SINTER_GRID_STRIDE(i, count) {
    const A* p = part + i / inner * splits * inner + i % inner;
    A v = p[0];
    for (int64_t s = 1; s < splits; ++s) v = combine<R>(v, p[s * inner]);
    finish(out + i, v, n, mean);
  }
}

// logsumexp and var, two passes over the row in f32/f64.
template <class S> __global__ void logsumexp_rows_k(int64_t rows, int64_t n, const S* x, S* out) {
  using A = compute_t<S>;
  SINTER_ROWS(row, rows) {
    A m = identity<Red::max, A>();
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) m = combine<Red::max>(m, load(x + row * n + j));
    m = block_reduce<Red::max>(m);
    A s = 0;
    const A shift = isinf(m) ? A(0) : m;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s += ::exp(load(x + row * n + j) - shift);
    s = block_reduce<Red::sum>(s);
    if (threadIdx.x == 0) store(out + row, A(::log(s) + shift));
  }
}

template <class S> __global__ void var_rows_k(int64_t rows, int64_t n, const S* x, S* out, int64_t correction) {
  using A = compute_t<S>;
  SINTER_ROWS(row, rows) {
    A s = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s += load(x + row * n + j);
    const A mu = block_reduce<Red::sum>(s) / A(n);
    A q = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const A d = load(x + row * n + j) - mu;
      q += d * d;
    }
    q = block_reduce<Red::sum>(q);
    if (threadIdx.x == 0) store(out + row, A(q / A(n - correction)));
  }
}

// The value and first index of the row's max (min); NaN counts as the largest (smallest).
template <bool is_max, class S> __global__ void arg_rows_k(int64_t rows, int64_t n, const S* x, S* values, int64_t* index) {
  using A = compute_t<S>;
  SINTER_ROWS(row, rows) {
    A best = load(x + row * n);
    int64_t at = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const A v = load(x + row * n + j);
      const bool better = best == best && (v != v || (is_max ? v > best : v < best));
      if (better || (j < at && (v == best || (v != v && best != best)))) best = v, at = j;
    }
    __shared__ A bv[kBlock];
    __shared__ int64_t bi[kBlock];
    bv[threadIdx.x] = best, bi[threadIdx.x] = at;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int t = 1; t < blockDim.x && t < n; ++t) {
        const A v = bv[t];
        const bool better = best == best && (v != v || (is_max ? v > best : v < best));
        const bool tie = (v == best || (v != v && best != best)) && bi[t] < at;
        if (better || tie) best = v, at = bi[t];
      }
      if (values) store(values + row, best);
      index[row] = at;
    }
    __syncthreads();
  }
}

// out[row, j] = x[row, 0] + ... + x[row, j], accumulated as the CPU's cumsum does (in order, in
// acc_t), by one thread of the row's block: the op serves no model, so it stays simple.
template <class S, class O> __global__ void cumsum_rows_k(int64_t rows, int64_t n, const S* x, O* out) {
  SINTER_ROWS(row, rows) {
    if (threadIdx.x != 0) continue;
    acc_t<S> acc = 0;
    for (int64_t j = 0; j < n; ++j) {
      acc += acc_t<S>(load(x + row * n + j));
      store(out + row * n + j, convert_to<O>(acc));
    }
  }
}

// x with `dims` moved last, as a contiguous (rows, n) copy on the device.
Tensor rows_last(const Tensor& x, const std::vector<int64_t>& dims, int64_t* rows, int64_t* n) {
  Shape order;
  std::vector<bool> reduced(size_t(x.dim()), false);
  for (int64_t d : dims) reduced[size_t(d)] = true;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (!reduced[size_t(d)]) order.push_back(d);
  *n = 1;
  for (int64_t d : dims) order.push_back(d), *n *= x.size(d);
  *rows = *n ? x.numel() / *n : 0;
  return x.permute(order).contiguous();
}

// x as (outer, n, inner), n its reduced dims, where these are consecutive, x is contiguous and
// dims are kept after them (inner > 1); else nothing (the rows need a copy, or are in place).
std::optional<std::array<int64_t, 3>> middle_block(const Tensor& x, const std::vector<int64_t>& dims) {
  if (dims.empty() || !x.is_contiguous() || dims.back() - dims.front() + 1 != int64_t(dims.size())) return std::nullopt;
  std::array<int64_t, 3> s{1, 1, 1};
  for (int64_t d = 0; d < x.dim(); ++d) s[d < dims.front() ? 0 : d <= dims.back() ? 1 : 2] *= x.size(d);
  if (s[2] == 1) return std::nullopt;
  return s;
}

constexpr int64_t kColumnBlocks = 1024;  // blocks a column reduction aims for: several per SM on an H200
constexpr int64_t kSplitRows = 64;       // the fewest rows a split of one takes

// Calls fn with a value of out's storage type: a reduction of S makes S, or i64 (a sum of integers
// or bools), the only pairs its kernels are built for.
template <class S, class Fn> void dispatch_out(DType out, const char* op, Fn&& fn) {
  if (out == DType::i64) return fn(int64_t{});
  dispatch<Types::all>(out, op, [&](auto otag) {
    if constexpr (std::is_same_v<decltype(otag), S>) fn(otag);
    else SINTER_THROW(DTypeError, "[", op, "] has no CUDA kernel reducing into dtype ", out);
  });
}

// Reduces x (outer, n, inner) over n in place into out (outer * inner), by columns.
template <Red R> void reduce_columns(const char* op, const Tensor& x, std::array<int64_t, 3> s, const Tensor& out, bool mean) {
  const int64_t outer = s[0], n = s[1], inner = s[2];  // not bindings: lambdas capture them
  const int64_t tiles = (inner + kTileCols - 1) / kTileCols;
  const int64_t splits = std::clamp<int64_t>(kColumnBlocks / (outer * tiles), 1, std::max<int64_t>(1, n / kSplitRows));
  const unsigned blocks = unsigned(std::min<int64_t>(outer * tiles * splits, int64_t(1) << 16));
  const int device = out.device().index;
  dispatch<Types::all>(x.dtype(), op, [&](auto tag) {
    using S = decltype(tag);
    using A = red_acc_t<R, S>;
    dispatch_out<S>(out.dtype(), op, [&](auto otag) {
      using O = decltype(otag);
      if (splits == 1)
        return launch_kernel(op, reduce_cols_k<R, S, A, O>, blocks, kBlock, 0, stream(device), outer, n, inner, splits, ptr<const S>(x),
                             static_cast<A*>(nullptr), ptr<O>(out), mean);
      const Tensor part = Tensor::empty({outer * splits * inner * int64_t(sizeof(A))}, DType::u8, out.device());
      launch_kernel(op, reduce_cols_k<R, S, A, O>, blocks, kBlock, 0, stream(device), outer, n, inner, splits, ptr<const S>(x), ptr<A>(part),
                    static_cast<O*>(nullptr), mean);
      launch_n(op, outer * inner, device, combine_splits_k<R, A, O>, inner, splits, n, ptr<const A>(part), ptr<O>(out), mean);
    });
  });
}

template <Red R> void reduce_op(const char* op, std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a, bool mean = false) {
  int64_t rows = 0, n = 0;
  const auto dims = detail::reduce_dims(op, a.ints("dims"), in[0].dim());
  if (out[0].numel() == 0) return;
  if (const auto block = middle_block(in[0], dims)) return reduce_columns<R>(op, in[0], *block, out[0], mean);
  const Tensor x = rows_last(in[0], dims, &rows, &n);
  rows = out[0].numel();
  dispatch<Types::all>(x.dtype(), op, [&](auto tag) {
    using S = decltype(tag);
    dispatch_out<S>(out[0].dtype(), op, [&](auto otag) {
      using O = decltype(otag);
      if (n <= kShortRow)
        return launch_n(op, rows, out[0].device().index, reduce_short_rows_k<R, S, O>, n, ptr<const S>(x), ptr<O>(out[0]), mean);
      launch_rows(op, out[0], rows, reduce_rows_k<R, S, O>, n, ptr<const S>(x), ptr<O>(out[0]), mean);
    });
  });
}

template <bool is_max, bool with_values> void arg_op(const char* op, std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  int64_t rows = 0, n = 0;
  const std::vector<int64_t> dims = in[0].dim() ? std::vector<int64_t>{detail::wrap_dim(op, a.i("dim"), in[0].dim())} : std::vector<int64_t>{};
  const Tensor x = rows_last(in[0], dims, &rows, &n);
  rows = out[0].numel();
  dispatch<Types::all>(x.dtype(), op, [&](auto tag) {
    using S = decltype(tag);
    launch_rows(op, out[0], rows, arg_rows_k<is_max, S>, n, ptr<const S>(x), with_values ? ptr<S>(out[0]) : nullptr,
                ptr<int64_t>(out[with_values ? 1 : 0]));
  });
}

void cumsum_op(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  if (in[0].numel() == 0) return;
  const int64_t dim = in[0].dim() ? detail::wrap_dim("cumsum", a.i("dim"), in[0].dim()) : 0;
  int64_t rows = 0, n = 0;
  const Tensor x = rows_last(in[0], in[0].dim() ? std::vector<int64_t>{dim} : std::vector<int64_t>{}, &rows, &n);
  const Tensor sums = Tensor::empty(x.shape(), out[0].dtype(), x.device());
  dispatch<Types::all>(x.dtype(), "cumsum", [&](auto tag) {
    using S = decltype(tag);
    dispatch_out<S>(sums.dtype(), "cumsum", [&](auto otag) {
      using O = decltype(otag);
      launch_rows("cumsum", sums, rows, cumsum_rows_k<S, O>, n, ptr<const S>(x), ptr<O>(sums));
    });
  });
  Shape back;  // sums has dim last: move it back
  for (int64_t d = 0, k = 0; d < in[0].dim(); ++d) back.push_back(d == dim ? in[0].dim() - 1 : k++);
  copy_convert("cumsum", in[0].dim() ? sums.permute(back) : sums, out[0]);
}

void logsumexp_op(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  int64_t rows = 0, n = 0;
  const Tensor x = rows_last(in[0], detail::reduce_dims("logsumexp", a.ints("dims"), in[0].dim()), &rows, &n);
  dispatch<Types::floating>(x.dtype(), "logsumexp", [&](auto tag) {
    using S = decltype(tag);
    launch_rows("logsumexp", out[0], out[0].numel(), logsumexp_rows_k<S>, n, ptr<const S>(x), ptr<S>(out[0]));
  });
}

void var_op(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  int64_t rows = 0, n = 0;
  const Tensor x = rows_last(in[0], detail::reduce_dims("var", a.ints("dims"), in[0].dim()), &rows, &n);
  dispatch<Types::floating>(x.dtype(), "var", [&](auto tag) {
    using S = decltype(tag);
    launch_rows("var", out[0], out[0].numel(), var_rows_k<S>, n, ptr<const S>(x), ptr<S>(out[0]), a.i("correction"));
  });
}

}  // namespace

void register_reduce_kernels() {
  constexpr DeviceType kCuda = DeviceType::cuda;
  register_kernel("sum", kCuda, [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) { reduce_op<Red::sum>("sum", in, out, a); });
  register_kernel("mean", kCuda, [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) { reduce_op<Red::sum>("mean", in, out, a, true); });
  register_kernel("prod", kCuda, [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) { reduce_op<Red::prod>("prod", in, out, a); });
  register_kernel("logsumexp", kCuda, logsumexp_op);
  register_kernel("cumsum", kCuda, cumsum_op);
  register_kernel("var", kCuda, var_op);
  register_kernel("max_dim", kCuda, [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) { arg_op<true, true>("max_dim", in, out, a); });
  register_kernel("min_dim", kCuda, [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) { arg_op<false, true>("min_dim", in, out, a); });
  register_kernel("argmax", kCuda, [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) { arg_op<true, false>("argmax", in, out, a); });
  register_kernel("argmin", kCuda, [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) { arg_op<false, false>("argmin", in, out, a); });
}

}  // namespace sinter::cuda

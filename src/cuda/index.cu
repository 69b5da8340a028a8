// CUDA kernels of the indexing ops (src/ops/index.cpp) with the CPU's rules (cpu/op_index.cpp):
// index_select, gather, scatter_add (atomic adds), masked_fill, triangle, one_hot and multinomial
// (the CPU's inverse CDF in double and the same Philox draws: a thread per row, a block per row
// past 1024 probabilities); topk is topk.cu's.
// Indices are range-checked on the device (checked_indices); a bad one, and a row multinomial
// cannot draw from, is recorded as the device's fault and raised at the next wait.
#include <cuda_bf16.h>

#include <span>

#include "core/view.h"
#include "cuda/block_reduce.cuh"
#include "ops/common.h"
#include "sinter/op.h"
#include "sinter/random.h"

#define SINTER_HD __host__ __device__
#include "core/philox.h"

namespace sinter::cuda {
namespace {

struct Dims {  // an output's shape and an input's strides, for per-element coordinates
  int nd = 0;
  int64_t size[kMaxDims] = {}, xstride[kMaxDims] = {};
};
Dims dims_of(const Tensor& out, const Tensor& x) {
  Dims d;
  d.nd = int(out.dim());
  for (int i = 0; i < d.nd; ++i) d.size[i] = out.size(i), d.xstride[i] = x.stride(i);
  return d;
}

// out[c] = x[c with c[dim] = idx(c)], where idx(c) = index[c[dim]] (select) or index[c] (gather).
template <class S> __global__ void pick_k(int64_t n, Dims d, int dim, const S* x, const int64_t* index, S* out, bool gather) {
  SINTER_GRID_STRIDE(i, n) {
    int64_t rest = i, off = 0;
    for (int k = d.nd - 1; k >= 0; --k) {
      const int64_t c = rest % d.size[k];
      rest /= d.size[k];
      off += (k == dim ? (gather ? index[i] : index[c]) : c) * d.xstride[k];
    }
    out[i] = x[off];
  }
}

template <class S> __device__ void atomic_add(S* p, S v) {
  if constexpr (std::is_same_v<S, BF16>) atomicAdd(reinterpret_cast<__nv_bfloat16*>(p), __float2bfloat16_rn(load(&v)));
  else if constexpr (std::is_same_v<S, int64_t>) atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
  else atomicAdd(p, v);
}

// out (a contiguous copy of x) [c with c[dim] = index[c]] += src[c]; index and src contiguous.
template <class S> __global__ void scatter_add_k(int64_t n, Dims d, int dim, const int64_t* index, const S* src, S* out) {
  SINTER_GRID_STRIDE(i, n) {
    int64_t rest = i, off = 0;
    for (int k = d.nd - 1; k >= 0; --k) {
      const int64_t c = rest % d.size[k];
      rest /= d.size[k];
      off += (k == dim ? index[i] : c) * d.xstride[k];
    }
    atomic_add(out + off, src[i]);
  }
}

template <class S> __global__ void triangle_k(int64_t n, const S* x, S* y, int64_t rows, int64_t cols, int64_t diagonal, bool upper) {
  SINTER_GRID_STRIDE(i, n) {
    const int64_t j = i % cols, r = (i / cols) % rows;
    const bool keep = upper ? j - r >= diagonal : j - r <= diagonal;
    y[i] = keep ? x[i] : S{};
  }
}

// out = idx, each value out of [0, n) (and not `ignore`) recorded as the device's fault (the
// first one found) and replaced by `safe`.
__global__ void check_indices_k(int64_t count, const int64_t* idx, int64_t* out, int64_t n, int64_t ignore, int64_t safe,
                                DeviceFault* fault, const char* op, const char* what) {
  SINTER_GRID_STRIDE(i, count) {
    const int64_t v = idx[i];
    const bool ok = v == ignore || (v >= 0 && v < n);
    out[i] = ok ? v : safe;
    if (!ok) record_fault(fault, {1, v, i, n, 0, op, what});
  }
}

__global__ void one_hot_k(int64_t n, const int64_t* idx, int64_t* out, int64_t C) {
  SINTER_GRID_STRIDE(i, n) out[i] = idx[i / C] == i % C ? 1 : 0;
}

// The inverse CDF over w[from, P), acc the mass before it: the first positive entry whose running
// sum passes u, skipping empty categories (the last positive one where rounding leaves u above).
__device__ int64_t inverse_cdf(const double* w, int64_t from, int64_t P, double u, double acc) {
  int64_t pick = -1;
  for (int64_t i = from; i < P; ++i) {
    if (w[i] <= 0) continue;
    acc += w[i];
    pick = i;
    if (u < acc) break;
  }
  return pick;
}

// A row whose probabilities cannot be drawn from (negative or not finite, none positive, too few
// for draws without replacement) is recorded as the device's fault with the reason, its draws 0.
struct MultinomialReasons {  // host strings, carried through untouched
  const char* op;
  const char* bad;
  const char* none;
  const char* few;
};
__global__ void multinomial_k(int64_t R, const double* p, int64_t P, int64_t n, bool repl, uint64_t seed, uint64_t counter, double* w,
                              int64_t* out, DeviceFault* fault, MultinomialReasons why) {
  SINTER_GRID_STRIDE(r, R) {
    double total = 0;
    int64_t positive = 0;
    const char* wrong = nullptr;
    for (int64_t i = 0; i < P; ++i) {
      const double v = p[r * P + i];
      if (!isfinite(v) || v < 0) wrong = why.bad;
      total += v, positive += v > 0;
      w[r * P + i] = v;
    }
    if (!wrong && !(total > 0)) wrong = why.none;
    if (!wrong && !repl && positive < n) wrong = why.few;
    if (wrong) {
      for (int64_t s = 0; s < n; ++s) out[r * n + s] = 0;
      record_fault(fault, {1, r, 0, R, -1, why.op, wrong});
      continue;
    }
    double* wr = w + r * P;
    for (int64_t s = 0; s < n; ++s) {
      double t = 0;
      for (int64_t i = 0; i < P; ++i) t += wr[i];
      const double u = double(detail::philox_uniform(seed, counter, uint64_t(r * n + s))) * t;
      const int64_t pick = inverse_cdf(wr, 0, P, u, 0.0);
      out[r * n + s] = pick;
      if (!repl) wr[pick] = 0;
    }
  }
}

// The same for rows longer than kThreadRowUpTo, a block per row: the checks and the total are
// block-wide, and each draw's inverse CDF runs by runs: thread k sums its run of P / kBlock
// probabilities, a scan of the runs' sums finds the one whose range holds u, and its thread walks
// it as the one-thread kernel walks the row. The sums add in another order than the CPU's, so a
// draw can differ from its only where u lies within rounding of a boundary.
constexpr int64_t kThreadRowUpTo = 1024;

__global__ void multinomial_rows_k(int64_t R, const double* p, int64_t P, int64_t n, bool repl, uint64_t seed, uint64_t counter,
                                   double* w, int64_t* out, DeviceFault* fault, MultinomialReasons why) {
  __shared__ double ends[kBlock];  // the runs' inclusive scan
  const int64_t per = (P + kBlock - 1) / kBlock, lo = threadIdx.x * per, hi = lo + per < P ? lo + per : P;
  SINTER_ROWS(r, R) {
    const double* pr = p + r * P;
    double* wr = w + r * P;
    double total = 0;
    int64_t positive = 0, bad = 0;
    for (int64_t i = lo; i < hi; ++i) {
      const double v = pr[i];
      bad |= !isfinite(v) || v < 0;
      total += v, positive += v > 0;
      wr[i] = v;
    }
    bad = block_reduce<Red::max>(bad), total = block_reduce<Red::sum>(total), positive = block_reduce<Red::sum>(positive);
    const char* wrong = bad ? why.bad : !(total > 0) ? why.none : !repl && positive < n ? why.few : nullptr;
    if (wrong) {
      if (threadIdx.x == 0) {
        for (int64_t s = 0; s < n; ++s) out[r * n + s] = 0;
        record_fault(fault, {1, r, 0, R, -1, why.op, wrong});
      }
      continue;
    }
    for (int64_t s = 0; s < n; ++s) {
      double mine = 0;
      for (int64_t i = lo; i < hi; ++i) mine += wr[i];
      ends[threadIdx.x] = mine;
      __syncthreads();
      for (int off = 1; off < kBlock; off *= 2) {
        const double add = threadIdx.x >= off ? ends[threadIdx.x - off] : 0.0;
        __syncthreads();
        ends[threadIdx.x] += add;
        __syncthreads();
      }
      const double u = double(detail::philox_uniform(seed, counter, uint64_t(r * n + s))) * ends[kBlock - 1];
      const double start = threadIdx.x ? ends[threadIdx.x - 1] : 0.0;
      if (start <= u && u < ends[threadIdx.x]) {  // one run's range holds u (empty runs hold none)
        const int64_t pick = inverse_cdf(wr, lo, P, u, start);  // past the run only where its rounding fell short of u
        out[r * n + s] = pick;
        if (!repl) wr[pick] = 0;
      }
      __syncthreads();  // ends and w are read again by the next draw
    }
  }
}

void pick_op(const char* op, bool gather, std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const Tensor& x = in[0];
  const int dim = int(detail::wrap_dim(op, a.i("dim"), x.dim()));
  const Tensor idx = checked_indices(op, in[1], x.size(dim), "index");
  const Dims d = dims_of(out[0], x);
  dispatch<Types::all>(x.dtype(), op, [&](auto tag) {
    using S = decltype(tag);
    launch(op, out[0], pick_k<S>, d, dim, ptr<const S>(x), ptr<const int64_t>(idx), ptr<S>(out[0]), gather);
  });
}

void scatter_add_op(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const int dim = int(detail::wrap_dim("scatter_add", a.i("dim"), in[0].dim()));
  copy_convert("scatter_add", in[0], out[0]);
  const Tensor idx = checked_indices("scatter_add", in[1], in[0].size(dim), "index"), src = in[2].contiguous();
  Dims d = dims_of(src, out[0]);
  switch (out[0].dtype()) {
    case DType::f32: launch("scatter_add", src, scatter_add_k<float>, d, dim, ptr<const int64_t>(idx), ptr<const float>(src), ptr<float>(out[0])); break;
    case DType::f64: launch("scatter_add", src, scatter_add_k<double>, d, dim, ptr<const int64_t>(idx), ptr<const double>(src), ptr<double>(out[0])); break;
    case DType::bf16: launch("scatter_add", src, scatter_add_k<BF16>, d, dim, ptr<const int64_t>(idx), ptr<const BF16>(src), ptr<BF16>(out[0])); break;
    case DType::i32: launch("scatter_add", src, scatter_add_k<int32_t>, d, dim, ptr<const int64_t>(idx), ptr<const int32_t>(src), ptr<int32_t>(out[0])); break;
    case DType::i64: launch("scatter_add", src, scatter_add_k<int64_t>, d, dim, ptr<const int64_t>(idx), ptr<const int64_t>(src), ptr<int64_t>(out[0])); break;
    default: SINTER_THROW(DTypeError, "[scatter_add] has no CUDA kernel for dtype ", out[0].dtype());
  }
}

void masked_fill_op(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const Tensor value = full({}, a.f("value"), in[0].dtype(), in[0].device());
  where_into("masked_fill", in[1], value, in[0], out[0]);
}

void triangle_op(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const Tensor x = in[0].contiguous();
  dispatch<Types::all>(x.dtype(), "triangle", [&](auto tag) {
    using S = decltype(tag);
    launch("triangle", out[0], triangle_k<S>, ptr<const S>(x), ptr<S>(out[0]), x.size(-2), x.size(-1), a.i("diagonal"), a.b("upper"));
  });
}

void one_hot_op(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const int64_t C = a.i("num_classes");
  const Tensor idx = checked_indices("one_hot", in[0], C, "index");
  launch("one_hot", out[0], one_hot_k, ptr<const int64_t>(idx), ptr<int64_t>(out[0]), C);
}

void multinomial_op(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const Tensor p = in[0].to(DType::f64).contiguous();
  const int64_t P = p.size(-1), R = p.numel() / std::max<int64_t>(P, 1), n = a.i("num_samples");
  const Tensor w = Tensor::empty({R, P}, DType::f64, p.device()), rows = Tensor::empty({R}, DType::u8, p.device());  // sizes the launch
  const MultinomialReasons why{"multinomial", "has a probability that is negative or not finite", "has no positive probability",
                               "has too few non-zero probabilities for its samples without replacement"};
  const uint64_t seed = uint64_t(a.i("seed")), counter = uint64_t(a.i("counter"));
  if (P > kThreadRowUpTo)
    return launch_rows("multinomial", rows, R, multinomial_rows_k, ptr<const double>(p), P, n, a.b("replacement"), seed, counter,
                       ptr<double>(w), ptr<int64_t>(out[0]), device_fault(p.device().index), why);
  launch("multinomial", rows, multinomial_k, ptr<const double>(p), P, n, a.b("replacement"), seed, counter, ptr<double>(w),
         ptr<int64_t>(out[0]), device_fault(p.device().index), why);
}

}  // namespace

Tensor checked_indices(const char* op, const Tensor& idx, int64_t n, const char* what, int64_t ignore) {
  const Tensor i64 = idx.dtype() == DType::i64 ? idx.contiguous() : idx.to(DType::i64).contiguous();
  Tensor out = Tensor::empty(i64.shape(), DType::i64, i64.device());
  const int64_t safe = ignore == INT64_MIN ? 0 : ignore;
  launch(op, out, check_indices_k, ptr<const int64_t>(i64), ptr<int64_t>(out), n, ignore, safe, device_fault(out.device().index), op, what);
  return out;
}

void register_index_kernels() {
  constexpr DeviceType kCuda = DeviceType::cuda;
  register_kernel("index_select", kCuda, [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
    pick_op("index_select", false, in, out, a);
  });
  register_kernel("gather", kCuda, [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) { pick_op("gather", true, in, out, a); });
  register_kernel("scatter_add", kCuda, scatter_add_op);
  register_kernel("masked_fill", kCuda, masked_fill_op);
  register_kernel("triangle", kCuda, triangle_op);
  register_kernel("one_hot", kCuda, one_hot_op);
  register_kernel("multinomial", kCuda, multinomial_op);
}

}  // namespace sinter::cuda

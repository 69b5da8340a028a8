// CUDA kernels of the neural-network ops (src/ops/nn.cpp), with the CPU's formulas (cpu/nn.cpp):
// embedding and its backward (atomic adds, in f32 for bf16/f16), layer_norm and rms_norm and their
// fused backward (one block per row; dw and db summed over rows by the sum kernel), rotary
// embedding, cross-entropy and its backward, dropout from the CPU's Philox mask, rope_cos_sin.
// Indices and targets are range-checked on the host (a copy each call) before a kernel reads them.
#include <span>

#include "core/view.h"
#include "cuda/block_reduce.cuh"
#include "ops/common.h"
#include "sinter/op.h"

#define SINTER_HD __host__ __device__
#include "core/philox.h"
#include "ops/scalar_fns.h"

namespace sinter::cuda {
namespace {

using detail::raw_reshape_contiguous;

// (rows, D) contiguous on the device.
Tensor rows2d(const Tensor& x) {
  const int64_t D = x.dim() ? x.size(-1) : 1;
  const Tensor c = x.contiguous();
  return raw_reshape_contiguous(c, Shape{D ? x.numel() / D : 0, D});
}

template <class S> __global__ void embedding_k(int64_t n, const S* w, const int64_t* idx, S* out, int64_t D) {
  SINTER_GRID_STRIDE(i, n) out[i] = w[idx[i / D] * D + i % D];
}

template <class A, class S> __global__ void embedding_backward_k(int64_t n, const S* g, const int64_t* idx, A* out, int64_t D) {
  SINTER_GRID_STRIDE(i, n) atomicAdd(out + idx[i / D] * D + i % D, A(load(g + i)));
}

// A row's mean (0 for rms_norm) and 1 / sqrt(mean((x - mean)^2) + eps), as the CPU's.
template <class S> __device__ void row_stats(const S* xr, int64_t D, double eps, bool layer, compute_t<S>& m, compute_t<S>& rstd) {
  using C = compute_t<S>;
  m = 0;
  if (layer) {
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) m += load(xr + i);
    m = block_reduce<Red::sum>(m) / C(D);
  }
  C q = 0;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
    const C d = C(load(xr + i)) - m;
    q += d * d;
  }
  rstd = C(1) / ::sqrt(block_reduce<Red::sum>(q) / C(D) + C(eps));
}

template <class S> __global__ void layer_norm_k(int64_t rows, int64_t D, const S* x, const S* w, const S* b, S* y, double eps, bool layer) {
  using C = compute_t<S>;
  SINTER_ROWS(r, rows) {
    const S* xr = x + r * D;
    C m, rstd;
    row_stats(xr, D, eps, layer, m, rstd);
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
      const C v = (C(load(xr + i)) - m) * rstd * C(load(w + i));
      store(y + r * D + i, b ? C(v + C(load(b + i))) : v);
    }
  }
}

// dx per row; g xh (for dw) into gx, in the compute type. xh = (x - mean) rstd, gh = g w:
// dx = rstd (gh - mean(gh) - xh mean(gh xh)) (rms_norm: mean = 0 and no mean(gh) term).
template <class S> __global__ void norm_backward_k(int64_t rows, int64_t D, const S* g, const S* x, const S* w, S* dx, compute_t<S>* gx,
                                                   double eps, bool layer) {
  using C = compute_t<S>;
  SINTER_ROWS(r, rows) {
    const S *xr = x + r * D, *gr = g + r * D;
    C m, rstd;
    row_stats(xr, D, eps, layer, m, rstd);
    C sg = 0, sgx = 0;
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
      const C xh = (C(load(xr + i)) - m) * rstd, gi = load(gr + i), gh = gi * C(load(w + i));
      sg += gh, sgx += gh * xh;
      gx[r * D + i] = gi * xh;
    }
    const C mg = layer ? block_reduce<Red::sum>(sg) / C(D) : C(0), mgx = block_reduce<Red::sum>(sgx) / C(D);
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
      const C xh = (C(load(xr + i)) - m) * rstd, gh = C(load(gr + i)) * C(load(w + i));
      store(dx + r * D + i, C(rstd * (gh - mg - xh * mgx)));
    }
  }
}

template <class S> __global__ void rotary_k(int64_t n, const S* x, const S* cs, const S* sn, S* y, int64_t T, int64_t H) {
  using C = compute_t<S>;
  SINTER_GRID_STRIDE(k, n) {  // k = (row * T + t) * H + i
    const int64_t i = k % H, rt = k / H, t = rt % T;
    const S* xr = x + rt * 2 * H;
    const C c = load(cs + t * H + i), s = load(sn + t * H + i), a = load(xr + i), b = load(xr + i + H);
    store(y + rt * 2 * H + i, C(a * c - b * s));
    store(y + rt * 2 * H + i + H, C(b * c + a * s));
  }
}

// Per row: log-sum-exp and the sum of the logits (for label smoothing), in the compute type.
template <class S> __device__ void row_lse(const S* row, int64_t C_, compute_t<S>& lse, compute_t<S>& total) {
  using A = compute_t<S>;
  A m = identity<Red::max, A>();
  for (int64_t i = threadIdx.x; i < C_; i += blockDim.x) m = combine<Red::max>(m, load(row + i));
  m = block_reduce<Red::max>(m);
  const A mm = isinf(m) ? A(0) : m;
  A s = 0, t = 0;
  for (int64_t i = threadIdx.x; i < C_; i += blockDim.x) s += fn::exp_(A(load(row + i)) - mm), t += load(row + i);
  s = block_reduce<Red::sum>(s), total = block_reduce<Red::sum>(t);
  lse = mm + ::log(s);
}

template <class S> __global__ void ce_rows_k(int64_t rows, int64_t C_, const S* x, const int64_t* t, double* loss, int64_t ignore, double eps) {
  SINTER_ROWS(r, rows) {
    if (t[r] == ignore) {
      if (threadIdx.x == 0) loss[r] = 0;
      continue;
    }
    compute_t<S> lse, total;
    row_lse(x + r * C_, C_, lse, total);
    if (threadIdx.x == 0) loss[r] = double(lse) - (1.0 - eps) * double(load(x + r * C_ + t[r])) - eps * double(total) / double(C_);
  }
}

// out = the mean of the counted rows' losses (0/0 = NaN when none counts, as PyTorch); count saved.
// Without loss (the backward) it only counts.
template <class S> __global__ void ce_mean_k(int64_t rows, const double* loss, const int64_t* t, int64_t ignore, S* out, double* count) {
  double s = 0, c = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x)
    if (t[r] != ignore) s += loss ? loss[r] : 0.0, c += 1;
  s = block_reduce<Red::sum>(s), c = block_reduce<Red::sum>(c);
  if (threadIdx.x == 0) {
    if (out) store(out, compute_t<S>(s / c));
    if (count) *count = c;
  }
}

template <class S> __global__ void ce_backward_k(int64_t rows, int64_t C_, const S* x, const int64_t* t, const S* g, const double* count,
                                                 S* dx, int64_t ignore, double eps) {
  using A = compute_t<S>;
  SINTER_ROWS(r, rows) {
    S* drow = dx + r * C_;
    if (t[r] == ignore) {
      for (int64_t i = threadIdx.x; i < C_; i += blockDim.x) store(drow + i, A(0));
      continue;
    }
    A lse, total;
    row_lse(x + r * C_, C_, lse, total);
    const A scale = A(double(load(g)) / *count), off = A(eps / double(C_)), on = A(1.0 - eps);
    for (int64_t i = threadIdx.x; i < C_; i += blockDim.x) {
      const A v = (fn::exp_(A(load(x + r * C_ + i)) - lse) - off) * scale;
      store(drow + i, i == t[r] ? A(compute_t<S>(v) - on * scale) : v);
    }
  }
}

template <class S> __global__ void dropout_k(int64_t n, const S* x, S* y, float p, uint64_t seed, uint64_t ctr) {
  using C = compute_t<S>;
  const C scale = p < 1.0f ? C(1.0 / (1.0 - double(p))) : C(0);
  SINTER_GRID_STRIDE(i, n) {
    uint32_t r[4];
    detail::philox_block(seed, ctr + uint64_t(i / 4), r);
    const float u = float(r[i % 4] >> 8) * (1.0f / 16777216.0f);
    store(y + i, u >= p ? C(C(load(x + i)) * scale) : C(0));
  }
}

__global__ void rope_k(int64_t n, float* out, int64_t H, int64_t dim, double theta, bool want_sin) {
  SINTER_GRID_STRIDE(k, n) {
    const double ang = double(k / H) * ::pow(theta, -2.0 * double(k % H) / double(dim));
    out[k] = float(want_sin ? ::sin(ang) : ::cos(ang));
  }
}

void embedding_op(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
  const Tensor w = in[0].contiguous(), idx = checked_indices("embedding", in[1], in[0].size(0), "index");
  dispatch<Types::all>(w.dtype(), "embedding", [&](auto tag) {
    using S = decltype(tag);
    launch("embedding", out[0], embedding_k<S>, ptr<const S>(w), ptr<const int64_t>(idx), ptr<S>(out[0]), w.size(1));
  });
}

void embedding_backward_op(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
  const Tensor g = in[0].contiguous(), idx = checked_indices("embedding_backward", in[1], out[0].size(0), "index");
  const bool wide = out[0].dtype() == DType::f64;
  const Tensor acc = out[0].dtype() == DType::f32 || wide ? out[0] : Tensor::empty(out[0].shape(), DType::f32, out[0].device());
  SINTER_CUDA_CHECK(cudaMemsetAsync(acc.data_ptr(), 0, size_t(acc.numel() * dtype_size(acc.dtype())), stream(acc.device().index)));
  dispatch<Types::floating>(g.dtype(), "embedding_backward", [&](auto tag) {
    using S = decltype(tag);
    if (wide) launch("embedding_backward", g, embedding_backward_k<double, S>, ptr<const S>(g), ptr<const int64_t>(idx), ptr<double>(acc), g.size(-1));
    else launch("embedding_backward", g, embedding_backward_k<float, S>, ptr<const S>(g), ptr<const int64_t>(idx), ptr<float>(acc), g.size(-1));
  });
  if (!acc.same(out[0])) copy_convert("embedding_backward", acc, out[0]);
}

void norm_op(bool layer, std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  if (in[0].numel() == 0) return;
  const Tensor x = rows2d(in[0]), w = in[1].contiguous(), b = layer ? in[2].contiguous() : Tensor();
  dispatch<Types::floating>(x.dtype(), layer ? "layer_norm" : "rms_norm", [&](auto tag) {
    using S = decltype(tag);
    launch_rows("layer_norm", out[0], x.size(0), layer_norm_k<S>, x.size(1), ptr<const S>(x), ptr<const S>(w),
                layer ? ptr<const S>(b) : nullptr, ptr<S>(out[0]), a.f("eps"), layer);
  });
}

void norm_backward_op(bool layer, std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const Tensor g = rows2d(in[0]), x = rows2d(in[1]), w = in[2].contiguous();
  const DType ct = compute_dtype(x.dtype());
  const Tensor gx = Tensor::empty(x.shape(), ct, x.device());
  const char* op = layer ? "layer_norm_backward" : "rms_norm_backward";
  if (x.numel() > 0)
    dispatch<Types::floating>(x.dtype(), op, [&](auto tag) {
      using S = decltype(tag);
      launch_rows(op, out[0], x.size(0), norm_backward_k<S>, x.size(1), ptr<const S>(g), ptr<const S>(x), ptr<const S>(w), ptr<S>(out[0]),
                  ptr<compute_t<S>>(gx), a.f("eps"), layer);
    });
  copy_convert(op, sum(gx, {0}), out[1]);
  if (layer) copy_convert(op, sum(g, {0}), out[2]);  // accumulated in ct all the same
}

void rotary_op(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
  const Tensor& x0 = in[0];
  if (x0.numel() == 0) return;
  const Tensor x = x0.contiguous(), cs = in[1].contiguous(), sn = in[2].contiguous();
  const int64_t T = x.size(-2), H = x.size(-1) / 2;
  dispatch<Types::floating>(x.dtype(), "rotary_embedding", [&](auto tag) {
    using S = decltype(tag);
    const int64_t n = x.numel() / 2;
    if (n == 0) return;
    launch_kernel("rotary_embedding", rotary_k<S>, unsigned(std::min<int64_t>((n + 255) / 256, 65536)), 256, 0, stream(x.device().index), n,
                  ptr<const S>(x), ptr<const S>(cs), ptr<const S>(sn), ptr<S>(out[0]), T, H);
  });
}

struct CeArgs {
  Tensor x, t;
  int64_t ignore;
  double eps;
};
CeArgs ce_args(const char* op, std::span<const Tensor> in, const Attrs& a) {
  const Tensor x = rows2d(in[0]);
  const int64_t ignore = a.i("ignore_index");
  return {x, checked_indices(op, in[1].reshape({-1}), x.size(1), "target", ignore), ignore, a.f("label_smoothing")};
}

void cross_entropy_op(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const CeArgs c = ce_args("cross_entropy", in, a);
  const int64_t rows = c.x.size(0);
  const Tensor loss = Tensor::empty({rows}, DType::f64, c.x.device());
  dispatch<Types::floating>(c.x.dtype(), "cross_entropy", [&](auto tag) {
    using S = decltype(tag);
    launch_rows("cross_entropy", loss, rows, ce_rows_k<S>, c.x.size(1), ptr<const S>(c.x), ptr<const int64_t>(c.t), ptr<double>(loss),
                c.ignore, c.eps);
    launch_kernel("cross_entropy", ce_mean_k<S>, 1, kBlock, 0, stream(loss.device().index), rows, ptr<const double>(loss),
                  ptr<const int64_t>(c.t), c.ignore, ptr<S>(out[0]), static_cast<double*>(nullptr));
  });
}

void cross_entropy_backward_op(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const CeArgs c = ce_args("cross_entropy_backward", in, a);
  const int64_t rows = c.x.size(0);
  const Tensor count = Tensor::empty({}, DType::f64, c.x.device()), g = in[2].contiguous();
  dispatch<Types::floating>(c.x.dtype(), "cross_entropy_backward", [&](auto tag) {
    using S = decltype(tag);
    launch_kernel("cross_entropy_backward", ce_mean_k<S>, 1, kBlock, 0, stream(count.device().index), rows, static_cast<const double*>(nullptr),
                  ptr<const int64_t>(c.t), c.ignore, static_cast<S*>(nullptr), ptr<double>(count));
    launch_rows("cross_entropy_backward", out[0], rows, ce_backward_k<S>, c.x.size(1), ptr<const S>(c.x), ptr<const int64_t>(c.t),
                ptr<const S>(g), ptr<const double>(count), ptr<S>(out[0]), c.ignore, c.eps);
  });
}

void dropout_op(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const Tensor x = in[0].contiguous();
  dispatch<Types::floating>(x.dtype(), "dropout", [&](auto tag) {
    using S = decltype(tag);
    launch("dropout", out[0], dropout_k<S>, ptr<const S>(x), ptr<S>(out[0]), float(a.f("p")), uint64_t(a.i("seed")), uint64_t(a.i("counter")));
  });
}

void rope_op(std::span<const Tensor>, std::span<Tensor> out, const Attrs& a) {
  launch("rope_cos_sin", out[0], rope_k, ptr<float>(out[0]), a.i("dim") / 2, a.i("dim"), a.f("theta"), a.b("sin"));
}

}  // namespace

void register_nn_kernels() {
  constexpr DeviceType kCuda = DeviceType::cuda;
  register_kernel("embedding", kCuda, embedding_op);
  register_kernel("embedding_backward", kCuda, embedding_backward_op);
  register_kernel("layer_norm", kCuda, [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) { norm_op(true, in, out, a); });
  register_kernel("rms_norm", kCuda, [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) { norm_op(false, in, out, a); });
  register_kernel("layer_norm_backward", kCuda,
                  [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) { norm_backward_op(true, in, out, a); });
  register_kernel("rms_norm_backward", kCuda,
                  [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) { norm_backward_op(false, in, out, a); });
  register_kernel("rotary_embedding", kCuda, rotary_op);
  register_kernel("cross_entropy", kCuda, cross_entropy_op);
  register_kernel("cross_entropy_backward", kCuda, cross_entropy_backward_op);
  register_kernel("dropout", kCuda, dropout_op);
  register_kernel("rope_cos_sin", kCuda, rope_op);
}

}  // namespace sinter::cuda

// CUDA kernels of the optimizer updates (src/optim/update_ops.cpp) and sum_squares: one pass over
// each parameter with the CPU's formulas (cpu/op_optim.cpp), the learning rate and step read from
// their 0-d device tensors by each block, so a step never waits for the host.
#include <span>

#include "cuda/block_reduce.cuh"
#include "sinter/op.h"

namespace sinter::cuda {
namespace {

// PyTorch's order: decay, moments, then the bias-corrected step.
__global__ void adamw_k(int64_t n, float* w, float* m, float* v, const float* g, const double* lr_p, const int64_t* step_p, double beta1,
                        double beta2, double eps_d, double wd) {
  __shared__ float k[3];  // step size, sqrt(bias correction 2), decay
  if (threadIdx.x == 0) {
    const double lr = *lr_p, step = double(*step_p);
    k[0] = float(lr / (1.0 - ::pow(beta1, step)));
    k[1] = float(::sqrt(1.0 - ::pow(beta2, step)));
    k[2] = float(1.0 - lr * wd);
  }
  __syncthreads();
  const float b1 = float(beta1), b2 = float(beta2), eps = float(eps_d);
  SINTER_GRID_STRIDE(i, n) {
    float wi = w[i] * k[2];
    const float mi = b1 * m[i] + (1 - b1) * g[i], vi = b2 * v[i] + (1 - b2) * g[i] * g[i];
    w[i] = wi - k[0] * mi / (::sqrtf(vi) / k[1] + eps);
    m[i] = mi, v[i] = vi;
  }
}

template <bool momentum> __global__ void sgd_k(int64_t n, float* p, float* buf, const float* g, const double* lr, float wd, float mom, bool nesterov) {
  const float neg_lr = float(-*lr);
  SINTER_GRID_STRIDE(i, n) {
    float d = wd != 0 ? g[i] + p[i] * wd : g[i];
    if constexpr (momentum) {
      buf[i] = buf[i] * mom + d;
      d = nesterov ? d + buf[i] * mom : buf[i];
    }
    p[i] = p[i] + d * neg_lr;
  }
}

template <class S> __global__ void sum_squares_k(int64_t n, const S* x, double* out) {
  double s = 0;
  SINTER_GRID_STRIDE(i, n) {
    const double v = double(load(x + i));
    s += v * v;
  }
  s = block_reduce<Red::sum>(s);
  if (threadIdx.x == 0) atomicAdd(out, s);
}

void require_contiguous(const char* op, std::span<const Tensor> ts) {
  for (const Tensor& t : ts) SINTER_CHECK(t.is_contiguous(), "[", op, "] CUDA updates take contiguous tensors, got strides ", t.strides());
}

void adamw_op(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  require_contiguous("adamw_update", out);
  const Tensor g = in[1].contiguous();
  launch("adamw_update", out[0], adamw_k, ptr<float>(out[0]), ptr<float>(out[1]), ptr<float>(out[2]), ptr<const float>(g),
         ptr<const double>(in[4]), ptr<const int64_t>(in[5]), a.f("beta1"), a.f("beta2"), a.f("eps"), a.f("weight_decay"));
}

template <bool momentum> void sgd_op(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  require_contiguous("sgd_update", out);
  const Tensor g = in[1].contiguous();
  launch("sgd_update", out[0], sgd_k<momentum>, ptr<float>(out[0]), momentum ? ptr<float>(out[1]) : nullptr, ptr<const float>(g),
         ptr<const double>(in[momentum ? 3 : 2]), float(a.f("weight_decay")), momentum ? float(a.f("momentum")) : 0.0f,
         momentum && a.b("nesterov"));
}

void sum_squares_op(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
  SINTER_CUDA_CHECK(cudaMemsetAsync(out[0].data_ptr(), 0, sizeof(double), stream(out[0].device().index)));
  for (const Tensor& t : in) {
    const Tensor x = t.contiguous();
    if (x.numel() == 0) continue;
    dispatch<Types::floating>(x.dtype(), "sum_squares", [&](auto tag) {
      using S = decltype(tag);
      launch_kernel("sum_squares", sum_squares_k<S>, unsigned(std::min<int64_t>((x.numel() + kBlock - 1) / kBlock, 1024)), kBlock, 0,
                    stream(x.device().index), x.numel(), ptr<const S>(x), ptr<double>(out[0]));
    });
  }
}

}  // namespace

void register_update_kernels() {
  constexpr DeviceType kCuda = DeviceType::cuda;
  register_kernel("adamw_update", kCuda, adamw_op);
  register_kernel("sgd_update", kCuda, sgd_op<false>);
  register_kernel("sgd_momentum_update", kCuda, sgd_op<true>);
  register_kernel("sum_squares", kCuda, sum_squares_op);
}

}  // namespace sinter::cuda

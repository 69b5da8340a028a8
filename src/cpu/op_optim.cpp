// CPU kernels of the optimizer updates (src/optim/update_ops.cpp): one pass over each parameter.
#include <cmath>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "cpu/cpu.h"
#include "ops/common.h"

namespace sinter::cpu {
namespace {

// A contiguous f32 view of a tensor updated in place; a strided one is worked on in a copy that
// goes back at the end.
struct Updated {
  Tensor target, work;
  explicit Updated(const Tensor& t) : target(t), work(contiguous_as(t, DType::f32)) {}
  ~Updated() {
    if (!work.same(target)) copy(work, target);
  }
  float* data() const { return work.data<float>(); }
};

// PyTorch's order: decay, moments, then the bias-corrected step.
void adamw_update_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  SINTER_KERNEL_ENTRY();
  const double lr = scalar_value(in[4]), step = scalar_value(in[5]);
  const double beta1 = a.f("beta1"), beta2 = a.f("beta2");
  const double bc1 = 1.0 - std::pow(beta1, step), bc2 = 1.0 - std::pow(beta2, step);
  const float step_size = float(lr / bc1), bc2_sqrt = float(std::sqrt(bc2));
  const float b1 = float(beta1), b2 = float(beta2), eps = float(a.f("eps"));
  const float decay = float(1.0 - lr * a.f("weight_decay"));
  const Updated pw(out[0]), mw(out[1]), vw(out[2]);
  float *const w = pw.data(), *const m = mw.data(), *const v = vw.data();
  const Tensor g = contiguous_as(in[1], DType::f32);
  const float* const gp = g.data<float>();
  // Everything by value and the arrays restrict: with the scalars read through the closure, a
  // store to w, m or v might change them, and the loop stayed scalar (1.9 ns per element).
  parallel_for(0, out[0].numel(), 1 << 15, [=](int64_t lo, int64_t hi) {
    float *__restrict pw = w, *__restrict pm = m, *__restrict pv = v;
    const float* __restrict pg = gp;
    for (int64_t i = lo; i < hi; ++i) {
      pw[i] *= decay;
      pm[i] = b1 * pm[i] + (1 - b1) * pg[i];
      pv[i] = b2 * pv[i] + (1 - b2) * pg[i] * pg[i];
      pw[i] -= step_size * pm[i] / (std::sqrt(pv[i]) / bc2_sqrt + eps);
    }
  });
}

// d = g + wd p; with momentum buf = momentum buf + d and d = buf (Nesterov: d + momentum buf); p -= lr d.
template <bool with_momentum> void sgd_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  SINTER_KERNEL_ENTRY();
  const float neg_lr = float(-scalar_value(in[with_momentum ? 3 : 2])), wd = float(a.f("weight_decay"));
  const float mom = with_momentum ? float(a.f("momentum")) : 0.0f;
  const bool nesterov = with_momentum && a.b("nesterov");
  const Updated pw(out[0]);
  const Updated bw(with_momentum ? out[1] : out[0]);
  float* const p_ = pw.data();
  float* const buf_ = with_momentum ? bw.data() : nullptr;
  const Tensor g = contiguous_as(in[1], DType::f32);
  const float* const gp_ = g.data<float>();
  parallel_for(0, out[0].numel(), 1 << 15, [=](int64_t lo, int64_t hi) {  // by value, restrict: as AdamW's
    float *__restrict p = p_, *__restrict buf = buf_;
    const float* __restrict gp = gp_;
    for (int64_t i = lo; i < hi; ++i) {
      float d = wd != 0 ? gp[i] + p[i] * wd : gp[i];
      if constexpr (with_momentum) {
        buf[i] = buf[i] * mom + d;
        d = nesterov ? d + buf[i] * mom : buf[i];
      }
      p[i] = p[i] + d * neg_lr;
    }
  });
}

}  // namespace

void register_optimizer_kernels() {
  detail::add_kernels(DeviceType::cpu, {{"adamw_update", adamw_update_kernel}, {"sgd_update", sgd_kernel<false>},
                                        {"sgd_momentum_update", sgd_kernel<true>}});
}

}  // namespace sinter::cpu

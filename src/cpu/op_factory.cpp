// CPU kernels of the factories (src/ops/factory.cpp). Random draws are Philox blocks indexed by
// element, so a tensor's values depend on the seed and counter only, never on the thread count.
#include <cmath>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "cpu/cpu.h"
#include "ops/common.h"
#include "sinter/random.h"

namespace sinter::cpu {
namespace {

void full_kernel(std::span<const Tensor>, std::span<Tensor> out, const Attrs& a) { fill(out[0], a.f("value")); }

// Element i is f(i) computed in double, then converted to the output dtype.
template <class F> void fill_by_index(const Tensor& out, F&& f) {
  SINTER_KERNEL_ENTRY();
  visit_dtype(out.dtype(), [&]<class T>() {
    T* p = out.data<T>();
    for (int64_t i = 0; i < out.numel(); ++i) p[i] = convert<T>(f(i));
  });
}

void arange_kernel(std::span<const Tensor>, std::span<Tensor> out, const Attrs& a) {
  const double start = a.f("start"), step = a.f("step");
  fill_by_index(out[0], [&](int64_t i) { return start + double(i) * step; });
}

void linspace_kernel(std::span<const Tensor>, std::span<Tensor> out, const Attrs& a) {
  const double start = a.f("start"), end = a.f("end");
  const int64_t steps = a.i("steps");
  const double step = steps > 1 ? (end - start) / double(steps - 1) : 0.0;
  // Symmetric fill (as PyTorch) so both ends are exact.
  fill_by_index(out[0], [&](int64_t i) {
    return steps == 1 || i < steps / 2 ? start + step * double(i) : end - step * double(steps - 1 - i);
  });
}

void eye_kernel(std::span<const Tensor>, std::span<Tensor> out, const Attrs& a) {
  const int64_t m = a.i("m");
  fill_by_index(out[0], [&](int64_t i) { return i / m == i % m ? 1.0 : 0.0; });
}

// Fills n values in blocks of `per_block` from one Philox block each, in parallel: draw(r, p, k)
// writes element k of block b (k < per_block, the index b * per_block + k < n).
template <class T, class Draw> void philox_fill(T* p, int64_t n, int per_block, const Attrs& a, Draw&& draw) {
  SINTER_KERNEL_ENTRY();
  const uint64_t seed = uint64_t(a.i("seed")), ctr = uint64_t(a.i("counter"));
  parallel_for(0, (n + per_block - 1) / per_block, 4096, [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b) {
      uint32_t r[4];
      philox(seed, ctr + uint64_t(b), r);
      draw(r, b, std::min<int64_t>(per_block, n - b * per_block), p + b * per_block);
    }
  });
}

void rand_kernel(std::span<const Tensor>, std::span<Tensor> out, const Attrs& a) {
  visit_dtype(out[0].dtype(), [&]<class T>() {
    philox_fill(out[0].data<T>(), out[0].numel(), 4, a, [](const uint32_t* r, int64_t, int64_t m, T* p) {
      for (int64_t k = 0; k < m; ++k) p[k] = convert<T>(float(r[k] >> 8) * (1.0f / 16777216.0f));
    });
  });
}

void randn_kernel(std::span<const Tensor>, std::span<Tensor> out, const Attrs& a) {
  visit_dtype(out[0].dtype(), [&]<class T>() {
    philox_fill(out[0].data<T>(), out[0].numel(), 4, a, [](const uint32_t* r, int64_t, int64_t m, T* p) {
      for (int k = 0; k < 4; k += 2) {  // Box-Muller on each pair; u1 in (0, 1] keeps log finite
        const double u1 = (double(r[k]) + 1.0) / 4294967296.0, u2 = double(r[k + 1]) / 4294967296.0;
        const double rad = std::sqrt(-2.0 * std::log(u1)), th = 6.283185307179586 * u2;
        if (k < m) p[k] = convert<T>(rad * std::cos(th));
        if (k + 1 < m) p[k + 1] = convert<T>(rad * std::sin(th));
      }
    });
  });
}

void randint_kernel(std::span<const Tensor>, std::span<Tensor> out, const Attrs& a) {
  const int64_t low = a.i("low");
  const uint64_t range = uint64_t(a.i("high") - low);
  visit_dtype(out[0].dtype(), [&]<class T>() {
    philox_fill(out[0].data<T>(), out[0].numel(), 2, a, [&](const uint32_t* r, int64_t, int64_t m, T* p) {
      for (int64_t k = 0; k < m; ++k) {
        const uint64_t x = (uint64_t(r[2 * k]) << 32) | r[2 * k + 1];
        p[k] = convert<T>(low + int64_t(x % range));
      }
    });
  });
}

}  // namespace

void register_factory_kernels() {
  detail::add_kernels(DeviceType::cpu, {{"full", full_kernel}, {"arange", arange_kernel},
                                        {"linspace", linspace_kernel}, {"eye", eye_kernel}, {"rand", rand_kernel},
                                        {"randn", randn_kernel}, {"randint", randint_kernel}});
}

}  // namespace sinter::cpu

// CPU kernels of the factories (src/ops/factory.cpp). Random draws are Philox blocks indexed by
// element, so a tensor's values depend on the seed and counter only, never on the thread count.
#include <cmath>
#include <cstring>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "cpu/cpu.h"
#include "cpu/simd/normal.h"
#include "ops/common.h"
#include "sinter/random.h"

namespace sinter::cpu {
namespace {

void full_kernel(std::span<const Tensor>, std::span<Tensor> out, const Attrs& a) { fill(out[0], a.f("value")); }

// Element i is f(i) computed in double, then converted to the output dtype; in parallel.
template <class F> void fill_by_index(const Tensor& out, F&& f) {
  SINTER_KERNEL_ENTRY();
  visit_dtype(out.dtype(), [&]<class T>() {
    T* p = out.data<T>();
    parallel_for(0, out.numel(), 1 << 15, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) p[i] = convert<T>(f(i));
    });
  });
}

void arange_kernel(std::span<const Tensor>, std::span<Tensor> out, const Attrs& a) {
  const double start = a.f("start"), step = a.f("step");
  const double reach = std::fabs(start) + std::fabs(step) * double(out[0].numel());
  const bool whole = start == std::trunc(start) && step == std::trunc(step) && reach < 0x1p53;
  if (whole && out[0].dtype() == DType::i64) {  // the double formula's values, in integers: vectorized
    int64_t* p = out[0].data<int64_t>();
    const int64_t s0 = int64_t(start), d = int64_t(step);
    parallel_for(0, out[0].numel(), 1 << 15, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) p[i] = s0 + i * d;
    });
    return;
  }
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

// Fills n values `per_block` to a Philox block, kBatch blocks at a time, in parallel: draw(r, p, m)
// writes the m <= per_block * kBatch values of blocks (c + b, b < kBatch), value k of block b from
// words of r[.][b] (the numbers of one block at a time, as CUDA's one-value-per-thread kernel draws).
constexpr int kBatch = 16;
template <int per_block, class T, class Draw> void philox_fill(T* p, int64_t n, const Attrs& a, Draw&& draw) {
  SINTER_KERNEL_ENTRY();
  const uint64_t seed = uint64_t(a.i("seed")), ctr = uint64_t(a.i("counter"));
  constexpr int64_t per = per_block * kBatch;
  parallel_for(0, (n + per - 1) / per, 256, [&](int64_t lo, int64_t hi) {
    for (int64_t c = lo; c < hi; ++c) {
      uint32_t r[4][kBatch];
      simd::philox_lanes(seed, ctr + uint64_t(c * kBatch), r);
      draw(r, p + c * per, std::min(per, n - c * per));
    }
  });
}

void rand_kernel(std::span<const Tensor>, std::span<Tensor> out, const Attrs& a) {
  visit_dtype(out[0].dtype(), [&]<class T>() {
    philox_fill<4>(out[0].data<T>(), out[0].numel(), a, [](const uint32_t (&r)[4][kBatch], T* p, int64_t m) {
      float u[4 * kBatch];
      for (int b = 0; b < kBatch; ++b)
        for (int k = 0; k < 4; ++k) u[4 * b + k] = float(r[k][b] >> 8) * (1.0f / 16777216.0f);
      for (int64_t i = 0; i < m; ++i) p[i] = convert<T>(u[i]);
    });
  });
}

// Box-Muller on each pair of a block, (r0, r1) and (r2, r3): cos to the first value, sin to the
// second; u1 in (0, 1] keeps log finite. In double, so float results are libm's (CUDA's) rounded.
void randn_kernel(std::span<const Tensor>, std::span<Tensor> out, const Attrs& a) {
  using simd::vdouble;
  visit_dtype(out[0].dtype(), [&]<class T>() {
    philox_fill<4>(out[0].data<T>(), out[0].numel(), a, [](const uint32_t (&r)[4][kBatch], T* p, int64_t m) {
      double cs[2][kBatch], sn[2][kBatch];
      for (int j = 0; j < 2; ++j) {
        for (int b = 0; b < kBatch; b += simd::kDoubles) {
          const vdouble u1 = (simd::words_to_double(&r[2 * j][b]) + 1.0) * 0x1p-32;
          const vdouble u2 = simd::words_to_double(&r[2 * j + 1][b]) * 0x1p-32;
          const vdouble rad = simd::sqrt(-2.0 * simd::log_unit(u1));
          vdouble s, c;
          simd::sincos_turn(6.283185307179586 * u2, s, c);
          c *= rad, s *= rad;
          std::memcpy(&cs[j][b], &c, sizeof c);
          std::memcpy(&sn[j][b], &s, sizeof s);
        }
      }
      double v[4 * kBatch];
      for (int b = 0; b < kBatch; ++b) v[4 * b] = cs[0][b], v[4 * b + 1] = sn[0][b], v[4 * b + 2] = cs[1][b], v[4 * b + 3] = sn[1][b];
      for (int64_t i = 0; i < m; ++i) p[i] = convert<T>(v[i]);
    });
  });
}

void randint_kernel(std::span<const Tensor>, std::span<Tensor> out, const Attrs& a) {
  const int64_t low = a.i("low");
  const uint64_t range = uint64_t(a.i("high") - low);
  visit_dtype(out[0].dtype(), [&]<class T>() {
    philox_fill<2>(out[0].data<T>(), out[0].numel(), a, [&](const uint32_t (&r)[4][kBatch], T* p, int64_t m) {
      for (int64_t i = 0; i < m; ++i) {
        const int64_t b = i / 2, k = i % 2;
        const uint64_t x = (uint64_t(r[2 * k][b]) << 32) | r[2 * k + 1][b];
        p[i] = convert<T>(low + int64_t(x % range));
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

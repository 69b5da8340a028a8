// CUDA kernels of the factories (src/ops/factory.cpp), element by element as the CPU's
// (cpu/op_factory.cpp): the same formulas in double, converted by the same rule, and the same
// Philox blocks (core/philox.h) indexed by element, so uniform draws equal the CPU's bit for bit.
#include <span>

#include "cuda/launch.cuh"
#include "sinter/op.h"

#define SINTER_HD __host__ __device__
#include "core/philox.h"

namespace sinter::cuda {
namespace {

enum class Fill { value, arange, linspace, eye };

struct FillArgs {
  Fill kind;
  double a, b;     // value | start, step | start, end
  int64_t steps;   // linspace: steps; eye: m
};

__device__ double fill_at(const FillArgs& f, int64_t i) {
  switch (f.kind) {
    case Fill::value: return f.a;
    case Fill::arange: return f.a + double(i) * f.b;
    case Fill::linspace: {  // symmetric, as the CPU's: both ends exact
      const double step = f.steps > 1 ? (f.b - f.a) / double(f.steps - 1) : 0.0;
      return f.steps == 1 || i < f.steps / 2 ? f.a + step * double(i) : f.b - step * double(f.steps - 1 - i);
    }
    case Fill::eye: return i / f.steps == i % f.steps ? 1.0 : 0.0;
  }
  return 0.0;
}

template <class S> __global__ void fill_k(int64_t n, S* y, FillArgs f) {
  SINTER_GRID_STRIDE(i, n) store(y + i, convert_to<S>(fill_at(f, i)));
}

enum class Draw { uniform, normal, integer };

// Element i of a draw: uniform and normal take four values from a block, integers two.
template <class S> __global__ void draw_k(int64_t n, S* y, Draw d, uint64_t seed, uint64_t ctr, int64_t low, uint64_t range) {
  SINTER_GRID_STRIDE(i, n) {
    const int per = d == Draw::integer ? 2 : 4;
    uint32_t r[4];
    detail::philox_block(seed, ctr + uint64_t(i / per), r);
    const int k = int(i % per);
    if (d == Draw::uniform) {
      store(y + i, convert_to<S>(float(r[k] >> 8) * (1.0f / 16777216.0f)));
    } else if (d == Draw::normal) {  // Box-Muller on the pair k belongs to; u1 in (0, 1]
      const int p = k & ~1;
      const double u1 = (double(r[p]) + 1.0) / 4294967296.0, u2 = double(r[p + 1]) / 4294967296.0;
      const double rad = sqrt(-2.0 * log(u1)), th = 6.283185307179586 * u2;
      store(y + i, convert_to<S>(k == p ? rad * cos(th) : rad * sin(th)));
    } else {
      const uint64_t x = (uint64_t(r[2 * k]) << 32) | r[2 * k + 1];
      store(y + i, convert_to<S>(low + int64_t(x % range)));
    }
  }
}

void fill(const char* op, const Tensor& out, FillArgs f) {
  dispatch<Types::all>(out.dtype(), op, [&](auto tag) {
    using S = decltype(tag);
    launch(op, out, fill_k<S>, ptr<S>(out), f);
  });
}

void draw(const char* op, const Tensor& out, Draw d, const Attrs& a, int64_t low = 0, uint64_t range = 1) {
  dispatch<Types::all>(out.dtype(), op, [&](auto tag) {
    using S = decltype(tag);
    launch(op, out, draw_k<S>, ptr<S>(out), d, uint64_t(a.i("seed")), uint64_t(a.i("counter")), low, range);
  });
}


}  // namespace

void register_factory_kernels() {
  constexpr DeviceType kCuda = DeviceType::cuda;
  register_kernel("full", kCuda, [](std::span<const Tensor>, std::span<Tensor> o, const Attrs& a) {
    fill("full", o[0], {Fill::value, a.f("value"), 0, 0});
  });
  register_kernel("arange", kCuda, [](std::span<const Tensor>, std::span<Tensor> o, const Attrs& a) {
    fill("arange", o[0], {Fill::arange, a.f("start"), a.f("step"), 0});
  });
  register_kernel("linspace", kCuda, [](std::span<const Tensor>, std::span<Tensor> o, const Attrs& a) {
    fill("linspace", o[0], {Fill::linspace, a.f("start"), a.f("end"), a.i("steps")});
  });
  register_kernel("eye", kCuda, [](std::span<const Tensor>, std::span<Tensor> o, const Attrs& a) {
    fill("eye", o[0], {Fill::eye, 0, 0, a.i("m")});
  });
  register_kernel("rand", kCuda, [](std::span<const Tensor>, std::span<Tensor> o, const Attrs& a) { draw("rand", o[0], Draw::uniform, a); });
  register_kernel("randn", kCuda, [](std::span<const Tensor>, std::span<Tensor> o, const Attrs& a) { draw("randn", o[0], Draw::normal, a); });
  register_kernel("randint", kCuda, [](std::span<const Tensor>, std::span<Tensor> o, const Attrs& a) {
    draw("randint", o[0], Draw::integer, a, a.i("low"), uint64_t(a.i("high") - a.i("low")));
  });
}

}  // namespace sinter::cuda

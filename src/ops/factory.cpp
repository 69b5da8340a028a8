// Factories: ops with no inputs that make a tensor (full, arange, linspace, eye, rand, randn,
// randint). They trace like any op (a compiled function that builds a constant builds it inside
// the graph). The device comes from the attribute "device" (default: the CPU); random ones take
// their Philox seed and counter as attributes, reserved from the global generator by the public
// functions below. CPU kernels: src/cpu/op_factory.cpp.
#include <cmath>

#include "ops/common.h"
#include "sinter/random.h"

namespace sinter {
namespace detail {
namespace {

Device device_of(const Attrs& a) { return a.has("device") ? a.device("device") : Device{}; }

void add_factory(const char* name, InferFn infer, bool random = false, Spelling::Form form = Spelling::Form::functor) {
  OpDef d;
  d.name = name;
  d.num_inputs = 0;
  d.min_inputs = 0;
  d.infer = std::move(infer);
  d.random = random;
  d.spelling.form = form;
  add_op(std::move(d));
}

// Shape and dtype from attrs "shape" and "dtype" (random draws need a floating dtype).
InferFn shaped(const char* name, bool floating_only) {
  return [name = std::string(name), floating_only](std::span<const TensorMeta>, const Attrs& a) {
    const Shape& s = a.ints("shape");
    for (int64_t d : s) SINTER_CHECK_SHAPE(d >= 0, "[", name, "] negative dimension in shape ", s);
    SINTER_CHECK_DTYPE(!floating_only || is_floating(a.dtype("dtype")), "[", name, "] needs a floating dtype, got ", a.dtype("dtype"));
    return std::vector<TensorMeta>{{s, a.dtype("dtype"), device_of(a)}};
  };
}

}  // namespace

int64_t arange_length(double start, double end, double step) {
  SINTER_CHECK(step != 0 && std::isfinite(start) && std::isfinite(end) && std::isfinite(step),
               "[arange] needs finite start/end and a non-zero step, got ", start, ", ", end, ", ", step);
  SINTER_CHECK((end - start) / step >= 0, "[arange] step ", step, " does not lead from ", start, " to ", end);
  return int64_t(std::ceil((end - start) / step));
}

void register_factory_ops() {
  // attrs shape, value, dtype[, device]; not fusable, but generated code inlines its value where
  // a fused kernel reads it
  add_factory("full", shaped("full", false), false, Spelling::Form::constant);
  add_factory("arange", [](std::span<const TensorMeta>, const Attrs& a) {  // attrs start, end, step, dtype
    return std::vector<TensorMeta>{{{arange_length(a.f("start"), a.f("end"), a.f("step"))}, a.dtype("dtype"), device_of(a)}};
  });
  add_factory("linspace", [](std::span<const TensorMeta>, const Attrs& a) {  // attrs start, end, steps, dtype
    SINTER_CHECK(a.i("steps") >= 0, "[linspace] steps must be non-negative, got ", a.i("steps"));
    return std::vector<TensorMeta>{{{a.i("steps")}, a.dtype("dtype"), device_of(a)}};
  });
  add_factory("eye", [](std::span<const TensorMeta>, const Attrs& a) {  // attrs n, m, dtype
    SINTER_CHECK(a.i("n") >= 0 && a.i("m") >= 0, "[eye] sizes must be non-negative, got ", a.i("n"), " and ", a.i("m"));
    return std::vector<TensorMeta>{{{a.i("n"), a.i("m")}, a.dtype("dtype"), device_of(a)}};
  });
  add_factory("rand", shaped("rand", true), true);    // U[0, 1): attrs shape, dtype, seed, counter
  add_factory("randn", shaped("randn", true), true);  // N(0, 1)
  add_factory("randint", [](std::span<const TensorMeta> in, const Attrs& a) {  // attrs low, high, shape, dtype, seed, counter
    SINTER_CHECK(a.i("high") > a.i("low"), "[randint] needs low < high, got ", a.i("low"), " and ", a.i("high"));
    return shaped("randint", false)(in, a);
  }, true);
}

}  // namespace detail

namespace {
// On the CPU the attribute "device" is left out (graphs and cache keys stay as they were).
Tensor factory(const char* name, Attrs a, Device device = {}) {
  if (device != Device{}) a.set("device", device);
  return call1(get_op(name), {}, a);
}
// The first Philox counter of `blocks` 128-bit blocks, reserved from the global generator.
std::pair<int64_t, int64_t> reserve(int64_t blocks) {
  Generator& g = default_generator();
  const uint64_t seed = g.seed, ctr = g.reserve(uint64_t(blocks));
  return {int64_t(seed), int64_t(ctr)};
}
}  // namespace

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  static const OpDef& op = get_op("full");
  if (device != Device{}) return call1(op, {}, {{"shape", shape}, {"value", value}, {"dtype", dtype}, {"device", device}});
  return call1(op, {}, {{"shape", shape}, {"value", value}, {"dtype", dtype}});
}
Tensor zeros(const Shape& shape, DType dtype, Device device) { return full(shape, 0.0, dtype, device); }
Tensor ones(const Shape& shape, DType dtype, Device device) { return full(shape, 1.0, dtype, device); }
Tensor zeros_like(const Tensor& t) { return full_like(t, 0.0); }
Tensor ones_like(const Tensor& t) { return full_like(t, 1.0); }
Tensor full_like(const Tensor& t, double value) {
  static const OpDef& op = get_op("full");
  return call1(op, {}, {{"shape", t.shape()}, {"value", value}, {"dtype", t.dtype()}, {"device", t.device()}});
}
Tensor scalar_tensor(double v, DType dtype) { return full(Shape{}, v, dtype); }

Tensor arange(double start, double end, double step, DType dtype) {
  return factory("arange", {{"start", start}, {"end", end}, {"step", step}, {"dtype", dtype}});
}
Tensor arange(int64_t end, DType dtype) { return arange(0.0, double(end), 1.0, dtype); }

Tensor linspace(double start, double end, int64_t steps, DType dtype) {
  return factory("linspace", {{"start", start}, {"end", end}, {"steps", steps}, {"dtype", dtype}});
}

Tensor eye(int64_t n, int64_t m, DType dtype) { return factory("eye", {{"n", n}, {"m", m < 0 ? n : m}, {"dtype", dtype}}); }

Tensor rand(const Shape& shape, DType dtype, Device device) {
  const auto [seed, ctr] = reserve((shape.numel() + 3) / 4);
  return factory("rand", {{"shape", shape}, {"dtype", dtype}, {"seed", seed}, {"counter", ctr}}, device);
}

Tensor randn(const Shape& shape, DType dtype, Device device) {
  const auto [seed, ctr] = reserve((shape.numel() + 3) / 4);
  return factory("randn", {{"shape", shape}, {"dtype", dtype}, {"seed", seed}, {"counter", ctr}}, device);
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, DType dtype, Device device) {
  SINTER_CHECK(high > low, "[randint] needs low < high, got ", low, " and ", high);
  const auto [seed, ctr] = reserve((shape.numel() + 1) / 2);
  return factory("randint", {{"low", low}, {"high", high}, {"shape", shape}, {"dtype", dtype}, {"seed", seed}, {"counter", ctr}},
                 device);
}

}  // namespace sinter

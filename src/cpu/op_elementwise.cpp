// CPU kernels of the elementwise ops (src/ops/elementwise.cpp): inputs converted to the dtype the
// kernel computes in, then one strided loop (cpu/elementwise.cpp and cpu/elementwise_binary.cpp).
#include "cpu/cpu.h"
#include "ops/common.h"

namespace sinter::cpu {
namespace {

// t in dtype dt (a copy only when it has another dtype; strides are kept otherwise).
Tensor as_dtype(const Tensor& t, DType dt) {
  if (t.dtype() == dt) return t;
  Tensor c = Tensor::empty(t.shape(), dt, t.device());
  copy(t, c);
  return c;
}

template <UnaryOp k> void unary_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
  unary(k, as_dtype(in[0], out[0].dtype()), out[0]);
}

// The dtype a binary op computes in: the promoted one; true division makes integers f32.
template <BinaryOp k, bool true_div> void binary_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
  DType dt = promote_types(in[0].dtype(), in[1].dtype());
  if (true_div && !is_floating(dt)) dt = DType::f32;
  binary(k, as_dtype(in[0], dt), as_dtype(in[1], dt), out[0]);
}

void where_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
  where(in[0], as_dtype(in[1], out[0].dtype()), as_dtype(in[2], out[0].dtype()), out[0]);
}

void clamp_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  clamp(in[0], a.has("min") ? std::optional<double>(a.f("min")) : std::nullopt,
        a.has("max") ? std::optional<double>(a.f("max")) : std::nullopt, out[0]);
}

void cast_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) { copy(in[0], out[0]); }

}  // namespace

void register_elementwise_kernels() {
  using detail::add_kernel;
  constexpr DeviceType kCpu = DeviceType::cpu;
#define UNARY(F, name, rule, dx) add_kernel(#name, kCpu, unary_kernel<UnaryOp::F>);
#define BINARY(F, name, rule, da, db) add_kernel(#name, kCpu, binary_kernel<BinaryOp::F, std::string_view(#rule) == "true_div">);
#include "ops/elementwise.def"
#undef UNARY
#undef BINARY
  add_kernel("where", kCpu, where_kernel);
  add_kernel("clamp", kCpu, clamp_kernel);
  add_kernel("cast", kCpu, cast_kernel);
}

}  // namespace sinter::cpu

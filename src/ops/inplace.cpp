// In-place ops: add_, sub_, mul_, div_ (the other operand broadcast to the target and cast to its
// dtype), fill_ and copy_. Each declares the input it writes (OpDef::mutates), so tracing sees the
// write and autograd refuses it on tensors that require grad. CPU kernels: src/cpu/op_inplace.cpp.
#include "ops/common.h"

namespace sinter {
namespace detail {
namespace {

void add_inplace_op(const char* name, int num_inputs, InferFn check) {
  OpDef d;
  d.name = name;
  d.num_inputs = num_inputs;
  d.mutates = 1;
  d.infer = [check = std::move(check)](std::span<const TensorMeta> in, const Attrs& a) {
    check(in, a);
    return std::vector<TensorMeta>{in[0]};
  };
  add_op(std::move(d));
}

InferFn binary_check(std::string name, bool division) {
  return [name, division](std::span<const TensorMeta> in, const Attrs&) {
    check_inplace_broadcast(name, in[0].shape, in[1].shape);
    const DType self = in[0].dtype, o = in[1].dtype;
    SINTER_CHECK_DTYPE(self != DType::boolean, "[", name, "] bool tensors do not support arithmetic");
    SINTER_CHECK_DTYPE(is_floating(self) || !is_floating(o), "[", name, "] result of dtype ", o, " cannot be stored in a ",
                       self, " tensor");
    SINTER_CHECK_DTYPE(!division || is_floating(self), "[", name,
                       "] true division into an integer tensor; cast it to a floating dtype first");
    return std::vector<TensorMeta>{};
  };
}

}  // namespace

void register_inplace_ops() {
  add_inplace_op("add_", 2, binary_check("add_", false));
  add_inplace_op("sub_", 2, binary_check("sub_", false));
  add_inplace_op("mul_", 2, binary_check("mul_", false));
  add_inplace_op("div_", 2, binary_check("div_", true));
  add_inplace_op("fill_", 1, [](std::span<const TensorMeta>, const Attrs& a) {  // attr value
    a.f("value");
    return std::vector<TensorMeta>{};
  });
  add_inplace_op("copy_", 2, [](std::span<const TensorMeta> in, const Attrs&) {  // any dtype to any dtype
    check_inplace_broadcast("copy_", in[0].shape, in[1].shape);
    return std::vector<TensorMeta>{};
  });
}

}  // namespace detail

namespace {
Tensor& inplace(Tensor& self, const char* name, std::vector<Tensor> in, const Attrs& a = {}) {
  call(get_op(name), std::move(in), a);
  return self;
}
}  // namespace

Tensor& Tensor::add_(const Tensor& o, double alpha) {
  if (alpha == 1.0) return inplace(*this, "add_", {*this, o});
  return inplace(*this, "add_", {*this, mul(o.detach(), alpha)});
}
Tensor& Tensor::add_(double v) { return inplace(*this, "add_", {*this, scalar_tensor(v, dtype())}); }
Tensor& Tensor::sub_(const Tensor& o) { return inplace(*this, "sub_", {*this, o}); }
Tensor& Tensor::mul_(const Tensor& o) { return inplace(*this, "mul_", {*this, o}); }
Tensor& Tensor::mul_(double v) { return inplace(*this, "mul_", {*this, scalar_tensor(v, dtype())}); }
Tensor& Tensor::div_(const Tensor& o) { return inplace(*this, "div_", {*this, o}); }
Tensor& Tensor::zero_() { return fill_(0.0); }
Tensor& Tensor::fill_(double v) { return inplace(*this, "fill_", {*this}, {{"value", v}}); }
Tensor& Tensor::copy_(const Tensor& src) { return inplace(*this, "copy_", {*this, src}); }

}  // namespace sinter

#pragma once
// The example kernels registered as ops: their sources are the *.kernel.cpp files beside this one.
#include <sinter/sinter.h>

#include <string>

namespace examples {

// y = silu(gate) * up with two block sizes (autotuned) and a backward in public ops; its output is
// pointwise, so a compiled graph computes its elementwise consumers inside the kernel's store().
inline const sinter::OpDef& swiglu_op(const std::string& dir) {
  using namespace sinter;
  if (const OpDef* op = find_op("swiglu")) return *op;
  return register_kernel_def({
      .name = "swiglu",
      .source_file = dir + "/swiglu.kernel.cpp",
      .inputs = {DType::f32, DType::f32},
      .outputs = {DType::f32},
      .shape = same_as_input(0),
      .configs = {{{"BLOCK", 4096}}, {{"BLOCK", 65536}}},
      .key = [](std::span<const TensorMeta> in) { return std::vector<int64_t>{in[0].shape.numel()}; },
      .pointwise = {true},
      // d gate = silu'(gate) (grad up), d up = grad silu(gate): the ops eager autograd runs for silu(gate) * up
      .backward = [](BackwardCtx& c) {
        const Tensor &gate = c.inputs[0], &up = c.inputs[1], &g = c.grads[0];
        return std::vector<Tensor>{c.needs_grad[0] ? silu_backward(g * up, gate) : Tensor(), c.needs_grad[1] ? g * silu(gate) : Tensor()};
      },
  });
}

// cache (written in place) <- x at position pos along dim 2.
inline const sinter::OpDef& kv_write_op(const std::string& dir) {
  using namespace sinter;
  if (const OpDef* op = find_op("kv_write")) return *op;
  return register_kernel_def({
      .name = "kv_write",
      .source_file = dir + "/kv_write.kernel.cpp",
      .inputs = {DType::f32, DType::f32, DType::i64},
      .outputs = {DType::f32},
      .shape = [](std::span<const TensorMeta> in, const Attrs&) {
        const Shape &c = in[0].shape, &x = in[1].shape;
        SINTER_CHECK_SHAPE(c.size() == 4 && x.size() == 4 && x[0] == c[0] && x[1] == c[1] && x[3] == c[3] && x[2] <= c[2] &&
                               in[2].shape.empty(),
                           "x must be (B, H, T, D) of the cache's B, H and D, pos a 0-d tensor");
        return std::vector<TensorMeta>{in[0]};
      },
      .effects = {Effect::writes(0)},
  });
}

}  // namespace examples

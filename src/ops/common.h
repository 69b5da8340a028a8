#pragma once
// Helpers shared by op definitions (schemas, infer, backward): dim wrapping, broadcasting rules,
// dtype checks. Kernels live in the device folders (src/cpu/, ...) and may use these too.
#include <span>
#include <vector>

#include "core/view.h"
#include "sinter/op.h"
#include "sinter/ops.h"

namespace sinter::detail {

const OpDef& add_op(OpDef def);  // registry.cpp
// Sets a kernel while the library registers itself (register_kernel would wait on that registration).
void add_kernel(std::string_view name, DeviceType device, KernelFn kernel);
// A device folder's kernels, as a table of (op name, kernel).
inline void add_kernels(DeviceType device, std::initializer_list<std::pair<const char*, KernelFn>> table) {
  for (const auto& [name, k] : table) add_kernel(name, device, k);
}

inline int64_t wrap_dim(const std::string& op, int64_t d, int64_t ndim) {
  const int64_t n = std::max<int64_t>(ndim, 1);
  SINTER_CHECK_INDEX(d >= -n && d < n, "[", op, "] dimension ", d, " out of range for a ", ndim, "-d tensor");
  return d < 0 ? d + n : d;
}

// Sorted, wrapped, duplicate-free reduction dims; empty means all.
std::vector<int64_t> reduce_dims(const std::string& op, const Shape& dims, int64_t ndim);
Shape reduced_shape(const Shape& shape, const std::vector<int64_t>& dims, bool keepdim);

Shape broadcast_shapes(const std::string& op, const Shape& a, const Shape& b);

inline void check_float(const std::string& op, const TensorMeta& m, const char* what = "input") {
  SINTER_CHECK_DTYPE(is_floating(m.dtype), "[", op, "] ", what, " must be floating, got ", m.dtype);
}
inline void check_integer(const std::string& op, const TensorMeta& m, const char* what) {
  SINTER_CHECK_DTYPE(is_integral(m.dtype), "[", op, "] ", what, " must be an integer tensor, got ", m.dtype);
}

// Undoes keepdim=false: reinserts size-1 dims at `dims` so g broadcasts against the input.
Tensor unsqueeze_dims(const Tensor& g, const std::vector<int64_t>& dims, int64_t in_ndim, bool keepdim);

// The output metadata of an op that writes its input `i` in place: that input's, after checking
// that `other` broadcasts to it (in-place ops never change the shape of what they write).
void check_inplace_broadcast(const std::string& op, const Shape& self, const Shape& other);

}  // namespace sinter::detail

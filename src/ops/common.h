#pragma once
// Helpers shared by op definitions: dim wrapping, broadcasting rules, raw views (no autograd).
#include <span>
#include <vector>

#include "sinter/op.h"
#include "sinter/ops.h"

namespace sinter::detail {

const OpDef& add_op(OpDef def);  // registry.cpp

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

// Throws IndexError naming the op unless every int64 index lies in [0, n) (idx contiguous).
void check_index_range(const std::string& op, const Tensor& idx, int64_t n);

// Views of a tensor that bypass the op table: for kernels writing into parts of their outputs.
Tensor raw_view(const Tensor& t, const Shape& shape, const Shape& strides, int64_t offset);
Tensor raw_slice(const Tensor& t, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor raw_reshape_contiguous(const Tensor& t, const Shape& shape);  // t must be contiguous

// A contiguous (outer, inner) copy of x with `dims` moved last (a view when already in place).
Tensor rows_last(const Tensor& x, const std::vector<int64_t>& dims);
// Materialised, contiguous copy in dtype `dt` (no autograd), or `t` itself if it already is one.
Tensor contiguous_as(const Tensor& t, DType dt);

// Undoes keepdim=false: reinserts size-1 dims at `dims` so g broadcasts against the input.
Tensor unsqueeze_dims(const Tensor& g, const std::vector<int64_t>& dims, int64_t in_ndim, bool keepdim);

}  // namespace sinter::detail

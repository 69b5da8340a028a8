#pragma once
// Views that bypass the op table (no autograd, no tracing): kernels use them to address parts of
// their inputs and outputs, and view ops to build their outputs. Symbolic tensors work too (the
// view shares their placeholder storage).
#include "sinter/tensor.h"

namespace sinter::detail {

inline Tensor raw_view(const Tensor& t, const Shape& shape, const Shape& strides, int64_t offset) {
  return Tensor::from_storage(t.storage(), shape, strides, offset, t.dtype());
}

inline Tensor raw_slice(const Tensor& t, int64_t dim, int64_t start, int64_t end, int64_t step = 1) {
  Shape shape = t.shape(), strides = t.strides();
  shape[size_t(dim)] = end > start ? (end - start + step - 1) / step : 0;
  strides[size_t(dim)] *= step;
  return raw_view(t, shape, strides, t.offset() + start * t.stride(dim));
}

inline Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) { st[i] = s; s *= std::max<int64_t>(shape[i], 1); }
  return st;
}

// t must be contiguous.
inline Tensor raw_reshape_contiguous(const Tensor& t, const Shape& shape) {
  return raw_view(t, shape, contiguous_strides(shape), t.offset());
}

}  // namespace sinter::detail

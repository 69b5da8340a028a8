// Layout helpers for kernels.
#include <algorithm>

#include "core/dispatch.h"
#include "cpu/cpu.h"
#include "sinter/op.h"

namespace sinter::cpu {

Tensor contiguous_as(const Tensor& t, DType dt) {
  if (t.dtype() == dt && t.is_contiguous()) return t;
  Tensor c = Tensor::empty(t.shape(), dt, t.device());
  copy(t, c);
  return c;
}

Tensor rows_last(const Tensor& x, const std::vector<int64_t>& dims) {
  std::vector<int64_t> perm;
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < x.dim(); ++i)
    if (!std::binary_search(dims.begin(), dims.end(), i)) { perm.push_back(i); outer *= x.size(i); }
  for (int64_t d : dims) { perm.push_back(d); inner *= x.size(d); }
  Shape shape, strides;
  for (int64_t p : perm) { shape.push_back(x.size(p)); strides.push_back(x.stride(p)); }
  Tensor permuted = detail::raw_view(x, shape, strides, x.offset());
  return detail::raw_reshape_contiguous(contiguous_as(permuted, x.dtype()), Shape{outer, inner});
}

Around around(const Tensor& x, int64_t first, int64_t last) {
  Around a;
  for (int64_t d = 0; d < x.dim(); ++d) (d < first ? a.before : d > last ? a.after : a.within) *= x.size(d);
  return a;
}

double scalar_value(const Tensor& t) {
  double v = 0;
  visit_dtype(t.dtype(), [&]<class T>() { v = double(convert<double>(*static_cast<const T*>(t.data_ptr()))); });
  return v;
}

void check_index_range(const std::string& op, const Tensor& idx, int64_t n) {
  const int64_t* p = idx.data<int64_t>();
  const int64_t count = idx.numel();
  // One vectorized pass (a negative index is a huge unsigned one; GCC's -O2 cost model leaves the
  // loop scalar without the pragma); the message finds the first bad one.
  uint64_t bad = 0;
#pragma omp simd reduction(| : bad)
  for (int64_t i = 0; i < count; ++i) bad |= uint64_t(p[i]) >= uint64_t(n);
  for (int64_t i = 0; bad && i < count; ++i)
    SINTER_CHECK_INDEX(p[i] >= 0 && p[i] < n, "[", op, "] index ", p[i], " at position ", i, " out of range for size ", n);
}

}  // namespace sinter::cpu

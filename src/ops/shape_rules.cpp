// The shape rules the op definitions and their kernels share (reduction dims, broadcasting, matmul's
// plan): pure functions of shapes, without the op table, so the kernels link without it (the
// runtime, src/runtime/, does).
#include <algorithm>
#include <numeric>

#include "ops/linalg.h"

namespace sinter::detail {

std::vector<int64_t> reduce_dims(const std::string& op, const Shape& dims, int64_t ndim) {
  std::vector<int64_t> out;
  if (dims.empty()) {
    out.resize(size_t(ndim));
    std::iota(out.begin(), out.end(), 0);
    return out;
  }
  for (int64_t d : dims) out.push_back(wrap_dim(op, d, ndim));
  std::sort(out.begin(), out.end());
  SINTER_CHECK_INDEX(std::adjacent_find(out.begin(), out.end()) == out.end(), "[", op, "] dimension listed twice in ", dims);
  if (ndim == 0) out.clear();
  return out;
}

Shape reduced_shape(const Shape& shape, const std::vector<int64_t>& dims, bool keepdim) {
  Shape out;
  for (int64_t i = 0; i < int64_t(shape.size()); ++i) {
    const bool r = std::binary_search(dims.begin(), dims.end(), i);
    if (!r) out.push_back(shape[size_t(i)]);
    else if (keepdim) out.push_back(1);
  }
  return out;
}

Shape broadcast_shapes(const std::string& op, const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t x = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t y = i < n - b.size() ? 1 : b[i - (n - b.size())];
    SINTER_CHECK_SHAPE(x == y || x == 1 || y == 1, "[", op, "] shapes ", a, " and ", b, " do not broadcast");
    out[i] = x == 1 ? y : x;
  }
  return out;
}

MatmulPlan plan_matmul(const TensorMeta& a, const TensorMeta& b) {
  const Shape &sa = a.shape, &sb = b.shape;
  SINTER_CHECK_SHAPE(!sa.empty() && !sb.empty(), "[matmul] both operands need at least 1 dim, got a", sa, " b", sb);
  SINTER_CHECK_DTYPE(a.dtype == b.dtype, "[matmul] operand dtypes differ: a ", a.dtype, ", b ", b.dtype);
  SINTER_CHECK_DTYPE(a.dtype != DType::boolean, "[matmul] bool tensors are not supported");
  const bool a1 = sa.size() == 1, b1 = sb.size() == 1;
  const int64_t n = a1 ? 1 : sa[sa.size() - 2], k = sa.back();
  const int64_t kb = b1 ? sb[0] : sb[sb.size() - 2], m = b1 ? 1 : sb.back();
  SINTER_CHECK_SHAPE(k == kb, "[matmul] inner dimensions differ: a", sa, " b", sb);
  const Shape ba(sa.begin(), sa.end() - (a1 ? 1 : 2)), bb(sb.begin(), sb.end() - (b1 ? 1 : 2));
  MatmulPlan p{broadcast_shapes("matmul", ba, bb), n, k, m, {}};
  p.out = p.batch;
  if (!a1) p.out.push_back(n);
  if (!b1) p.out.push_back(m);
  return p;
}

}  // namespace sinter::detail

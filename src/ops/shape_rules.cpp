// The shape rules the op definitions and their kernels share (reduction dims, broadcasting, matmul's
// plan): pure functions of shapes, without the op table, so the kernels link without it (the
// runtime, src/runtime/, does).
#include <algorithm>
#include <numeric>

#include "core/view.h"
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

BatchedView batched_view(const Tensor& x, const Shape& batch, int64_t rows, int64_t cols, bool vec_is_row) {
  Tensor t = x;
  if (t.dim() == 1) t = vec_is_row ? raw_view(t, {1, t.size(0)}, {t.size(0) * t.stride(0), t.stride(0)}, t.offset())
                                   : raw_view(t, {t.size(0), 1}, {t.stride(0), 1}, t.offset());
  Shape full = batch;
  full.push_back(rows);
  full.push_back(cols);
  Shape strides(full.size(), 0);
  const int64_t off = int64_t(full.size()) - t.dim();
  for (int64_t i = 0; i < t.dim(); ++i) strides[size_t(off + i)] = t.size(i) == 1 && full[size_t(off + i)] != 1 ? 0 : t.stride(i);
  BatchedView v{raw_view(t, full, strides, t.offset()), Tensor()};
  bool foldable = true;
  for (size_t i = 0; i + 1 < batch.size(); ++i) foldable = foldable && (batch[i] == 1 || strides[i] == strides[i + 1] * batch[i + 1]);
  const int64_t bstride = batch.empty() ? rows * cols : strides[batch.size() - 1];
  if (foldable)
    v.folded = raw_view(v.expanded, {batch.numel(), rows, cols}, {bstride, strides[full.size() - 2], strides[full.size() - 1]}, t.offset());
  return v;
}

}  // namespace sinter::detail

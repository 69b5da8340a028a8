#include "test_util.h"

#include <cmath>
#include <cstring>
#include <sstream>

namespace sinter::test {

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), size_t(x.numel() * x.element_size())) == 0;
}

double default_rtol(DType t) {
  switch (t) {
    case DType::f64: return 1e-10;
    case DType::bf16: return 2e-2;
    case DType::f16: return 2e-3;
    case DType::f32: return 1e-5;
    default: return 0;
  }
}

::testing::AssertionResult all_close(const Tensor& out, const std::vector<double>& ref, double rtol, double atol) {
  const std::vector<double> a = to_double_vector(out);
  if (a.size() != ref.size())
    return ::testing::AssertionFailure() << "size " << a.size() << " vs reference " << ref.size() << " (shape "
                                         << out.shape() << ")";
  double worst = 0;
  size_t wi = 0;
  bool bad = false;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = a[i], y = ref[i];
    if (x == y || (std::isnan(x) && std::isnan(y))) continue;
    if (std::isinf(x) && x == y) continue;
    const double err = std::fabs(x - y) / (atol + rtol * std::fabs(y));
    if (!(err <= 1.0) && (!bad || err > worst || std::isnan(err))) { worst = err; wi = i; bad = true; }
  }
  if (!bad) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "mismatch at flat index " << wi << ": got " << a[wi] << ", want " << ref[wi]
                                       << " (shape " << out.shape() << ", dtype " << out.dtype() << ", rtol " << rtol
                                       << ", atol " << atol << ")";
}

::testing::AssertionResult all_close(const Tensor& out, const Tensor& ref, double rtol, double atol) {
  if (out.shape() != ref.shape())
    return ::testing::AssertionFailure() << "shape " << out.shape() << " vs reference " << ref.shape();
  if (rtol < 0) rtol = std::max(default_rtol(out.dtype()), default_rtol(ref.dtype()));
  if (atol < 0) atol = rtol;
  return all_close(out, to_double_vector(ref), rtol, atol);
}

Tensor noncontiguous(const Tensor& t) {
  if (t.dim() == 0) return t;
  Shape wide = t.shape();
  wide.back() *= 2;
  Tensor buf = zeros(wide, t.dtype());
  Tensor view = buf.slice(-1, 0, wide.back(), 2);
  {
    NoGradGuard g;
    view.copy_(t.detach());
  }
  return view;
}

}  // namespace sinter::test

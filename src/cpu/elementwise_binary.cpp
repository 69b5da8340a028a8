// The CPU binary elementwise kernels (ops/elementwise.def): every (functor, dtype) pair that exists,
// over the strided loop of loops.h, with contiguous and scalar-operand runs vectorized.
#include <type_traits>

#include "core/dispatch.h"
#include "cpu/cpu.h"
#include "cpu/loops.h"
#include "cpu/simd/bf16.h"
#include "ops/scalar_fns.h"

namespace sinter::cpu {
namespace {

// Which (functor, storage type) pairs exist: comparisons on every type, division on float types,
// the rest on every type but bool.
template <class F, class T> constexpr bool binary_ok() {
  constexpr bool compare = std::is_same_v<F, fn::Eq> || std::is_same_v<F, fn::Ne> || std::is_same_v<F, fn::Lt> ||
                           std::is_same_v<F, fn::Le> || std::is_same_v<F, fn::Gt> || std::is_same_v<F, fn::Ge>;
  if constexpr (compare) return true;
  else if constexpr (std::is_same_v<T, bool>) return false;
  else if constexpr (std::is_same_v<F, fn::Div>) return is_float_v<T>;
  else return true;
}

// + - * /: bf16 runs of these go through registers (sixteen values in two) without a trip through memory
template <class F> constexpr bool arithmetic() {
  return std::is_same_v<F, fn::Add> || std::is_same_v<F, fn::Sub> || std::is_same_v<F, fn::Mul> || std::is_same_v<F, fn::Div>;
}

#if defined(__AVX2__)
// o = f(x, y) over n bf16, y one value where `scalar`: sixteen at a time in registers, widened,
// computed and narrowed in the unpack order (elementwise, so no lane-crossing shuffle). Through
// float blocks in memory this ran at 0.8x PyTorch (bf16 mul by a row, Zen 3).
template <class F> void bf16_arithmetic(const F& f, bf16* o, const bf16* x, const bf16* y, bool scalar, int64_t n) {
  __m256 yl = _mm256_set1_ps(float(y[0])), yh = yl, xl, xh;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    simd::unpack16(x + i, xl, xh);
    if (!scalar) simd::unpack16(y + i, yl, yh);
    simd::pack16(o + i, f(xl, yl), f(xh, yh));
  }
  for (; i < n; ++i) o[i] = bf16(f(float(x[i]), float(y[scalar ? 0 : i])));
}
#endif

template <class F, class T, class O> void binary_loop(const Tensor& a, const Tensor& b, const Tensor& out) {
  using C = compute_t<T>;
  const F f;
  for_each_strided<3>(out.shape(),
                      {static_cast<char*>(out.data_ptr()), static_cast<char*>(a.data_ptr()), static_cast<char*>(b.data_ptr())},
                      {broadcast_strides_bytes(out, out.shape()), broadcast_strides_bytes(a, out.shape()),
                       broadcast_strides_bytes(b, out.shape())},
                      [&](std::array<char*, 3> p, std::array<int64_t, 3> s, int64_t n) {
    O* o = reinterpret_cast<O*>(p[0]);
    const T* x = reinterpret_cast<const T*>(p[1]);
    const T* y = reinterpret_cast<const T*>(p[2]);
#if defined(__AVX2__)
    if constexpr (std::is_same_v<T, bf16> && std::is_same_v<O, T> && arithmetic<F>()) {
      if (s[0] == sizeof(O) && s[1] == sizeof(T) && (s[2] == sizeof(T) || s[2] == 0)) return bf16_arithmetic(f, o, x, y, s[2] == 0, n);
    }
#endif
    if constexpr (is_half_v<T> && std::is_same_v<O, T>) {
      if (s[0] == sizeof(O) && s[1] == sizeof(T) && s[2] == sizeof(T)) {
        through_float_blocks(o, std::array<const T*, 2>{x, y}, n, [&](float* const* in, float* r, int64_t m) {
#pragma omp simd
          for (int64_t i = 0; i < m; ++i) r[i] = f(in[0][i], in[1][i]);
        });
        return;
      }
      if (s[0] == sizeof(O) && s[1] == sizeof(T) && s[2] == 0) {
        const C yv = C(y[0]);
        through_float_blocks(o, std::array<const T*, 1>{x}, n, [&](float* const* in, float* r, int64_t m) {
#pragma omp simd
          for (int64_t i = 0; i < m; ++i) r[i] = f(in[0][i], yv);
        });
        return;
      }
    }
    if (s[0] == sizeof(O) && s[1] == sizeof(T) && s[2] == sizeof(T)) {
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) o[i] = O(f(C(x[i]), C(y[i])));
    } else if (s[0] == sizeof(O) && s[1] == sizeof(T) && s[2] == 0) {
      const C yv = C(y[0]);
      if constexpr (std::is_same_v<F, fn::Pow> && std::is_floating_point_v<C>) {
        if (yv == C(2)) {  // fn::Pow's x * x, without a branch in the loop: it vectorizes
#pragma omp simd
          for (int64_t i = 0; i < n; ++i) o[i] = O(C(x[i]) * C(x[i]));
          return;
        }
      }
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) o[i] = O(f(C(x[i]), yv));
    } else {
      for (int64_t i = 0; i < n; ++i)
        *reinterpret_cast<O*>(p[0] + i * s[0]) =
            O(f(C(*reinterpret_cast<const T*>(p[1] + i * s[1])), C(*reinterpret_cast<const T*>(p[2] + i * s[2]))));
    }
  });
}

}  // namespace

void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  SINTER_KERNEL_ENTRY();
  SINTER_ASSERT(a.dtype() == b.dtype());
  visit_dtype(a.dtype(), [&]<class T>() {
    switch (op) {
#define UNARY(F, name, rule, dx)
#define BINARY(F, name, rule, da, db) \
      case BinaryOp::F: \
        if constexpr (binary_ok<fn::F, T>()) { \
          using R = decltype(fn::F{}(compute_t<T>{}, compute_t<T>{})); \
          if constexpr (std::is_same_v<R, bool>) binary_loop<fn::F, T, bool>(a, b, out); \
          else binary_loop<fn::F, T, T>(a, b, out); \
          return; \
        } \
        break;
#include "ops/elementwise.def"
#undef UNARY
#undef BINARY
    }
    SINTER_THROW(DTypeError, "[internal] binary kernel ", int(op), " has no ", a.dtype(), " version");
  });
}

}  // namespace sinter::cpu

// The CPU elementwise kernels: unary ops, where, clamp, copy (with dtype conversion) and fill;
// binary ops are in elementwise_binary.cpp (a file each, so the two template-heavy halves build
// in parallel).
#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/dispatch.h"
#include "cpu/cpu.h"
#include "cpu/loops.h"
#include "ops/scalar_fns.h"

namespace sinter::cpu {
namespace {

// Which (functor, storage type) pairs exist: float ops on float types; neg/abs/relu on integers too.
template <class F, class T> constexpr bool unary_ok() {
  if constexpr (std::is_same_v<T, bool>) return false;
  else if constexpr (is_float_v<T>) return true;
  else return std::is_same_v<F, fn::Neg> || std::is_same_v<F, fn::Abs> || std::is_same_v<F, fn::Relu>;
}
template <class F, class T> void unary_loop(const Tensor& x, const Tensor& out) {
  using C = compute_t<T>;
  const F f;
  for_each_strided<2>(out.shape(), {static_cast<char*>(out.data_ptr()), static_cast<char*>(x.data_ptr())},
                      {broadcast_strides_bytes(out, out.shape()), broadcast_strides_bytes(x, out.shape())},
                      [&](std::array<char*, 2> p, std::array<int64_t, 2> s, int64_t n) {
    T* o = reinterpret_cast<T*>(p[0]);
    const T* a = reinterpret_cast<const T*>(p[1]);
    if (s[0] == sizeof(T) && s[1] == sizeof(T)) {
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) o[i] = T(f(C(a[i])));
    } else {
      for (int64_t i = 0; i < n; ++i)
        *reinterpret_cast<T*>(p[0] + i * s[0]) = T(f(C(*reinterpret_cast<const T*>(p[1] + i * s[1]))));
    }
  });
}

}  // namespace

void unary(UnaryOp op, const Tensor& x, const Tensor& out) {
  SINTER_KERNEL_ENTRY();
  SINTER_ASSERT(x.dtype() == out.dtype());
  visit_dtype(x.dtype(), [&]<class T>() {
    switch (op) {
#define UNARY(F, name, rule, dx) \
      case UnaryOp::F: \
        if constexpr (unary_ok<fn::F, T>()) { unary_loop<fn::F, T>(x, out); return; } \
        break;
#define BINARY(F, name, rule, da, db)
#include "ops/elementwise.def"
#undef UNARY
#undef BINARY
    }
    SINTER_THROW(DTypeError, "[internal] unary kernel ", int(op), " has no ", x.dtype(), " version");
  });
}

void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  SINTER_KERNEL_ENTRY();
  visit_dtype(out.dtype(), [&]<class T>() {
    for_each_strided<4>(out.shape(),
                        {static_cast<char*>(out.data_ptr()), static_cast<char*>(cond.data_ptr()),
                         static_cast<char*>(a.data_ptr()), static_cast<char*>(b.data_ptr())},
                        {broadcast_strides_bytes(out, out.shape()), broadcast_strides_bytes(cond, out.shape()),
                         broadcast_strides_bytes(a, out.shape()), broadcast_strides_bytes(b, out.shape())},
                        [&](std::array<char*, 4> p, std::array<int64_t, 4> s, int64_t n) {
      for (int64_t i = 0; i < n; ++i)
        *reinterpret_cast<T*>(p[0] + i * s[0]) = *reinterpret_cast<const bool*>(p[1] + i * s[1])
                                                     ? *reinterpret_cast<const T*>(p[2] + i * s[2])
                                                     : *reinterpret_cast<const T*>(p[3] + i * s[3]);
    });
  });
}

void clamp(const Tensor& x, std::optional<double> lo, std::optional<double> hi, const Tensor& out) {
  SINTER_KERNEL_ENTRY();
  visit_dtype(x.dtype(), [&]<class T>() {
    if constexpr (std::is_same_v<T, bool>) {
      SINTER_THROW(DTypeError, "[clamp] bool tensors cannot be clamped");
    } else {
      using C = compute_t<T>;
      const C l = lo ? C(*lo) : C(0), h = hi ? C(*hi) : C(0);
      const bool has_l = lo.has_value(), has_h = hi.has_value();
      for_each_strided<2>(out.shape(), {static_cast<char*>(out.data_ptr()), static_cast<char*>(x.data_ptr())},
                          {broadcast_strides_bytes(out, out.shape()), broadcast_strides_bytes(x, out.shape())},
                          [&](std::array<char*, 2> p, std::array<int64_t, 2> s, int64_t n) {
        for (int64_t i = 0; i < n; ++i) {
          C v = C(*reinterpret_cast<const T*>(p[1] + i * s[1]));
          if (has_l && v < l) v = l;
          if (has_h && v > h) v = h;
          *reinterpret_cast<T*>(p[0] + i * s[0]) = T(v);
        }
      });
    }
  });
}

void copy(const Tensor& src, const Tensor& dst) {
  SINTER_KERNEL_ENTRY();
  visit_dtype(src.dtype(), [&]<class S>() {
    visit_dtype(dst.dtype(), [&]<class D>() {
      for_each_strided<2>(dst.shape(), {static_cast<char*>(dst.data_ptr()), static_cast<char*>(src.data_ptr())},
                          {broadcast_strides_bytes(dst, dst.shape()), broadcast_strides_bytes(src, dst.shape())},
                          [&](std::array<char*, 2> p, std::array<int64_t, 2> s, int64_t n) {
        if (s[0] == sizeof(D) && s[1] == sizeof(S)) {
          D* o = reinterpret_cast<D*>(p[0]);
          const S* a = reinterpret_cast<const S*>(p[1]);
          if constexpr (std::is_same_v<S, D>) {
            std::memcpy(o, a, size_t(n) * sizeof(D));
          } else {
#pragma omp simd
            for (int64_t i = 0; i < n; ++i) o[i] = convert<D>(a[i]);
          }
        } else {
          for (int64_t i = 0; i < n; ++i)
            *reinterpret_cast<D*>(p[0] + i * s[0]) = convert<D>(*reinterpret_cast<const S*>(p[1] + i * s[1]));
        }
      });
    });
  });
}

void fill(const Tensor& dst, double value) {
  SINTER_KERNEL_ENTRY();
  visit_dtype(dst.dtype(), [&]<class T>() {
    const T v = convert<T>(value);
    for_each_strided<1>(dst.shape(), {static_cast<char*>(dst.data_ptr())}, {broadcast_strides_bytes(dst, dst.shape())},
                        [&](std::array<char*, 1> p, std::array<int64_t, 1> s, int64_t n) {
      for (int64_t i = 0; i < n; ++i) *reinterpret_cast<T*>(p[0] + i * s[0]) = v;
    });
  });
}

}  // namespace sinter::cpu

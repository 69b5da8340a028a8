#pragma once
// Runs a templated callable with the C++ type of a runtime dtype:
//   visit_dtype(t.dtype(), [&]<class T>() { ... T ... });
#include <cstdint>
#include <type_traits>

#include "sinter/dtype.h"
#include "sinter/error.h"

namespace sinter {

template <class F> decltype(auto) visit_dtype(DType t, F&& f) {
  switch (t) {
    case DType::f32: return f.template operator()<float>();
    case DType::f64: return f.template operator()<double>();
    case DType::f16: return f.template operator()<f16>();
    case DType::bf16: return f.template operator()<bf16>();
    case DType::i8: return f.template operator()<int8_t>();
    case DType::u8: return f.template operator()<uint8_t>();
    case DType::i32: return f.template operator()<int32_t>();
    case DType::i64: return f.template operator()<int64_t>();
    case DType::boolean: return f.template operator()<bool>();
  }
  SINTER_THROW(Error, "[internal] unknown dtype ", int(t));
}

// The type arithmetic runs in for a storage type: half types widen to float.
template <class T> struct compute_type { using type = T; };
template <> struct compute_type<f16> { using type = float; };
template <> struct compute_type<bf16> { using type = float; };
template <class T> using compute_t = typename compute_type<T>::type;

// A float to an integer: truncated toward zero, NaN as 0, beyond int64 saturated; then narrowed
// modulo 2^bits (well-defined, where converting an out-of-range float directly is not).
inline int64_t float_to_int64(double d) {
  return d != d ? 0 : d >= 9.2233720368547758e18 ? INT64_MAX : d <= -9.2233720368547758e18 ? INT64_MIN : int64_t(d);
}

template <class D, class S> inline D convert(S v) {
  if constexpr (std::is_same_v<D, S>) return v;
  else if constexpr (std::is_same_v<D, f16> || std::is_same_v<D, bf16>) return D(float(v));
  else if constexpr (std::is_same_v<S, f16> || std::is_same_v<S, bf16>) return convert<D>(float(v));
  else if constexpr (std::is_same_v<D, bool>) return v != S(0);
  else if constexpr (std::is_integral_v<D> && std::is_floating_point_v<S>) return D(float_to_int64(double(v)));
  else return D(v);
}

}  // namespace sinter

#pragma once
// Element types. f16/bf16 are storage types: arithmetic widens them to float and rounds back
// to nearest-even, so results match PyTorch's CPU behaviour for these dtypes.
#include <cstdint>
#include <cstring>
#include <ostream>
#include <string_view>

namespace sinter {

enum class DType : uint8_t { f32, f64, f16, bf16, i8, u8, i32, i64, boolean };
inline constexpr int kNumDTypes = 9;

struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  explicit bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) { bits = uint16_t((u >> 16) | 0x40); return; }  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
    bits = uint16_t(u >> 16);
  }
  operator float() const {
    uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

struct f16 {
  uint16_t bits = 0;
  f16() = default;
  explicit f16(float f);
  operator float() const;
};

const char* dtype_name(DType t);                // "f32", "bf16", ...
DType dtype_from_name(std::string_view name);   // the inverse; a ValueError names an unknown one
const char* dtype_safetensors_name(DType t);    // "F32", "BF16", ...
bool dtype_from_safetensors_name(std::string_view s, DType* out);
int64_t dtype_size(DType t);
inline bool is_floating(DType t) { return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16; }
inline bool is_integral(DType t) { return !is_floating(t) && t != DType::boolean; }
// NumPy/PyTorch-style promotion between two tensor dtypes: bool < ints < floats.
DType promote_types(DType a, DType b);
// The dtype arithmetic runs in: f16/bf16 compute in f32.
inline DType compute_dtype(DType t) { return (t == DType::f16 || t == DType::bf16) ? DType::f32 : t; }

inline std::ostream& operator<<(std::ostream& os, DType t) { return os << dtype_name(t); }

template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::f64; };
template <> struct dtype_of<f16> { static constexpr DType value = DType::f16; };
template <> struct dtype_of<bf16> { static constexpr DType value = DType::bf16; };
template <> struct dtype_of<int8_t> { static constexpr DType value = DType::i8; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::u8; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::i32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::i64; };
template <> struct dtype_of<bool> { static constexpr DType value = DType::boolean; };

}  // namespace sinter

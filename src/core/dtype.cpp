#include "sinter/dtype.h"

#include <cmath>

#include "sinter/error.h"

namespace sinter {

// IEEE half <-> float, rounding to nearest even (as F16C's vcvtps2ph with imm 0).
f16::f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) { bits = uint16_t(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0)); return; }
  if (ax >= 0x477ff000u) { bits = uint16_t(sign | 0x7c00u); return; }  // rounds to >= 65520: inf
  if (ax < 0x38800000u) {  // below the smallest normal half: subnormal or zero
    float af;
    std::memcpy(&af, &ax, 4);
    // Adding 0.5 shifts the value so the FPU's round-to-nearest-even yields the subnormal bits.
    float r = af + 0.5f;
    uint32_t rb;
    std::memcpy(&rb, &r, 4);
    bits = uint16_t(sign | (rb - 0x3f000000u));
    return;
  }
  const uint32_t mant_odd = (ax >> 13) & 1u;
  ax += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round
  bits = uint16_t(sign | (ax >> 13));
}

f16::operator float() const {
  const uint32_t sign = uint32_t(bits & 0x8000u) << 16;
  const uint32_t exp = (bits >> 10) & 0x1fu, mant = bits & 0x3ffu;
  uint32_t out;
  if (exp == 0) {
    float f = float(mant) * 5.9604644775390625e-8f;  // 2^-24
    std::memcpy(&out, &f, 4);
    out |= sign;
  } else if (exp == 31) {
    out = sign | 0x7f800000u | (mant << 13);
  } else {
    out = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &out, 4);
  return f;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i8: return "i8";
    case DType::u8: return "u8";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::boolean: return "bool";
  }
  return "?";
}

const char* dtype_safetensors_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::i8: return "I8";
    case DType::u8: return "U8";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::boolean: return "BOOL";
  }
  return "?";
}

bool dtype_from_safetensors_name(std::string_view s, DType* out) {
  for (int i = 0; i < kNumDTypes; ++i) {
    if (s == dtype_safetensors_name(DType(i))) { *out = DType(i); return true; }
  }
  return false;
}

int64_t dtype_size(DType t) {
  switch (t) {
    case DType::f64: case DType::i64: return 8;
    case DType::f32: case DType::i32: return 4;
    case DType::f16: case DType::bf16: return 2;
    case DType::i8: case DType::u8: case DType::boolean: return 1;
  }
  return 1;
}

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  auto rank = [](DType t) {
    switch (t) {
      case DType::boolean: return 0;
      case DType::u8: return 1;
      case DType::i8: return 2;
      case DType::i32: return 3;
      case DType::i64: return 4;
      case DType::f16: return 5;
      case DType::bf16: return 6;
      case DType::f32: return 7;
      case DType::f64: return 8;
    }
    return 0;
  };
  if ((a == DType::u8 && b == DType::i8) || (a == DType::i8 && b == DType::u8)) return DType::i32;
  if ((a == DType::f16 && b == DType::bf16) || (a == DType::bf16 && b == DType::f16)) return DType::f32;
  return rank(a) >= rank(b) ? a : b;
}

DType dtype_from_name(std::string_view name) {
  for (int i = 0; i < kNumDTypes; ++i)
    if (name == dtype_name(DType(i))) return DType(i);
  SINTER_THROW(ValueError, "[dtype] unknown dtype '", std::string(name), "'");
}

}  // namespace sinter

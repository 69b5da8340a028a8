#pragma once
// The CUDA emulator's half type (../emulator.h): IEEE binary16 bits, converted by libsinter's f16
// (round to nearest, ties to even, as the device's __float2half_rn).
#include <cstdint>

#include "sinter/dtype.h"

struct __half {
  uint16_t bits;
};
inline float __half2float(__half h) {
  sinter::f16 v;
  v.bits = h.bits;
  return float(v);
}
inline __half __float2half_rn(float f) { return {sinter::f16(f).bits}; }
inline __half __ushort_as_half(unsigned short bits) { return {bits}; }
inline unsigned short __half_as_ushort(__half h) { return h.bits; }

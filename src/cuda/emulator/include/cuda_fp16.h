#pragma once
// The CUDA emulator's half type (../emulator.h): IEEE binary16 through the compiler's _Float16
// (conversions round to nearest, ties to even, as the device's __float2half_rn does).
#include <cstring>

struct __half {
  _Float16 v;
};
inline float __half2float(__half h) { return float(h.v); }
inline __half __float2half_rn(float f) { return {_Float16(f)}; }
inline __half __ushort_as_half(unsigned short bits) {
  __half h;
  std::memcpy(&h, &bits, 2);
  return h;
}
inline unsigned short __half_as_ushort(__half h) {
  unsigned short bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}

#pragma once
// Numbers as text for tables and file names (the profile table, log.csv, checkpoint and cache
// names): fixed-point digits, padding, hexadecimal and zero-padded decimal, through std::to_chars.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>

namespace sinter {

// v with `digits` decimals: fixed(3.14159, 2) = "3.14".
inline std::string fixed(double v, int digits) {
  char b[400];
  const auto r = std::to_chars(b, b + sizeof b, v, std::chars_format::fixed, digits);
  return std::string(b, r.ptr);
}

// s padded with spaces to `width`: on the left (right-aligned), or on the right.
inline std::string pad_left(const std::string& s, size_t width) { return s.size() >= width ? s : std::string(width - s.size(), ' ') + s; }
inline std::string pad_right(const std::string& s, size_t width) { return s.size() >= width ? s : s + std::string(width - s.size(), ' '); }

// v in hexadecimal, `width` digits with leading zeros.
inline std::string hex(uint64_t v, int width) {
  char b[32];
  const auto r = std::to_chars(b, b + sizeof b, v, 16);
  const std::string s(b, r.ptr);
  return std::string(size_t(std::max<int>(0, width - int(s.size()))), '0') + s;
}

// v in decimal, `width` digits with leading zeros (v >= 0).
inline std::string zero_pad(int64_t v, int width) {
  const std::string s = std::to_string(v);
  return std::string(size_t(std::max<int>(0, width - int(s.size()))), '0') + s;
}

}  // namespace sinter

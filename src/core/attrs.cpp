// Attrs, an op call's attributes (sinter/op.h): typed lookup, hashing and printing. In core, so
// the kernels (which read their attributes) build without the op table: the runtime links them.
#include <ostream>

#include "sinter/op.h"

namespace sinter {

double Attrs::f(std::string_view name) const {
  const AttrValue* v = find(name);
  SINTER_CHECK(v != nullptr, "[attrs] missing attribute '", name, "'");
  if (auto* i = std::get_if<int64_t>(v)) return double(*i);
  auto* d = std::get_if<double>(v);
  SINTER_CHECK(d != nullptr, "[attrs] attribute '", name, "' is not a number");
  return *d;
}

template <class T> const T& Attrs::get(std::string_view name) const {
  const AttrValue* v = find(name);
  SINTER_CHECK(v != nullptr, "[attrs] missing attribute '", name, "'");
  const T* p = std::get_if<T>(v);
  SINTER_CHECK(p != nullptr, "[attrs] attribute '", name, "' has another type");
  return *p;
}
template const int64_t& Attrs::get<int64_t>(std::string_view) const;
template const bool& Attrs::get<bool>(std::string_view) const;
template const Shape& Attrs::get<Shape>(std::string_view) const;
template const DType& Attrs::get<DType>(std::string_view) const;
template const std::string& Attrs::get<std::string>(std::string_view) const;
template const Device& Attrs::get<Device>(std::string_view) const;

void Attrs::set(std::string name, AttrValue v) {
  for (auto& [k, old] : items_)
    if (k == name) { old = std::move(v); return; }
  items_.emplace_back(std::move(name), std::move(v));
}

namespace {
uint64_t mix(uint64_t h, uint64_t v) {  // FNV-1a over 64-bit words
  h ^= v;
  return h * 0x100000001b3ull;
}
uint64_t hash_bytes(uint64_t h, const void* p, size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) h = mix(h, b[i]);
  return h;
}
}  // namespace

uint64_t Attrs::hash() const {
  uint64_t h = 0xcbf29ce484222325ull;
  for (auto& [k, v] : items_) {
    h = hash_bytes(h, k.data(), k.size());
    h = mix(h, v.index());
    std::visit([&](const auto& x) {
      using T = std::decay_t<decltype(x)>;
      if constexpr (std::is_same_v<T, Shape>) h = hash_bytes(mix(h, x.size()), x.data(), x.size() * sizeof(int64_t));
      else if constexpr (std::is_same_v<T, std::string>) h = hash_bytes(h, x.data(), x.size());
      else if constexpr (std::is_same_v<T, Device>) h = mix(mix(h, uint64_t(x.type)), uint64_t(x.index));
      else h = hash_bytes(h, &x, sizeof x);
    }, v);
  }
  return h;
}

std::ostream& operator<<(std::ostream& os, const Attrs& a) {
  os << "{";
  bool first = true;
  for (auto& [k, v] : a.items()) {
    os << (first ? "" : ", ") << k << "=";
    first = false;
    std::visit([&](const auto& x) { os << x; }, v);
  }
  return os << "}";
}

}  // namespace sinter

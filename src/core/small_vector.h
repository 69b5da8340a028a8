#pragma once
// A vector that keeps up to N elements inline: the per-op bookkeeping of the elementwise loops
// (dims, strides) then costs no heap allocation, which dominates ops on small tensors.
#include <algorithm>
#include <cstddef>
#include <vector>

namespace sinter {

template <class T, size_t N> class SmallVector {
 public:
  SmallVector() = default;
  SmallVector(size_t n, T v) { resize(n, v); }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  T* data() { return heap_.empty() ? inline_ : heap_.data(); }
  const T* data() const { return heap_.empty() ? inline_ : heap_.data(); }
  T& operator[](size_t i) { return data()[i]; }
  const T& operator[](size_t i) const { return data()[i]; }
  T& back() { return data()[n_ - 1]; }
  const T& back() const { return data()[n_ - 1]; }
  void push_back(T v) {
    if (heap_.empty() && n_ < N) {
      inline_[n_++] = v;
      return;
    }
    if (heap_.empty()) heap_.assign(inline_, inline_ + n_);
    heap_.push_back(v);
    ++n_;
  }
  void resize(size_t n, T v = T()) {
    while (n_ < n) push_back(v);
    n_ = std::min(n_, n);
    if (!heap_.empty()) heap_.resize(n_);
  }

 private:
  T inline_[N];
  std::vector<T> heap_;  // used once more than N elements are held
  size_t n_ = 0;
};

}  // namespace sinter

#pragma once
// Tensor: a ref-counted handle to a strided view of a Storage. A tensor whose storage holds no
// bytes is *symbolic*: it has shape, dtype, device and layout but no data, and ops on it only
// infer their outputs.
#include <algorithm>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <functional>
#include <initializer_list>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "sinter/dtype.h"
#include "sinter/error.h"

namespace sinter {

// A list of sizes (or strides, or dims) that keeps up to six of them inline: every tensor holds
// two and every op call copies several, so a heap allocation each would cost more than a small
// op's arithmetic (it was ~14% of a one-token decode step of the default model). Longer shapes
// move to the heap. It reads like std::vector<int64_t> and converts to and from one.
class Shape {
 public:
  using value_type = int64_t;
  using size_type = size_t;
  using difference_type = std::ptrdiff_t;
  using reference = int64_t&;
  using const_reference = const int64_t&;
  using pointer = int64_t*;
  using const_pointer = const int64_t*;
  using iterator = int64_t*;
  using const_iterator = const int64_t*;
  using reverse_iterator = std::reverse_iterator<iterator>;
  using const_reverse_iterator = std::reverse_iterator<const_iterator>;
  static constexpr size_t kInline = 6;

  Shape() = default;
  Shape(std::initializer_list<int64_t> v) { assign(v.begin(), v.end()); }
  explicit Shape(size_t n) { resize(n); }
  Shape(size_t n, int64_t value) { resize(n, value); }
  template <std::input_iterator It> Shape(It first, It last) { assign(first, last); }
  Shape(const std::vector<int64_t>& v) { assign(v.begin(), v.end()); }
  Shape(const Shape& o) { assign(o.begin(), o.end()); }
  Shape(Shape&& o) noexcept { take(o); }
  Shape& operator=(const Shape& o) {
    if (this != &o) assign(o.begin(), o.end());
    return *this;
  }
  Shape& operator=(Shape&& o) noexcept {
    if (this != &o) { release(); take(o); }
    return *this;
  }
  Shape& operator=(std::initializer_list<int64_t> v) { assign(v.begin(), v.end()); return *this; }
  ~Shape() { release(); }
  operator std::vector<int64_t>() const { return {begin(), end()}; }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  size_t capacity() const { return heap_ ? cap_ : kInline; }
  int64_t* data() { return heap_ ? heap_ : inline_; }
  const int64_t* data() const { return heap_ ? heap_ : inline_; }
  iterator begin() { return data(); }
  iterator end() { return data() + size_; }
  const_iterator begin() const { return data(); }
  const_iterator end() const { return data() + size_; }
  const_iterator cbegin() const { return begin(); }
  const_iterator cend() const { return end(); }
  reverse_iterator rbegin() { return reverse_iterator(end()); }
  reverse_iterator rend() { return reverse_iterator(begin()); }
  const_reverse_iterator rbegin() const { return const_reverse_iterator(end()); }
  const_reverse_iterator rend() const { return const_reverse_iterator(begin()); }
  int64_t& operator[](size_t i) { return data()[i]; }
  const int64_t& operator[](size_t i) const { return data()[i]; }
  int64_t& at(size_t i);
  const int64_t& at(size_t i) const;
  int64_t& front() { return data()[0]; }
  const int64_t& front() const { return data()[0]; }
  int64_t& back() { return data()[size_ - 1]; }
  const int64_t& back() const { return data()[size_ - 1]; }

  void reserve(size_t n);
  void clear() { size_ = 0; }
  void resize(size_t n, int64_t value = 0);
  void push_back(int64_t v) {
    if (size_ == capacity()) reserve(2 * size_);
    data()[size_++] = v;
  }
  void pop_back() { --size_; }
  template <std::input_iterator It> void assign(It first, It last) {
    clear();
    for (; first != last; ++first) push_back(int64_t(*first));
  }
  void assign(size_t n, int64_t value) { clear(); resize(n, value); }
  iterator insert(const_iterator pos, int64_t v);
  template <std::input_iterator It> iterator insert(const_iterator pos, It first, It last) {
    const size_t at = size_t(pos - begin());
    for (size_t i = at; first != last; ++first, ++i) insert(begin() + i, int64_t(*first));
    return begin() + at;
  }
  iterator erase(const_iterator pos) { return erase(pos, pos + 1); }
  iterator erase(const_iterator first, const_iterator last);

  int64_t numel() const;
  friend bool operator==(const Shape& a, const Shape& b) {
    return a.size_ == b.size_ && std::equal(a.begin(), a.end(), b.begin());
  }
  friend auto operator<=>(const Shape& a, const Shape& b) {
    return std::lexicographical_compare_three_way(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  void release() {
    delete[] heap_;
    heap_ = nullptr;
    size_ = 0;
  }
  void take(Shape& o) noexcept {  // this holds nothing
    if (o.heap_) {
      heap_ = o.heap_;
      cap_ = o.cap_;
      o.heap_ = nullptr;
    } else {
      std::copy(o.inline_, o.inline_ + o.size_, inline_);
    }
    size_ = o.size_;
    o.size_ = 0;
  }
  int64_t* heap_ = nullptr;  // null: the elements are inline_
  uint32_t size_ = 0;
  uint32_t cap_ = 0;         // of heap_
  int64_t inline_[kInline];
};
std::ostream& operator<<(std::ostream& os, const Shape& s);  // prints "(2, 3, 4)"

// Where a tensor's bytes live. Kernels are looked up by (op, device type) in the op table;
// `external` is the slot for a backend registered from outside the library (PyTorch's
// PrivateUse1): it gets an allocator and kernels like any other device.
enum class DeviceType : uint8_t { cpu, cuda, external };
inline constexpr int kNumDeviceTypes = 3;
struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;
  bool operator==(const Device&) const = default;
  static constexpr Device cpu() { return {}; }
  static constexpr Device cuda(int index = 0) { return {DeviceType::cuda, index}; }
  // "cpu", "cuda" (= cuda:0) or "cuda:N"; anything else is a ValueError naming the text.
  static Device parse(const std::string& text);
};
std::ostream& operator<<(std::ostream& os, Device d);

// Device memory: each device type has one allocator (the CPU's is built in; others register
// theirs). Blocks are 64-byte aligned.
struct Allocator {
  std::function<void*(int64_t nbytes, int index)> alloc;
  std::function<void(void* p, int64_t nbytes, int index)> free;
};
void register_allocator(DeviceType type, Allocator a);
bool has_allocator(DeviceType type);

// Bytes with a version counter shared by every view (bumped by in-place ops).
// A symbolic tensor's storage holds no bytes (data is null) but still gives identity: its views
// and detached copies share it, and a lazy trace that computes the value attaches the bytes here.
struct Storage {
  void* data = nullptr;
  int64_t nbytes = 0;
  uint64_t version = 0;
  Device device;
  bool symbolic = false;
  std::function<void(void*)> deleter;  // null: not owned
  static std::shared_ptr<Storage> allocate(int64_t nbytes, Device device = {});
  ~Storage();
};

class Tensor;
namespace autograd { struct Node; }

struct TensorImpl {
  std::shared_ptr<Storage> storage;  // symbolic tensors have one too (Storage::symbolic)
  int64_t offset = 0;                // in elements
  Shape shape;
  Shape strides;                     // in elements
  DType dtype = DType::f32;
  Device device;
  bool requires_grad = false;
  std::shared_ptr<autograd::Node> grad_fn;  // null for leaves
  int output_nr = 0;
  std::shared_ptr<TensorImpl> grad;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // Construction
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = {});
  // No data: shape, dtype, device and a layout (contiguous unless strides are given, as a view's).
  static Tensor symbolic(const Shape& shape, DType dtype = DType::f32, Device device = {}, const Shape* strides = nullptr,
                         int64_t offset = 0);
  static Tensor from_storage(std::shared_ptr<Storage> s, const Shape& shape, const Shape& strides,
                             int64_t offset, DType dtype);

  // Properties
  bool defined() const { return impl_ != nullptr; }
  bool is_symbolic() const { return impl().storage->symbolic; }
  const Shape& shape() const { return impl().shape; }
  const Shape& strides() const { return impl().strides; }
  int64_t dim() const { return int64_t(impl().shape.size()); }
  int64_t size(int64_t d) const;
  int64_t stride(int64_t d) const;
  int64_t numel() const { return impl().shape.numel(); }
  int64_t offset() const { return impl().offset; }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().device; }
  int64_t element_size() const { return dtype_size(dtype()); }
  bool is_contiguous() const;
  bool same(const Tensor& o) const { return impl_ == o.impl_; }
  uint64_t version() const;
  const std::shared_ptr<Storage>& storage() const { return impl().storage; }

  // Data access (throws on symbolic tensors and on dtype mismatch)
  void* data_ptr() const;
  template <class T> T* data() const;
  template <class T> T item() const;
  template <class T> std::vector<T> to_vector() const;
  double item_double() const;

  // Autograd
  bool requires_grad() const { return impl().requires_grad; }
  Tensor& requires_grad_(bool on = true);
  bool is_leaf() const { return impl().grad_fn == nullptr; }
  Tensor grad() const { return impl().grad ? Tensor(impl().grad) : Tensor(); }
  void set_grad(const Tensor& g);
  const std::shared_ptr<autograd::Node>& grad_fn() const { return impl().grad_fn; }
  void backward(const Tensor& gradient = {}, bool retain_graph = false) const;
  Tensor detach() const;  // shares storage, no history

  // Views and copies (all are ops: they record history and trace)
  Tensor view(const Shape& shape) const;      // must be expressible as a view, else ShapeError
  Tensor reshape(const Shape& shape) const;   // view when possible, else copy
  Tensor flatten(int64_t start = 0, int64_t end = -1) const;
  Tensor permute(const Shape& dims) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor t() const { return transpose(0, 1); }
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor expand(const Shape& shape) const;
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor contiguous() const;
  Tensor clone() const;
  Tensor to(DType dtype) const;
  Tensor to(Device device) const;  // a copy on `device` (contiguous), or this tensor when it is there

  // In-place (bump the version counter; refused on tensors that require grad while grad mode is on)
  Tensor& add_(const Tensor& o, double alpha = 1.0);
  Tensor& add_(double v);
  Tensor& sub_(const Tensor& o);
  Tensor& mul_(const Tensor& o);
  Tensor& mul_(double v);
  Tensor& div_(const Tensor& o);
  Tensor& zero_();
  Tensor& fill_(double v);
  Tensor& copy_(const Tensor& src);

  std::string to_string() const;
  TensorImpl& impl() const;
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// Factories, on the CPU unless a device is given. Random ones draw from the global Philox generator
// (see random.h): the same seed gives the same values on every device.
Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = {});
Tensor ones(const Shape& shape, DType dtype = DType::f32, Device device = {});
Tensor full(const Shape& shape, double value, DType dtype = DType::f32, Device device = {});
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, double value);
Tensor arange(double start, double end, double step = 1.0, DType dtype = DType::i64);
Tensor arange(int64_t end, DType dtype = DType::i64);
Tensor linspace(double start, double end, int64_t steps, DType dtype = DType::f32);
Tensor eye(int64_t n, int64_t m = -1, DType dtype = DType::f32);
Tensor rand(const Shape& shape, DType dtype = DType::f32, Device device = {});   // U[0, 1)
Tensor randn(const Shape& shape, DType dtype = DType::f32, Device device = {});  // N(0, 1)
Tensor randint(int64_t low, int64_t high, const Shape& shape, DType dtype = DType::i64, Device device = {});
Tensor scalar_tensor(double v, DType dtype);
// Wraps memory the caller owns (no copy); `deleter`, when given, runs when the last view dies.
Tensor from_blob(void* data, const Shape& shape, DType dtype, std::function<void(void*)> deleter = {});
template <class T> Tensor tensor(const std::vector<T>& values, const Shape& shape);
template <class T> Tensor tensor(const std::vector<T>& values) { return tensor(values, Shape{int64_t(values.size())}); }

// ---- template definitions ----
template <class T> T* Tensor::data() const {
  SINTER_CHECK(device().type != DeviceType::cuda, "[data] the tensor is on ", device(),
               ": the host cannot read it; copy it first with .to(Device::cpu())");
  SINTER_CHECK_DTYPE(dtype_of<T>::value == dtype(), "[data] tensor has dtype ", dtype(), ", asked for ",
                     dtype_name(dtype_of<T>::value));
  return static_cast<T*>(data_ptr());
}

namespace detail {
Tensor local_scalar(const Tensor& t);  // the `item` op: a 0-d copy of a one-element tensor
}

template <class T> T Tensor::item() const { return detail::local_scalar(*this).to_vector<T>()[0]; }

std::vector<double> to_double_vector(const Tensor& t);  // any dtype, logical (row-major) order

template <class T> std::vector<T> Tensor::to_vector() const {
  Tensor c = device().type == DeviceType::cpu ? contiguous() : to(Device::cpu());
  if (c.dtype() != dtype_of<T>::value) c = c.to(dtype_of<T>::value);
  const T* p = c.data<T>();
  return std::vector<T>(p, p + c.numel());
}

template <class T> Tensor tensor(const std::vector<T>& values, const Shape& shape) {
  SINTER_CHECK_SHAPE(int64_t(values.size()) == shape.numel(), "[tensor] ", values.size(),
                     " values do not fill shape ", shape);
  Tensor t = Tensor::empty(shape, dtype_of<T>::value);
  if constexpr (std::is_same_v<T, bool>) {
    bool* p = t.data<bool>();
    for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];
  } else {
    if (!values.empty()) std::memcpy(t.data_ptr(), values.data(), values.size() * sizeof(T));
  }
  return t;
}

}  // namespace sinter

#pragma once
// Tensor: a ref-counted handle to a strided view of a Storage. A tensor with no storage is
// *symbolic*: it has shape, dtype and device but no data, and ops on it only infer their outputs.
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "sinter/dtype.h"
#include "sinter/error.h"

namespace sinter {

struct Shape : std::vector<int64_t> {
  using std::vector<int64_t>::vector;
  Shape() = default;
  Shape(const std::vector<int64_t>& v) : std::vector<int64_t>(v) {}
  int64_t numel() const;
};
std::ostream& operator<<(std::ostream& os, const Shape& s);  // prints "(2, 3, 4)"

enum class DeviceType : uint8_t { cpu, cuda };
struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;
  bool operator==(const Device&) const = default;
};
std::ostream& operator<<(std::ostream& os, Device d);

// 64-byte aligned bytes with a version counter shared by every view (bumped by in-place ops).
struct Storage {
  void* data = nullptr;
  int64_t nbytes = 0;
  uint64_t version = 0;
  std::function<void(void*)> deleter;  // null: not owned
  static std::shared_ptr<Storage> allocate(int64_t nbytes);
  ~Storage();
};

class Tensor;
namespace autograd { struct Node; }

struct TensorImpl {
  std::shared_ptr<Storage> storage;  // null for a symbolic tensor
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
  static Tensor empty(const Shape& shape, DType dtype = DType::f32);
  static Tensor symbolic(const Shape& shape, DType dtype = DType::f32, Device device = {});
  static Tensor from_storage(std::shared_ptr<Storage> s, const Shape& shape, const Shape& strides,
                             int64_t offset, DType dtype);

  // Properties
  bool defined() const { return impl_ != nullptr; }
  bool is_symbolic() const { return impl().storage == nullptr; }
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
  void set_grad(const Tensor& g) { impl().grad = g.impl_; }
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

// Factories. Random ones draw from the global Philox generator (see random.h).
Tensor zeros(const Shape& shape, DType dtype = DType::f32);
Tensor ones(const Shape& shape, DType dtype = DType::f32);
Tensor full(const Shape& shape, double value, DType dtype = DType::f32);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, double value);
Tensor arange(double start, double end, double step = 1.0, DType dtype = DType::i64);
Tensor arange(int64_t end, DType dtype = DType::i64);
Tensor linspace(double start, double end, int64_t steps, DType dtype = DType::f32);
Tensor eye(int64_t n, int64_t m = -1, DType dtype = DType::f32);
Tensor rand(const Shape& shape, DType dtype = DType::f32);                  // U[0, 1)
Tensor randn(const Shape& shape, DType dtype = DType::f32);                 // N(0, 1)
Tensor randint(int64_t low, int64_t high, const Shape& shape, DType dtype = DType::i64);
Tensor scalar_tensor(double v, DType dtype);
// Wraps memory the caller owns (no copy); `deleter`, when given, runs when the last view dies.
Tensor from_blob(void* data, const Shape& shape, DType dtype, std::function<void(void*)> deleter = {});
template <class T> Tensor tensor(const std::vector<T>& values, const Shape& shape);
template <class T> Tensor tensor(const std::vector<T>& values) { return tensor(values, Shape{int64_t(values.size())}); }

// ---- template definitions ----
template <class T> T* Tensor::data() const {
  SINTER_CHECK_DTYPE(dtype_of<T>::value == dtype(), "[data] tensor has dtype ", dtype(), ", asked for ",
                     dtype_name(dtype_of<T>::value));
  return static_cast<T*>(data_ptr());
}

template <class T> T Tensor::item() const {
  SINTER_CHECK_SHAPE(numel() == 1, "[item] tensor of shape ", shape(), " has ", numel(), " elements, not 1");
  return to_vector<T>()[0];
}

std::vector<double> to_double_vector(const Tensor& t);  // any dtype, logical (row-major) order

template <class T> std::vector<T> Tensor::to_vector() const {
  Tensor c = contiguous();
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

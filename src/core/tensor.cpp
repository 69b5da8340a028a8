#include "sinter/tensor.h"

#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <sstream>

#include "core/allocator.h"
#include "core/cuda_hooks.h"
#include "core/view.h"

namespace sinter {

using detail::contiguous_strides;

int64_t& Shape::at(size_t i) {
  SINTER_CHECK_INDEX(i < size_, "[shape] index ", i, " out of range for ", size_, " dims");
  return data()[i];
}
const int64_t& Shape::at(size_t i) const {
  SINTER_CHECK_INDEX(i < size_, "[shape] index ", i, " out of range for ", size_, " dims");
  return data()[i];
}

void Shape::reserve(size_t n) {
  if (n <= capacity()) return;
  n = std::max<size_t>(n, 2 * kInline);
  auto* p = new int64_t[n];
  std::copy(begin(), end(), p);
  delete[] heap_;
  heap_ = p;
  cap_ = uint32_t(n);
}

void Shape::resize(size_t n, int64_t value) {
  reserve(n);
  if (n > size_) std::fill(data() + size_, data() + n, value);
  size_ = uint32_t(n);
}

Shape::iterator Shape::insert(const_iterator pos, int64_t v) {
  const size_t at = size_t(pos - begin());
  push_back(v);
  std::rotate(begin() + at, end() - 1, end());
  return begin() + at;
}

Shape::iterator Shape::erase(const_iterator first, const_iterator last) {
  const size_t a = size_t(first - begin()), b = size_t(last - begin());
  std::copy(begin() + b, end(), begin() + a);
  size_ -= uint32_t(b - a);
  return begin() + a;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int64_t d : *this) n *= d;
  return n;
}

std::ostream& operator<<(std::ostream& os, const Shape& s) {
  os << "(";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  return os << ")";
}

std::ostream& operator<<(std::ostream& os, Device d) {
  switch (d.type) {
    case DeviceType::cpu: return os << "cpu";
    case DeviceType::cuda: return os << "cuda:" << d.index;
    case DeviceType::external: return os << "external:" << d.index;
  }
  return os << "device?";
}

Device Device::parse(const std::string& text) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  if (text.rfind("cuda:", 0) == 0 && text.size() > 5 && text.size() <= 8 &&
      text.find_first_not_of("0123456789", 5) == std::string::npos)
    return cuda(std::stoi(text.substr(5)));
  SINTER_THROW(ValueError, "[device] '", text, "' is not a device: cpu, cuda or cuda:N");
}

std::shared_ptr<Storage> Storage::allocate(int64_t nbytes, Device device) {
  auto s = std::make_shared<Storage>();
  s->nbytes = nbytes;
  s->device = device;
  if (device.type == DeviceType::cpu) {
    s->data = cpu_alloc(nbytes);
    s->deleter = [nbytes](void* p) { cpu_free(p, nbytes); };
  } else {
    if (device.type == DeviceType::cuda) detail::require_cuda();  // loads the backend on first use
    const Allocator& a = device_allocator(device.type);
    s->data = a.alloc(nbytes, device.index);
    s->deleter = [free = a.free, nbytes, index = device.index](void* p) { free(p, nbytes, index); };
  }
  return s;
}

Storage::~Storage() {
  if (deleter) deleter(data);
}


static void check_shape(const char* op, const Shape& shape) {
  for (int64_t d : shape) SINTER_CHECK_SHAPE(d >= 0, "[", op, "] negative dimension in shape ", shape);
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  check_shape("empty", shape);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = Storage::allocate(shape.numel() * dtype_size(dtype), device);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  impl->device = device;
  return Tensor(std::move(impl));
}

Tensor Tensor::symbolic(const Shape& shape, DType dtype, Device device, const Shape* strides, int64_t offset) {
  check_shape("symbolic", shape);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>();
  impl->storage->symbolic = true;
  impl->storage->device = device;
  impl->storage->nbytes = shape.numel() * dtype_size(dtype);
  impl->shape = shape;
  impl->strides = strides ? *strides : contiguous_strides(shape);
  impl->offset = offset;
  impl->dtype = dtype;
  impl->device = device;
  return Tensor(std::move(impl));
}

Tensor Tensor::from_storage(std::shared_ptr<Storage> s, const Shape& shape, const Shape& strides, int64_t offset,
                            DType dtype) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(s);
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = dtype;
  impl->device = impl->storage ? impl->storage->device : Device{};
  return Tensor(std::move(impl));
}

TensorImpl& Tensor::impl() const {
  SINTER_CHECK(impl_ != nullptr, "[tensor] use of an undefined tensor");
  return *impl_;
}

static int64_t wrap_dim(const char* op, int64_t d, int64_t ndim) {
  const int64_t n = std::max<int64_t>(ndim, 1);
  SINTER_CHECK_INDEX(d >= -n && d < n, "[", op, "] dimension ", d, " out of range for a ", ndim, "-d tensor");
  return d < 0 ? d + n : d;
}

int64_t Tensor::size(int64_t d) const { return shape()[size_t(wrap_dim("size", d, dim()))]; }
int64_t Tensor::stride(int64_t d) const { return strides()[size_t(wrap_dim("stride", d, dim()))]; }

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int64_t i = dim(); i-- > 0;) {
    if (shape()[size_t(i)] == 1) continue;
    if (strides()[size_t(i)] != expected) return false;
    expected *= shape()[size_t(i)];
  }
  return true;
}

uint64_t Tensor::version() const { return storage()->version; }

namespace detail {
std::function<void(const Tensor&)> g_materialize;
std::function<void(const Tensor&)> g_grad_cleared;  // a compiler trace: which leaves the function clears
}

void Tensor::set_grad(const Tensor& g) {
  if (!g.defined() && detail::g_grad_cleared) detail::g_grad_cleared(*this);
  impl().grad = g.impl_;
}

void* Tensor::data_ptr() const {
  if (is_symbolic() && detail::g_materialize) detail::g_materialize(*this);  // a lazy trace computes it now
  SINTER_CHECK(!is_symbolic(), "[data] tensor of shape ", shape(), " is symbolic: it has no data");
  return static_cast<char*>(storage()->data) + offset() * element_size();
}

Tensor& Tensor::requires_grad_(bool on) {
  SINTER_CHECK_T(AutogradError, !on || is_floating(dtype()), "[requires_grad] only floating tensors can require grad, got ",
                 dtype());
  SINTER_CHECK_T(AutogradError, is_leaf(), "[requires_grad] can only be set on leaf tensors (this one has a history)");
  impl().requires_grad = on;
  return *this;
}

Tensor Tensor::detach() const {
  auto impl = std::make_shared<TensorImpl>();
  const TensorImpl& me = this->impl();
  impl->storage = me.storage;
  impl->offset = me.offset;
  impl->shape = me.shape;
  impl->strides = me.strides;
  impl->dtype = me.dtype;
  impl->device = me.device;
  return Tensor(std::move(impl));
}

Tensor from_blob(void* data, const Shape& shape, DType dtype, std::function<void(void*)> deleter) {
  check_shape("from_blob", shape);
  auto s = std::make_shared<Storage>();
  s->data = data;
  s->nbytes = shape.numel() * dtype_size(dtype);
  s->deleter = std::move(deleter);
  return Tensor::from_storage(std::move(s), shape, contiguous_strides(shape), 0, dtype);
}

}  // namespace sinter

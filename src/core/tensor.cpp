#include "sinter/tensor.h"

#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <sstream>

#include "core/allocator.h"
#include "core/dispatch.h"
#include "core/parallel.h"
#include "cpu/cpu.h"
#include "sinter/autograd.h"
#include "sinter/ops.h"
#include "sinter/random.h"

namespace sinter {

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
  return os << (d.type == DeviceType::cpu ? "cpu" : "cuda:") << (d.type == DeviceType::cpu ? "" : std::to_string(d.index));
}

std::shared_ptr<Storage> Storage::allocate(int64_t nbytes) {
  auto s = std::make_shared<Storage>();
  s->data = cpu_alloc(nbytes);
  s->nbytes = nbytes;
  s->deleter = [nbytes](void* p) { cpu_free(p, nbytes); };
  return s;
}

Storage::~Storage() {
  if (deleter) deleter(data);
}

static Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) { st[i] = s; s *= std::max<int64_t>(shape[i], 1); }
  return st;
}

static void check_shape(const char* op, const Shape& shape) {
  for (int64_t d : shape) SINTER_CHECK_SHAPE(d >= 0, "[", op, "] negative dimension in shape ", shape);
}

Tensor Tensor::empty(const Shape& shape, DType dtype) {
  check_shape("empty", shape);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = Storage::allocate(shape.numel() * dtype_size(dtype));
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::symbolic(const Shape& shape, DType dtype, Device device) {
  check_shape("symbolic", shape);
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
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

uint64_t Tensor::version() const { return storage() ? storage()->version : 0; }

void* Tensor::data_ptr() const {
  SINTER_CHECK(!is_symbolic(), "[data] tensor of shape ", shape(), " is symbolic: it has no data");
  return static_cast<char*>(storage()->data) + offset() * element_size();
}

double Tensor::item_double() const {
  SINTER_CHECK_SHAPE(numel() == 1, "[item] tensor of shape ", shape(), " has ", numel(), " elements, not 1");
  return to_double_vector(*this)[0];
}

std::vector<double> to_double_vector(const Tensor& t) {
  return t.to_vector<double>();
}

Tensor& Tensor::requires_grad_(bool on) {
  SINTER_CHECK_T(AutogradError, !on || is_floating(dtype()), "[requires_grad] only floating tensors can require grad, got ",
                 dtype());
  SINTER_CHECK_T(AutogradError, is_leaf(), "[requires_grad] can only be set on leaf tensors (this one has a history)");
  impl().requires_grad = on;
  return *this;
}

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  autograd::backward({*this}, gradient.defined() ? std::vector<Tensor>{gradient} : std::vector<Tensor>{}, retain_graph);
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

// ---- in-place ----

static void check_inplace(const Tensor& t, const char* op) {
  SINTER_CHECK(!t.is_symbolic(), "[", op, "] in-place ops need data; this tensor is symbolic");
  SINTER_CHECK_T(AutogradError, !(t.requires_grad() && grad_enabled()), "[", op,
                 "] in-place op on a tensor that requires grad while grad mode is on; use the out-of-place op, "
                 "or wrap the update in NoGradGuard");
}

static void bump(const Tensor& t) { ++t.storage()->version; }

static void check_inplace_broadcast(const char* op, const Tensor& self, const Tensor& o) {
  bool ok = o.dim() <= self.dim();
  for (int64_t i = 1; ok && i <= o.dim(); ++i) {
    const int64_t a = self.size(-i), b = o.size(-i);
    ok = (b == a || b == 1);
  }
  SINTER_CHECK_SHAPE(ok, "[", op, "] cannot broadcast ", o.shape(), " to the in-place target ", self.shape());
}

static Tensor& inplace_binary(Tensor& self, const Tensor& o, cpu::BinaryOp op, const char* name) {
  check_inplace(self, name);
  check_inplace_broadcast(name, self, o);
  SINTER_CHECK_DTYPE(is_floating(self.dtype()) || !is_floating(o.dtype()), "[", name, "] result of dtype ", o.dtype(),
                     " cannot be stored in a ", self.dtype(), " tensor");
  SINTER_CHECK_DTYPE(self.dtype() != DType::boolean, "[", name, "] bool tensors do not support arithmetic");
  SINTER_CHECK_DTYPE(op != cpu::BinaryOp::Div || is_floating(self.dtype()), "[", name,
                     "] true division into an integer tensor; cast it to a floating dtype first");
  Tensor other = o.dtype() == self.dtype() ? o : cast(o.detach(), self.dtype());
  cpu::binary(op, self, other, self);
  bump(self);
  return self;
}

Tensor& Tensor::add_(const Tensor& o, double alpha) {
  if (alpha == 1.0) return inplace_binary(*this, o, cpu::BinaryOp::Add, "add_");
  NoGradGuard g;
  return inplace_binary(*this, mul(o.detach(), alpha), cpu::BinaryOp::Add, "add_");
}
Tensor& Tensor::add_(double v) { return inplace_binary(*this, scalar_tensor(v, dtype()), cpu::BinaryOp::Add, "add_"); }
Tensor& Tensor::sub_(const Tensor& o) { return inplace_binary(*this, o, cpu::BinaryOp::Sub, "sub_"); }
Tensor& Tensor::mul_(const Tensor& o) { return inplace_binary(*this, o, cpu::BinaryOp::Mul, "mul_"); }
Tensor& Tensor::mul_(double v) { return inplace_binary(*this, scalar_tensor(v, dtype()), cpu::BinaryOp::Mul, "mul_"); }
Tensor& Tensor::div_(const Tensor& o) { return inplace_binary(*this, o, cpu::BinaryOp::Div, "div_"); }

Tensor& Tensor::zero_() { return fill_(0.0); }

Tensor& Tensor::fill_(double v) {
  check_inplace(*this, "fill_");
  cpu::fill(*this, v);
  bump(*this);
  return *this;
}

Tensor& Tensor::copy_(const Tensor& src) {
  check_inplace(*this, "copy_");
  check_inplace_broadcast("copy_", *this, src);
  SINTER_CHECK(!src.is_symbolic(), "[copy_] source tensor is symbolic");
  // Copying from an overlapping view of the same storage goes through a temporary.
  Tensor s = src.storage() == storage() ? src.detach().clone() : src;
  cpu::copy(s, *this);
  bump(*this);
  return *this;
}

// ---- printing ----

std::string Tensor::to_string() const {
  std::ostringstream os;
  os << *this;
  return os.str();
}

namespace {
struct Printer {
  std::ostream& os;
  const std::vector<double>& v;
  const Shape& shape;
  bool summarize;
  bool is_float, is_bool;
  int precision;
  bool sci;
  static constexpr int64_t kEdge = 3;

  void value(double x) {
    if (is_bool) { os << (x != 0 ? "true" : "false"); return; }
    if (!is_float) { os << int64_t(x); return; }
    if (std::isnan(x)) { os << "nan"; return; }
    if (std::isinf(x)) { os << (x > 0 ? "inf" : "-inf"); return; }
    if (sci) os << std::scientific << std::setprecision(precision) << x;
    else os << std::fixed << std::setprecision(precision) << x;
  }
  void rec(size_t d, int64_t base, int indent) {
    if (d == shape.size()) { value(v[size_t(base)]); return; }
    int64_t inner = 1;
    for (size_t k = d + 1; k < shape.size(); ++k) inner *= shape[k];
    os << "[";
    const int64_t n = shape[d];
    for (int64_t i = 0; i < n; ++i) {
      if (summarize && n > 2 * kEdge && i == kEdge) {
        os << "...";
        i = n - kEdge - 1;
        os << (d + 1 == shape.size() ? ", " : ",\n" + std::string(size_t(indent + 1), ' '));
        continue;
      }
      rec(d + 1, base + i * inner, indent + 1);
      if (i + 1 < n) os << (d + 1 == shape.size() ? ", " : ",\n" + std::string(size_t(indent + 1), ' '));
    }
    os << "]";
  }
};
}  // namespace

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "tensor(undefined)";
  if (t.is_symbolic()) return os << "tensor(symbolic, shape=" << t.shape() << ", dtype=" << t.dtype() << ")";
  const std::vector<double> v = to_double_vector(t);
  double maxabs = 0;
  bool all_int = true;
  for (double x : v)
    if (std::isfinite(x)) { maxabs = std::max(maxabs, std::fabs(x)); all_int = all_int && x == std::floor(x); }
  const bool fl = is_floating(t.dtype());
  Printer p{os, v, t.shape(), t.numel() > 1000, fl, t.dtype() == DType::boolean,
            fl && all_int ? 1 : 4, fl && (maxabs >= 1e5 || (maxabs > 0 && maxabs < 1e-4))};
  std::ios state(nullptr);
  state.copyfmt(os);
  os << "tensor(";
  p.rec(0, 0, 7);
  os << ", shape=" << t.shape() << ", dtype=" << t.dtype();
  if (t.requires_grad()) os << ", requires_grad";
  os << ")";
  os.copyfmt(state);
  return os;
}

// ---- factories ----

Tensor full(const Shape& shape, double value, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  cpu::fill(t, value);
  return t;
}
Tensor zeros(const Shape& shape, DType dtype) { return full(shape, 0.0, dtype); }
Tensor ones(const Shape& shape, DType dtype) { return full(shape, 1.0, dtype); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), t.dtype()); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), t.dtype()); }
Tensor full_like(const Tensor& t, double value) { return full(t.shape(), value, t.dtype()); }
Tensor scalar_tensor(double v, DType dtype) { return full(Shape{}, v, dtype); }

Tensor arange(double start, double end, double step, DType dtype) {
  SINTER_CHECK(step != 0 && std::isfinite(start) && std::isfinite(end) && std::isfinite(step),
               "[arange] needs finite start/end and a non-zero step, got ", start, ", ", end, ", ", step);
  SINTER_CHECK((end - start) / step >= 0, "[arange] step ", step, " does not lead from ", start, " to ", end);
  const int64_t n = int64_t(std::ceil((end - start) / step));
  Tensor t = Tensor::empty(Shape{n}, DType::f64);
  double* p = t.data<double>();
  for (int64_t i = 0; i < n; ++i) p[i] = start + double(i) * step;
  return dtype == DType::f64 ? t : t.to(dtype);
}
Tensor arange(int64_t end, DType dtype) { return arange(0.0, double(end), 1.0, dtype); }

Tensor linspace(double start, double end, int64_t steps, DType dtype) {
  SINTER_CHECK(steps >= 0, "[linspace] steps must be non-negative, got ", steps);
  Tensor t = Tensor::empty(Shape{steps}, DType::f64);
  double* p = t.data<double>();
  const double step = steps > 1 ? (end - start) / double(steps - 1) : 0.0;
  // Symmetric fill (as PyTorch) so both ends are exact.
  for (int64_t i = 0; i < steps; ++i) p[i] = i < steps / 2 ? start + step * double(i) : end - step * double(steps - 1 - i);
  return t.to(dtype);
}

Tensor eye(int64_t n, int64_t m, DType dtype) {
  if (m < 0) m = n;
  SINTER_CHECK(n >= 0, "[eye] size must be non-negative, got ", n);
  Tensor t = zeros(Shape{n, m}, dtype);
  visit_dtype(dtype, [&]<class T>() {
    T* p = t.data<T>();
    for (int64_t i = 0; i < std::min(n, m); ++i) p[i * m + i] = convert<T>(1.0);
  });
  return t;
}

Tensor rand(const Shape& shape, DType dtype) {
  SINTER_CHECK_DTYPE(is_floating(dtype), "[rand] needs a floating dtype, got ", dtype);
  const int64_t n = shape.numel();
  Generator& g = default_generator();
  const uint64_t seed = g.seed, ctr = g.reserve(uint64_t((n + 3) / 4));
  Tensor t = Tensor::empty(shape, DType::f32);
  float* p = t.data<float>();
  parallel_for(0, (n + 3) / 4, 4096, [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b) {
      uint32_t r[4];
      philox(seed, ctr + uint64_t(b), r);
      for (int64_t k = 0; k < 4 && b * 4 + k < n; ++k) p[b * 4 + k] = float(r[k] >> 8) * (1.0f / 16777216.0f);
    }
  });
  return dtype == DType::f32 ? t : t.to(dtype);
}

Tensor randn(const Shape& shape, DType dtype) {
  SINTER_CHECK_DTYPE(is_floating(dtype), "[randn] needs a floating dtype, got ", dtype);
  const int64_t n = shape.numel();
  Generator& g = default_generator();
  const uint64_t seed = g.seed, ctr = g.reserve(uint64_t((n + 3) / 4));
  Tensor t = Tensor::empty(shape, DType::f64);
  double* p = t.data<double>();
  parallel_for(0, (n + 3) / 4, 4096, [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b) {
      uint32_t r[4];
      philox(seed, ctr + uint64_t(b), r);
      for (int k = 0; k < 4; k += 2) {  // Box-Muller on each pair; u1 in (0, 1] keeps log finite
        const double u1 = (double(r[k]) + 1.0) / 4294967296.0, u2 = double(r[k + 1]) / 4294967296.0;
        const double rad = std::sqrt(-2.0 * std::log(u1)), th = 6.283185307179586 * u2;
        if (b * 4 + k < n) p[b * 4 + k] = rad * std::cos(th);
        if (b * 4 + k + 1 < n) p[b * 4 + k + 1] = rad * std::sin(th);
      }
    }
  });
  return t.to(dtype);
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, DType dtype) {
  SINTER_CHECK(high > low, "[randint] needs low < high, got ", low, " and ", high);
  const int64_t n = shape.numel();
  Generator& g = default_generator();
  const uint64_t seed = g.seed, ctr = g.reserve(uint64_t((n + 1) / 2));
  const uint64_t range = uint64_t(high - low);
  Tensor t = Tensor::empty(shape, DType::i64);
  int64_t* p = t.data<int64_t>();
  parallel_for(0, (n + 1) / 2, 4096, [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b) {
      uint32_t r[4];
      philox(seed, ctr + uint64_t(b), r);
      for (int k = 0; k < 2 && b * 2 + k < n; ++k) {
        const uint64_t x = (uint64_t(r[2 * k]) << 32) | r[2 * k + 1];
        p[b * 2 + k] = low + int64_t(x % range);
      }
    }
  });
  return dtype == DType::i64 ? t : t.to(dtype);
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

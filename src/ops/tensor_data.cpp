// Reading a tensor's data from the host: the `item` op (a one-element tensor's value, marked
// data-dependent: a compiled function breaks its graph there), to_double_vector and printing.
#include <cmath>
#include <iomanip>
#include <sstream>

#include "ops/common.h"

namespace sinter {
namespace detail {

void register_data_ops() {
  OpDef it;
  it.name = "item";  // x with one element -> a 0-d copy the host reads
  it.infer = [](std::span<const TensorMeta> in, const Attrs&) {
    SINTER_CHECK_SHAPE(in[0].shape.numel() == 1, "[item] tensor of shape ", in[0].shape, " has ", in[0].shape.numel(),
                       " elements, not 1");
    return std::vector<TensorMeta>{{{}, in[0].dtype, in[0].device}};
  };
  it.data_dependent = true;
  add_op(std::move(it));

  OpDef td;
  td.name = "to_device";  // x -> a contiguous copy on the attribute "device"
  td.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    return std::vector<TensorMeta>{{in[0].shape, in[0].dtype, a.device("device")}};
  };
  td.backward = [](BackwardCtx& c) { return std::vector<Tensor>{c.grads[0].to(c.input_meta[0].device)}; };
  td.save_inputs = 0;
  td.crosses_devices = true;
  add_op(std::move(td));
}

Tensor local_scalar(const Tensor& t) {
  static const OpDef& op = get_op("item");
  return call1(op, {t});
}

}  // namespace detail

Tensor Tensor::to(Device device) const {
  static const OpDef& op = get_op("to_device");
  return this->device() == device ? *this : call1(op, {*this}, {{"device", device}});
}

double Tensor::item_double() const { return item<double>(); }

std::vector<double> to_double_vector(const Tensor& t) { return t.to_vector<double>(); }


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
  if (t.device() != Device::cpu()) os << ", device=" << t.device();
  if (t.requires_grad()) os << ", requires_grad";
  os << ")";
  os.copyfmt(state);
  return os;
}

// ---- factories ----

}  // namespace sinter

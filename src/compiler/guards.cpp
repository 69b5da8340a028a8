// Guards: what a trace depended on (each input's shape, strides, offset, dtype, device and
// requires_grad; grad mode; autocast), recorded when it is made and checked at every call.
#include <sstream>

#include "compiler/compiled.h"
#include "sinter/autograd.h"
#include "sinter/ops.h"

namespace sinter::compiler {

void set_guards(Entry& e, const std::vector<Tensor>& in) {
  for (const Tensor& t : in) e.guards.push_back({t.shape(), t.strides(), t.offset(), t.dtype(), t.device(), t.requires_grad()});
  e.grad_mode = grad_enabled();
  e.autocast = autocast_dtype();
  for (size_t i = 0; i < in.size(); ++i) {
    std::ostringstream os;
    os << "input " << i << ": " << in[i].dtype() << in[i].shape() << " strides " << in[i].strides()
       << (in[i].requires_grad() ? " requires_grad" : "");
    e.guard_text.push_back(os.str());
  }
  e.guard_text.push_back(std::string("grad mode ") + (e.grad_mode ? "on" : "off") + ", autocast " + dtype_name(e.autocast));
}

std::string guard_mismatch(const Entry& e, const std::vector<Tensor>& in) {
  if (in.size() != e.guards.size()) return std::to_string(in.size()) + " inputs, traced with " + std::to_string(e.guards.size());
  if (grad_enabled() != e.grad_mode) return "grad mode";
  if (autocast_dtype() != e.autocast) return "autocast dtype";
  for (size_t i = 0; i < in.size(); ++i) {
    const InputGuard& g = e.guards[i];
    const Tensor& t = in[i];
    std::ostringstream os;
    if (t.dtype() != g.dtype) os << "input " << i << " dtype " << t.dtype() << " (traced " << g.dtype << ")";
    else if (t.shape() != g.shape) os << "input " << i << " shape " << t.shape() << " (traced " << g.shape << ")";
    else if (t.strides() != g.strides || t.offset() != g.offset) os << "input " << i << " layout: strides " << t.strides() << " (traced " << g.strides << ")";
    else if (!(t.device() == g.device)) os << "input " << i << " device";
    else if (t.requires_grad() != g.requires_grad) os << "input " << i << " requires_grad";
    if (!os.str().empty()) return os.str();
  }
  return "";
}

bool guards_hold(const Entry& e, const std::vector<Tensor>& in) {
  if (in.size() != e.guards.size() || grad_enabled() != e.grad_mode || autocast_dtype() != e.autocast) return false;
  for (size_t i = 0; i < in.size(); ++i) {
    const InputGuard& g = e.guards[i];
    const TensorImpl& t = in[i].impl();
    if (t.dtype != g.dtype || t.offset != g.offset || t.shape != g.shape || t.strides != g.strides || !(t.device == g.device) ||
        t.requires_grad != g.requires_grad)
      return false;
  }
  return true;
}

void check_dynamic(const CompileOptions& o, const std::vector<Tensor>& in) {
  for (const DynamicDim& d : o.dynamic) {
    SINTER_CHECK_T(ValueError, d.input >= 0 && size_t(d.input) < in.size(), "[compile] ", o.name, ": dynamic dim names input ", d.input,
                   " of ", in.size());
    const Tensor& t = in[size_t(d.input)];
    SINTER_CHECK_T(ValueError, d.dim >= 0 && d.dim < t.dim(), "[compile] ", o.name, ": dynamic dim ", d.dim, " of input ", d.input,
                   ", which has shape ", t.shape());
    SINTER_CHECK_T(ValueError, t.size(d.dim) >= d.min && t.size(d.dim) <= d.max, "[compile] ", o.name, ": input ", d.input,
                   " dim ", d.dim, " is ", t.size(d.dim), ", outside its declared range [", d.min, ", ", d.max, "]");
  }
}

}  // namespace sinter::compiler

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>

#include "autograd/node.h"
#include "core/allocator.h"
#include "core/parallel.h"
#include "core/small_vector.h"
#include "core/view.h"
#include "sinter/autograd.h"
#include "core/format.h"
#include "sinter/op.h"

namespace sinter {

namespace detail {
void register_library();  // src/library.cpp: every op and kernel the library defines
}

namespace {
struct Registry {
  std::map<std::string, std::unique_ptr<OpDef>, std::less<>> ops;
  std::mutex mu;
};
Registry& raw_registry() {
  static Registry r;
  return r;
}
Registry& registry() {
  static std::once_flag once;
  std::call_once(once, [] { detail::register_library(); });
  return raw_registry();
}
}  // namespace

namespace {
// One source for what outputs are: effects from `mutates` (the inputs written, in order) or
// `mutates` from effects; checked against the op's arity.
void complete_effects(OpDef& def) {
  if (def.effects.empty()) {
    for (int i = 0; i < 32; ++i)
      if (def.mutates >> i & 1u) def.effects.push_back(Effect::writes(i));
    def.effects.resize(size_t(std::max(def.num_outputs, int(def.effects.size()))));
    return;
  }
  SINTER_CHECK(int(def.effects.size()) == def.num_outputs, "[register_op] op '", def.name, "' declares ", def.effects.size(),
               " effects for ", def.num_outputs, " outputs");
  uint32_t writes = 0;
  for (const Effect& e : def.effects) {
    if (e.kind == Effect::Kind::fresh) continue;
    SINTER_CHECK(e.input >= 0 && e.input < 32 && (def.num_inputs < 0 || e.input < def.num_inputs), "[register_op] op '", def.name,
                 "': an effect names input ", e.input, " of ", def.num_inputs);
    if (e.kind == Effect::Kind::writes) writes |= 1u << e.input;
  }
  SINTER_CHECK(def.mutates == 0 || def.mutates == writes, "[register_op] op '", def.name, "': mutates and effects disagree");
  def.mutates = writes;
}
}  // namespace

namespace detail {
const OpDef& add_op(OpDef def) {
  Registry& r = raw_registry();
  std::lock_guard lock(r.mu);
  SINTER_CHECK(!def.name.empty(), "[register_op] an op needs a name");
  SINTER_CHECK(!r.ops.count(def.name), "[register_op] an op named '", def.name, "' is already registered");
  SINTER_CHECK(def.infer != nullptr, "[register_op] op '", def.name, "' has no infer function");
  SINTER_CHECK(!(def.view && def.mutates), "[register_op] op '", def.name, "' cannot both view and mutate its input");
  SINTER_CHECK(def.num_inputs >= 0 || def.min_inputs >= 0, "[register_op] op '", def.name, "' has a negative minimum arity");
  SINTER_CHECK(!def.fusable || def.spelling.form != Spelling::Form::functor || !def.spelling.functor.empty(), "[register_op] op '",
               def.name, "' is fusable but has no spelling (a scalar functor or a form) for generated code");
  complete_effects(def);
  auto p = std::make_unique<OpDef>(std::move(def));
  const OpDef& ref = *p;
  r.ops.emplace(ref.name, std::move(p));
  return ref;
}
}  // namespace detail

const OpDef& register_op(OpDef def) {
  registry();
  return detail::add_op(std::move(def));
}

void register_kernel(std::string_view name, DeviceType device, KernelFn kernel) {
  registry();
  Registry& r = raw_registry();
  std::lock_guard lock(r.mu);
  auto it = r.ops.find(name);
  SINTER_CHECK(it != r.ops.end(), "[register_kernel] no op named '", name, "' in the op table");
  SINTER_CHECK(!it->second->view, "[register_kernel] '", name, "' is a view op: it needs no kernel");
  it->second->kernels[size_t(device)] = std::move(kernel);
}

namespace detail {
// During library registration (inside the registry's call_once): no lookup through registry().
void add_kernel(std::string_view name, DeviceType device, KernelFn kernel) {
  Registry& r = raw_registry();
  std::lock_guard lock(r.mu);
  auto it = r.ops.find(name);
  SINTER_ASSERT(it != r.ops.end(), "kernel for unknown op ", name);
  it->second->kernels[size_t(device)] = std::move(kernel);
}
}  // namespace detail

const OpDef* find_op(std::string_view name) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.ops.find(name);
  return it == r.ops.end() ? nullptr : it->second.get();
}

const OpDef& get_op(std::string_view name) {
  const OpDef* op = find_op(name);
  SINTER_CHECK(op != nullptr, "[", name, "] no such op in the op table");
  return *op;
}

std::vector<const OpDef*> all_ops() {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  std::vector<const OpDef*> out;
  for (auto& [name, op] : r.ops) out.push_back(op.get());
  return out;
}

namespace {
struct OpStats {
  int64_t calls = 0;
  double seconds = 0;
};
struct Profile {
  std::mutex mu;
  std::map<std::string, OpStats, std::less<>> stats;
};
Profile& profile() {
  static Profile* p = new Profile;  // never destroyed: an exit-time report may read it
  return *p;
}
// SINTER_PROFILE=1 switches profiling on from the start (the command line prints the table at exit).
std::atomic<bool> g_profiling{[] {
  const char* e = std::getenv("SINTER_PROFILE");
  return e && std::string(e) == "1";
}()};
thread_local const std::string* g_scope = nullptr;
}  // namespace

ProfileScope::ProfileScope(const std::string& name) : prev_(g_scope) { g_scope = &name; }
ProfileScope::~ProfileScope() { g_scope = prev_; }

namespace {
void record(const std::string& op, double seconds) { record_op_time(g_scope ? op + " < " + *g_scope : op, seconds); }
}  // namespace

void set_op_profiling(bool on) { g_profiling = on; }
bool op_profiling() { return g_profiling.load(std::memory_order_relaxed); }
void record_op_time(const std::string& key, double seconds) {
  std::lock_guard lock(profile().mu);
  OpStats& s = profile().stats[key];
  s.calls++, s.seconds += seconds;
}
void reset_op_profile() {
  std::lock_guard lock(profile().mu);
  profile().stats.clear();
}
std::string op_profile_table() {
  std::vector<std::pair<std::string, OpStats>> rows;
  {
    std::lock_guard lock(profile().mu);
    rows.assign(profile().stats.begin(), profile().stats.end());
  }
  std::sort(rows.begin(), rows.end(), [](auto& a, auto& b) { return a.second.seconds > b.second.seconds; });
  double total = 0;
  for (auto& [n, s] : rows) total += s.seconds;
  std::ostringstream os;
  auto row = [&](const std::string& name, const std::string& calls, const std::string& ms, const std::string& us, const std::string& share) {
    os << pad_right(name, 40) << " " << pad_left(calls, 10) << " " << pad_left(ms, 12) << " " << pad_left(us, 10) << " "
       << pad_left(share, 7) << "\n";
  };
  row("op", "calls", "total ms", "us/call", "share");
  for (auto& [n, s] : rows)
    row(n, std::to_string(s.calls), fixed(s.seconds * 1e3, 2), fixed(s.seconds * 1e6 / double(std::max<int64_t>(s.calls, 1)), 2),
        fixed(100 * s.seconds / std::max(total, 1e-12), 1) + "%");
  os << pad_right("total (kernels)", 40) << " " << pad_left("", 10) << " " << pad_left(fixed(total * 1e3, 2), 12) << "\n";
  return os.str();
}

namespace {
thread_local OpObserver* t_observer = nullptr;

struct DepthGuard {
  DepthGuard() { ++detail::op_depth(); }
  ~DepthGuard() { --detail::op_depth(); }
};

// PyTorch's rule for scalars: a 0-d CPU tensor meets tensors of another device as a value that is
// copied there (a Python number or a backward formula's constant), never the other way round.
bool is_cpu_scalar_for(const Tensor& t, Device dev) {
  return dev.type != DeviceType::cpu && t.device().type == DeviceType::cpu && t.dim() == 0;
}
// The device an op runs on when input 0 is on the CPU: another input's, if every CPU input is 0-d.
Device device_beyond_cpu_scalars(const std::vector<Tensor>& in, Device dev) {
  Device other = dev;
  for (const Tensor& t : in) {
    if (!t.defined()) return dev;
    if (t.device().type == DeviceType::cpu) {
      if (t.dim() != 0) return dev;
    } else if (other.type == DeviceType::cpu) {
      other = t.device();
    }
  }
  return other;
}
size_t first_input_on(const std::vector<Tensor>& in, Device dev) {
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i].defined() && in[i].device() == dev) return i;
  return 0;
}

void run_kernel(const OpDef& op, Device dev, std::span<const Tensor> in, std::span<Tensor> out, const Attrs& attrs) {
  const KernelFn& k = op.kernels[size_t(dev.type)];
  SINTER_CHECK(k != nullptr, "[", op.name, "] has no kernel for device ", dev);
  DepthGuard depth;
  if (g_profiling.load(std::memory_order_relaxed)) {
    const auto t0 = std::chrono::steady_clock::now();
    k(in, out, attrs);
    record(op.name, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  } else {
    k(in, out, attrs);
  }
}

bool fresh_only(const OpDef& op) {
  for (const Effect& e : op.effects)
    if (e.kind != Effect::Kind::fresh) return false;
  return true;
}

// The outputs of an op whose effects name inputs: the inputs it writes (checked against autograd),
// tensors over the inputs it aliases (contiguous from their offset), fresh tensors for the rest.
std::vector<Tensor> outputs_by_effect(const OpDef& op, std::span<const Tensor> in, std::span<const TensorMeta> meta, bool symbolic) {
  std::vector<Tensor> out;
  for (size_t k = 0; k < meta.size(); ++k) {
    const Effect& e = op.effects[k];
    const TensorMeta& m = meta[k];
    if (e.kind == Effect::Kind::fresh) {
      out.push_back(symbolic ? Tensor::symbolic(m.shape, m.dtype, m.device) : Tensor::empty(m.shape, m.dtype, m.device));
      continue;
    }
    SINTER_CHECK(size_t(e.input) < in.size(), "[", op.name, "] output ", k, " names input ", e.input, " of ", in.size());
    const Tensor& x = in[size_t(e.input)];
    if (e.kind == Effect::Kind::writes) {
      SINTER_CHECK_T(AutogradError, !(x.requires_grad() && grad_enabled()), "[", op.name, "] writes input ", e.input,
                     " in place, which requires grad while grad mode is on; use the out-of-place op, or wrap the update "
                     "in NoGradGuard");
      SINTER_CHECK_SHAPE(m.shape == x.shape() && m.dtype == x.dtype(), "[", op.name, "] output ", k, " is input ", e.input, " written in place, ",
                         x.dtype(), x.shape(), ", but its shape function says ", m.dtype, m.shape);
      out.push_back(x);
      continue;
    }
    SINTER_CHECK_SHAPE(m.dtype == x.dtype() && x.is_contiguous() &&
                           (x.is_symbolic() || (x.offset() + m.shape.numel()) * dtype_size(m.dtype) <= x.storage()->nbytes),
                       "[", op.name, "] output ", k, " aliases input ", e.input, " ", x.dtype(), x.shape(), " as ", m.dtype, m.shape,
                       ": it must be contiguous, of the same dtype and within its buffer");
    out.push_back(detail::raw_reshape_contiguous(x, m.shape));
  }
  return out;
}

// A symbolic stand-in with x's layout (a tracer views real tensors without touching them).
Tensor stand_in(const Tensor& x) {
  if (x.is_symbolic()) return x;
  return Tensor::symbolic(x.shape(), x.dtype(), x.device(), &x.strides(), x.offset());
}
}  // namespace

ObserveScope::ObserveScope(OpObserver* observer) : prev_(t_observer) { t_observer = observer; }
ObserveScope::~ObserveScope() { t_observer = prev_; }
OpObserver* current_observer() { return t_observer; }
bool tracing() { return t_observer && detail::op_depth() == 0 && t_observer->tracing(); }
int op_call_depth() { return detail::op_depth(); }

std::vector<Tensor> call(const OpDef& op, std::vector<Tensor> inputs, const Attrs& attrs) {
  if (op.num_inputs >= 0) {
    SINTER_CHECK(int(inputs.size()) == op.num_inputs, "[", op.name, "] expects ", op.num_inputs, " inputs, got ",
                 inputs.size());
  } else {
    SINTER_CHECK(int(inputs.size()) >= op.min_inputs, "[", op.name, "] expects at least ", op.min_inputs, " input",
                 op.min_inputs == 1 ? "" : "s", ", got ", inputs.size());
  }
  SmallVector<TensorMeta, 4> meta(inputs.size(), TensorMeta{});  // no heap for the usual few inputs
  bool symbolic = false;
  Device dev = !inputs.empty() && inputs[0].defined() ? inputs[0].device()
               : attrs.has("device")                  ? attrs.device("device")
                                                      : Device{};
  if (op.crosses_devices && dev.type == DeviceType::cpu && attrs.has("device")) dev = attrs.device("device");
  if (dev.type == DeviceType::cpu && !op.crosses_devices && other_devices_registered()) dev = device_beyond_cpu_scalars(inputs, dev);
  for (size_t i = 0; i < inputs.size(); ++i) {
    SINTER_CHECK(inputs[i].defined(), "[", op.name, "] input ", i, " is an undefined tensor");
    if (is_cpu_scalar_for(inputs[i], dev) && !op.crosses_devices) inputs[i] = inputs[i].to(dev);
    meta[i] = {inputs[i].shape(), inputs[i].dtype(), inputs[i].device()};
    symbolic = symbolic || inputs[i].is_symbolic();
    SINTER_CHECK(meta[i].device == dev || op.crosses_devices, "[", op.name, "] input ", i, " is on ", meta[i].device, ", the op runs on ",
                 dev, " (input ", first_input_on(inputs, dev), "); move them to one device");
  }
  OpObserver* const obs = detail::op_depth() == 0 ? t_observer : nullptr;
  const bool trace = obs && obs->tracing();
  if (obs) obs->before(op, inputs, attrs);
  symbolic = symbolic || trace;
  std::vector<TensorMeta> out_meta;
  try {
    out_meta = op.infer(std::span<const TensorMeta>(meta.data(), meta.size()), attrs);
  } catch (const ValueError& e) {  // a missing or mistyped attribute: say which op's
    const std::string_view what = e.what();
    if (what.rfind("[attrs]", 0) == 0) SINTER_THROW(ValueError, "[", op.name, "]", what.substr(7));
    throw;
  }
  SINTER_ASSERT(int(out_meta.size()) == op.num_outputs, op.name);

  std::vector<Tensor> out;
  out.reserve(out_meta.size());
  if (op.view) {
    if (symbolic) {
      std::vector<Tensor> sym(inputs.size());
      for (size_t i = 0; i < inputs.size(); ++i) sym[i] = stand_in(inputs[i]);
      out = op.view(sym, attrs);
    } else {
      out = op.view(inputs, attrs);
    }
    SINTER_ASSERT(out.size() == out_meta.size(), op.name);
    for (size_t i = 0; i < out.size(); ++i)
      SINTER_ASSERT(out[i].shape() == out_meta[i].shape && out[i].dtype() == out_meta[i].dtype, op.name);
  } else if (!fresh_only(op)) {
    out = outputs_by_effect(op, inputs, out_meta, symbolic);
    if (!symbolic) {
      run_kernel(op, dev, inputs, out, attrs);
      for (size_t k = 0; k < out.size(); ++k)
        if (op.effects[k].kind == Effect::Kind::writes) ++out[k].storage()->version;
    }
  } else if (symbolic) {
    for (auto& m : out_meta) out.push_back(Tensor::symbolic(m.shape, m.dtype, m.device));
  } else {
    for (auto& m : out_meta) out.push_back(Tensor::empty(m.shape, m.dtype, m.device));
    run_kernel(op, dev, inputs, out, attrs);
  }

  if (op.backward && !op.mutates && grad_enabled()) {
    bool any = false;
    for (auto& t : inputs) any = any || t.requires_grad();
    if (any) autograd::attach(op, attrs, inputs, std::span<const TensorMeta>(meta.data(), meta.size()), out);
  }
  if (obs) obs->after(op, inputs, attrs, out);
  return out;
}

}  // namespace sinter

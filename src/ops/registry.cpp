#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>

#include "autograd/node.h"
#include "core/small_vector.h"
#include "sinter/autograd.h"
#include "sinter/op.h"

namespace sinter {

namespace detail {
void register_builtin_ops();  // ops/builtin.cpp
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
  std::call_once(once, [] { detail::register_builtin_ops(); });
  return raw_registry();
}
}  // namespace

namespace detail {
const OpDef& add_op(OpDef def) {
  Registry& r = raw_registry();
  std::lock_guard lock(r.mu);
  SINTER_CHECK(!def.name.empty(), "[register_op] an op needs a name");
  SINTER_CHECK(!r.ops.count(def.name), "[register_op] an op named '", def.name, "' is already registered");
  SINTER_CHECK(def.infer != nullptr, "[register_op] op '", def.name, "' has no infer function");
  SINTER_CHECK(def.cpu != nullptr || def.view != nullptr, "[register_op] op '", def.name, "' has no CPU kernel");
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

void Attrs::set(std::string name, AttrValue v) {
  for (auto& [k, old] : items_)
    if (k == name) { old = std::move(v); return; }
  items_.emplace_back(std::move(name), std::move(v));
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
  static Profile* p = new Profile;  // never destroyed: the exit-time report reads it
  return *p;
}
std::atomic<bool> g_profiling{[] {
  const char* e = std::getenv("SINTER_PROFILE");
  if (!e || std::string(e) != "1") return false;
  std::atexit([] { std::fprintf(stderr, "%s", op_profile_table().c_str()); });
  return true;
}()};
thread_local const std::string* g_scope = nullptr;
}  // namespace

ProfileScope::ProfileScope(const std::string& name) : prev_(g_scope) { g_scope = &name; }
ProfileScope::~ProfileScope() { g_scope = prev_; }

namespace {
void record(const std::string& op, double seconds) {
  std::string key = g_scope ? op + " < " + *g_scope : op;
  std::lock_guard lock(profile().mu);
  OpStats& s = profile().stats[key];
  s.calls++, s.seconds += seconds;
}
}  // namespace

void set_op_profiling(bool on) { g_profiling = on; }
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
  char line[160];
  std::snprintf(line, sizeof line, "%-40s %10s %12s %10s %7s\n", "op", "calls", "total ms", "us/call", "share");
  os << line;
  for (auto& [n, s] : rows) {
    std::snprintf(line, sizeof line, "%-40s %10lld %12.2f %10.2f %6.1f%%\n", n.c_str(), (long long)s.calls, s.seconds * 1e3,
                  s.seconds * 1e6 / double(std::max<int64_t>(s.calls, 1)), 100 * s.seconds / std::max(total, 1e-12));
    os << line;
  }
  std::snprintf(line, sizeof line, "%-40s %10s %12.2f\n", "total (kernels)", "", total * 1e3);
  os << line;
  return os.str();
}

std::vector<Tensor> call(const OpDef& op, std::vector<Tensor> inputs, const Attrs& attrs) {
  if (op.num_inputs >= 0) {
    SINTER_CHECK(int(inputs.size()) == op.num_inputs, "[", op.name, "] expects ", op.num_inputs, " inputs, got ",
                 inputs.size());
  } else {
    SINTER_CHECK(!inputs.empty(), "[", op.name, "] expects at least one input");
  }
  SmallVector<TensorMeta, 4> meta(inputs.size(), TensorMeta{});  // no heap for the usual few inputs
  bool symbolic = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    SINTER_CHECK(inputs[i].defined(), "[", op.name, "] input ", i, " is an undefined tensor");
    meta[i] = {inputs[i].shape(), inputs[i].dtype(), inputs[i].device()};
    symbolic = symbolic || inputs[i].is_symbolic();
    SINTER_CHECK(meta[i].device.type == DeviceType::cpu, "[", op.name, "] input ", i, " is on ", meta[i].device,
                 "; this build has kernels for the CPU only");
  }
  std::vector<TensorMeta> out_meta = op.infer(std::span<const TensorMeta>(meta.data(), meta.size()), attrs);
  SINTER_ASSERT(int(out_meta.size()) == op.num_outputs, op.name);

  std::vector<Tensor> out;
  out.reserve(out_meta.size());
  if (symbolic) {
    for (auto& m : out_meta) out.push_back(Tensor::symbolic(m.shape, m.dtype, m.device));
  } else if (op.view) {
    out = op.view(inputs, attrs);
    SINTER_ASSERT(out.size() == out_meta.size(), op.name);
    for (size_t i = 0; i < out.size(); ++i)
      SINTER_ASSERT(out[i].shape() == out_meta[i].shape && out[i].dtype() == out_meta[i].dtype, op.name);
  } else {
    for (auto& m : out_meta) out.push_back(Tensor::empty(m.shape, m.dtype));
    if (g_profiling.load(std::memory_order_relaxed)) {
      const auto t0 = std::chrono::steady_clock::now();
      op.cpu(inputs, out, attrs);
      record(op.name, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    } else {
      op.cpu(inputs, out, attrs);
    }
  }

  if (op.backward && grad_enabled()) {
    bool any = false;
    for (auto& t : inputs) any = any || t.requires_grad();
    if (any) autograd::attach(op, attrs, inputs, std::span<const TensorMeta>(meta.data(), meta.size()), out);
  }
  return out;
}

}  // namespace sinter

#pragma once
// The op table: the one door to every kernel. Every op is defined once: a schema (name, arity,
// which inputs it writes in place, whether its output needs the inputs' data to be known),
// `infer` (output shapes and dtypes from input metadata alone, so ops run on symbolic tensors), a
// view function for ops whose outputs alias input 0, a backward written with public ops, and one
// kernel per device type, registered by the kernel folders (src/cpu/, ...). `call()` checks,
// infers, looks the kernel up by (op, device) and attaches autograd. User-defined ops register into
// the same table with sinter::register_op and sinter::register_kernel.
#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "sinter/tensor.h"

namespace sinter {

struct TensorMeta {
  Shape shape;
  DType dtype = DType::f32;
  Device device;
};

using AttrValue = std::variant<int64_t, double, bool, Shape, DType, std::string, Device>;

// An op call's attributes, in the order they were set. Equal attrs hash equal (for CSE and cache keys).
class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<std::pair<std::string, AttrValue>> items) : items_(items) {}
  bool has(std::string_view name) const { return find(name) != nullptr; }
  int64_t i(std::string_view name) const { return get<int64_t>(name); }
  double f(std::string_view name) const;  // accepts an int64 attribute too
  bool b(std::string_view name) const { return get<bool>(name); }
  const Shape& ints(std::string_view name) const { return get<Shape>(name); }
  DType dtype(std::string_view name) const { return get<DType>(name); }
  const std::string& str(std::string_view name) const { return get<std::string>(name); }
  Device device(std::string_view name) const { return get<Device>(name); }
  int64_t i_or(std::string_view name, int64_t fallback) const { return has(name) ? i(name) : fallback; }
  bool b_or(std::string_view name, bool fallback) const { return has(name) ? b(name) : fallback; }
  void set(std::string name, AttrValue v);
  const std::vector<std::pair<std::string, AttrValue>>& items() const { return items_; }
  bool operator==(const Attrs& o) const { return items_ == o.items_; }
  uint64_t hash() const;

 private:
  const AttrValue* find(std::string_view name) const {
    for (auto& [k, v] : items_) if (k == name) return &v;
    return nullptr;
  }
  template <class T> const T& get(std::string_view name) const;
  std::vector<std::pair<std::string, AttrValue>> items_;
};
std::ostream& operator<<(std::ostream& os, const Attrs& a);

struct OpDef;

// What a backward function sees. Saved tensors are undefined unless the op asked to save them.
struct BackwardCtx {
  const OpDef& op;
  const Attrs& attrs;
  std::vector<Tensor> inputs;
  std::vector<Tensor> outputs;
  std::vector<Tensor> grads;            // dL/d(output i); zeros where nothing flowed
  std::vector<TensorMeta> input_meta;
  std::vector<bool> needs_grad;         // which inputs want a gradient
  std::vector<bool> flowed;             // which outputs a gradient reached (the others' grads are zeros)
};

using InferFn = std::function<std::vector<TensorMeta>(std::span<const TensorMeta>, const Attrs&)>;
// Fills `out`, whose tensors follow the op's effects: fresh contiguous tensors allocated from
// `infer`, the inputs it writes, or tensors over the inputs it aliases.
using KernelFn = std::function<void(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&)>;
using ViewFn = std::function<std::vector<Tensor>(std::span<const Tensor> in, const Attrs&)>;
using BackwardFn = std::function<std::vector<Tensor>(BackwardCtx&)>;

// How generated code computes one element of a fusable op: a scalar functor of
// src/ops/scalar_fns.h applied to its inputs (the ops of elementwise.def), or a form code
// generation spells itself. Every target's codegen reads this, so an op says once how it fuses.
struct Spelling {
  enum class Form : uint8_t {
    functor,      // fn::<functor>{}(inputs in their common compute type)
    constant,     // full: the attribute "value", inlined where it is read
    cast,         // to the attribute "dtype"
    select,       // where(cond, a, b)
    fill,         // masked_fill(x, mask): the attribute "value" where mask is true
    clamp,        // to the attributes "min" and/or "max"
  };
  Form form = Form::functor;
  std::string functor = {};  // Form::functor: the functor's name ("GeluTanh")
  bool true_div = false;     // a binary functor computes integer inputs in f32 (div)
};

// What one output of an op is, relative to its inputs.
struct Effect {
  enum class Kind : uint8_t {
    fresh,    // a new buffer the kernel fills
    writes,   // input `input` itself, written in place (its version counter advances)
    aliases,  // input `input`'s buffer, read and returned, not written: contiguous from its offset
  };
  Kind kind = Kind::fresh;
  int input = -1;
  static Effect fresh() { return {}; }
  static Effect writes(int i) { return {Kind::writes, i}; }
  static Effect aliases(int i) { return {Kind::aliases, i}; }
  bool operator==(const Effect&) const = default;
};

struct OpDef {
  std::string name = {};
  int num_inputs = 1;        // -1: variadic (at least one unless min_inputs says otherwise)
  int min_inputs = 1;        // for variadic ops
  int num_outputs = 1;
  InferFn infer = {};
  ViewFn view = {};          // for ops whose outputs alias input 0 (no kernel: works on any device)
  BackwardFn backward = {};  // null: not differentiable
  uint32_t save_inputs = ~0u;  // bit i: input i is needed by backward
  uint32_t save_outputs = 0;   // bit i: output i is needed by backward
  // What each output is (Effect). Empty: every output fresh, or, for an op with `mutates`, the
  // inputs it writes in order. Writing an input is refused on tensors that require grad while grad
  // mode is on, and an op that writes has no backward. register_op fills in the other form.
  std::vector<Effect> effects = {};
  // Bit i: the op writes input i in place (add_, fill_, the optimizer updates): the effects'
  // `writes`, as a mask.
  uint32_t mutates = 0;
  // The output's values (or shape) need the inputs' data (item, nonzero): a trace cannot see
  // past it, so a compiled function breaks its graph here.
  bool data_dependent = false;
  bool random = false;       // draws from the Philox generator (attrs seed and counter)
  // Elementwise: code generation may compute it inside a fused kernel, as `spelling` says. An op
  // that is not fusable always runs its own kernel, even in a compiled graph.
  bool fusable = false;
  Spelling spelling = {};
  // Copies between devices (to_device) run the kernel of whichever side is not the CPU: the input's
  // device, or the attribute "device".
  bool crosses_devices = false;
  // Factories (no inputs) take their device from the attribute "device" (default: the CPU).
  std::array<KernelFn, kNumDeviceTypes> kernels = {};  // by DeviceType; set with register_kernel
};

const OpDef& register_op(OpDef def);          // throws if the name is taken
// Sets the kernel of an op for a device type (replacing one registered before).
void register_kernel(std::string_view op, DeviceType device, KernelFn kernel);
const OpDef* find_op(std::string_view name);  // null if absent
const OpDef& get_op(std::string_view name);   // throws naming the op if absent
std::vector<const OpDef*> all_ops();          // sorted by name

// Runs an op: checks arity and devices, infers outputs, runs the device's kernel (or only infers,
// for symbolic inputs or while tracing), and attaches the backward node when grad mode is on and
// an input requires grad.
std::vector<Tensor> call(const OpDef& op, std::vector<Tensor> inputs, const Attrs& attrs = {});
inline Tensor call1(const OpDef& op, std::vector<Tensor> inputs, const Attrs& attrs = {}) {
  return call(op, std::move(inputs), attrs)[0];
}

// Watching op calls. While an observer is installed on a thread, every op call made at the top
// level (not from inside another op's kernel) is reported to it. A tracing observer turns
// execution symbolic: kernels do not run, outputs are symbolic tensors, and tensors with data that
// the calls read (parameters, buffers) are only read by reference, never written.
class OpObserver {
 public:
  virtual ~OpObserver() = default;
  virtual bool tracing() const { return false; }
  // Before inference and the kernel. A tracer may refuse the call (a data-dependent op) by throwing.
  virtual void before(const OpDef&, std::span<const Tensor> /*inputs*/, const Attrs&) {}
  virtual void after(const OpDef& op, std::span<const Tensor> inputs, const Attrs& attrs,
                     std::span<const Tensor> outputs) = 0;
};
class ObserveScope {
 public:
  explicit ObserveScope(OpObserver* observer);
  ~ObserveScope();
  ObserveScope(const ObserveScope&) = delete;
  ObserveScope& operator=(const ObserveScope&) = delete;
 private:
  OpObserver* prev_;
};
OpObserver* current_observer();
bool tracing();  // a tracing observer is installed on this thread
// How deep in op calls this thread is: 0 at the top level, 1 inside a kernel, and so on.
int op_call_depth();

// Op profiling: while on, every call's kernel time is summed per op (calls made by backward
// functions included); the table lists ops by total time. Also switched on by SINTER_PROFILE=1,
// which prints the table at exit.
void set_op_profiling(bool on);
bool op_profiling();
std::string op_profile_table();
void reset_op_profile();
// Adds one call taking `seconds` under `key`, as written (how compiled programs report their
// library calls and fused kernels, which run without the op table's dispatch).
void record_op_time(const std::string& key, double seconds);
// Ops called inside the scope are profiled as "op < scope" (the autograd engine opens one per
// backward function, so composite backward formulas show where their time goes).
class ProfileScope {
 public:
  explicit ProfileScope(const std::string& name);
  ~ProfileScope();
 private:
  const std::string* prev_;
};

}  // namespace sinter

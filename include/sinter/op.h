#pragma once
// The op table. Every op is defined once: a schema (name, arity), `infer` (output shapes and
// dtypes from input metadata alone, so ops run on symbolic tensors), a CPU kernel (or a view
// function for ops that alias their input), and a backward written with public ops.
// User-defined ops register into the same table with sinter::register_op.
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

using AttrValue = std::variant<int64_t, double, bool, Shape, DType, std::string>;

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
  void set(std::string name, AttrValue v);
  const std::vector<std::pair<std::string, AttrValue>>& items() const { return items_; }

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
};

using InferFn = std::function<std::vector<TensorMeta>(std::span<const TensorMeta>, const Attrs&)>;
using KernelFn = std::function<void(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&)>;
using ViewFn = std::function<std::vector<Tensor>(std::span<const Tensor> in, const Attrs&)>;
using BackwardFn = std::function<std::vector<Tensor>(BackwardCtx&)>;

struct OpDef {
  std::string name;
  int num_inputs = 1;        // -1: variadic, at least one
  int num_outputs = 1;
  InferFn infer;
  KernelFn cpu;              // fills outputs allocated (contiguous) from `infer`
  ViewFn view;               // instead of `cpu` for ops whose outputs alias input 0
  BackwardFn backward;       // null: not differentiable
  uint32_t save_inputs = ~0u;  // bit i: input i is needed by backward
  uint32_t save_outputs = 0;   // bit i: output i is needed by backward
  bool random = false;       // draws from the Philox generator
  bool fusable = false;      // elementwise: code generation may fuse it
};

const OpDef& register_op(OpDef def);          // throws if the name is taken
const OpDef* find_op(std::string_view name);  // null if absent
const OpDef& get_op(std::string_view name);   // throws naming the op if absent
std::vector<const OpDef*> all_ops();          // sorted by name

// Runs an op: checks arity, infers outputs, runs the kernel (or only infers, for symbolic
// inputs), and attaches the backward node when grad mode is on and an input requires grad.
std::vector<Tensor> call(const OpDef& op, std::vector<Tensor> inputs, const Attrs& attrs = {});

// Op profiling: while on, every call's kernel time is summed per op (calls made by backward
// functions included); the table lists ops by total time. Also switched on by SINTER_PROFILE=1,
// which prints the table at exit.
void set_op_profiling(bool on);
std::string op_profile_table();
void reset_op_profile();
// Ops called inside the scope are profiled as "op < scope" (the autograd engine opens one per
// backward function, so composite backward formulas show where their time goes).
class ProfileScope {
 public:
  explicit ProfileScope(const std::string& name);
  ~ProfileScope();
 private:
  const std::string* prev_;
};
inline Tensor call1(const OpDef& op, std::vector<Tensor> inputs, const Attrs& attrs = {}) {
  return call(op, std::move(inputs), attrs)[0];
}

}  // namespace sinter

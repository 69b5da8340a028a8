// register_kernel_def: a user kernel becomes an op (infer from its shape function, its effects,
// its backward) whose CPU kernel compiles the source on first use and runs the config autotuning
// chose for the call's sizes.
#include "compiler/user_kernel.h"

#include "compiler/target.h"

#include <fstream>
#include <sstream>

#include "cpu/cpu.h"
#include "ops/common.h"

namespace sinter::compiler {
namespace {

struct Registry {
  std::mutex mu;
  std::map<const OpDef*, std::shared_ptr<UserKernel>> by_op;
  std::vector<std::shared_ptr<OpDef>> variants;  // kept: their addresses stay keys of by_op
};
Registry& registry() {
  static Registry r;
  return r;
}

std::string read_source(const KernelDef& def) {
  if (def.source_file.empty()) return def.source;
  std::ifstream f(def.source_file, std::ios::binary);
  SINTER_CHECK_T(IOError, f.good(), "[", def.source_file, "] cannot read the source of kernel '", def.name, "'");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string c_type(DType t, const std::string& kernel) {
  const std::string s = cpp_target().type_name(t);
  SINTER_CHECK_T(DTypeError, !s.empty(), "[", kernel, "] a kernel cannot take ", t, " (f32, f64, bf16, i64, i32 and bool can)");
  return s;
}

void check_def(const KernelDef& d) {
  SINTER_CHECK(!d.name.empty(), "[register_kernel_def] a kernel needs a name");
  SINTER_CHECK(!d.source.empty() || !d.source_file.empty(), "[", d.name, "] a kernel needs its source (source or source_file)");
  SINTER_CHECK(d.shape != nullptr, "[", d.name, "] a kernel needs a shape function (shape)");
  SINTER_CHECK(!d.configs.empty(), "[", d.name, "] a kernel needs at least one config (an empty one will do)");
  SINTER_CHECK(!d.outputs.empty(), "[", d.name, "] a kernel needs at least one output (outputs: their dtypes)");
  SINTER_CHECK(d.effects.empty() || d.effects.size() == d.outputs.size(), "[", d.name, "] ", d.effects.size(), " effects for ",
               d.outputs.size(), " outputs");
  for (DType t : d.inputs) (void)c_type(t, d.name);
  for (DType t : d.outputs) (void)c_type(t, d.name);
  for (const Effect& e : d.effects)
    SINTER_CHECK(e.kind == Effect::Kind::fresh || (e.input >= 0 && e.input < int(d.inputs.size())), "[", d.name,
                 "] an effect names input ", e.input, " of ", d.inputs.size());
}

// The op's infer: the declared input dtypes, then the shape function, named in its errors.
InferFn infer_of(const KernelDef& d) {
  return [name = d.name, inputs = d.inputs, outputs = d.outputs, shape = d.shape](std::span<const TensorMeta> in, const Attrs& a) {
    for (size_t i = 0; i < in.size(); ++i)
      SINTER_CHECK_DTYPE(in[i].dtype == inputs[i], "[", name, "] input ", i, " is ", in[i].dtype, in[i].shape, "; the kernel takes ",
                         inputs[i]);
    std::vector<TensorMeta> out;
    try {
      out = shape(in, a);
    } catch (const Error& e) {
      std::ostringstream shapes;
      for (size_t i = 0; i < in.size(); ++i) shapes << (i ? ", " : "") << in[i].dtype << in[i].shape;
      SINTER_THROW(ShapeError, "[", name, "] the shape function refused inputs ", shapes.str(), ": ", e.what());
    }
    SINTER_CHECK_SHAPE(out.size() == outputs.size(), "[", name, "] the shape function gave ", out.size(), " outputs; the kernel declares ",
                       outputs.size());
    for (size_t k = 0; k < out.size(); ++k) {
      SINTER_CHECK_DTYPE(out[k].dtype == outputs[k], "[", name, "] the shape function made output ", k, " ", out[k].dtype,
                         "; the kernel declares ", outputs[k]);
      out[k].device = in.empty() ? Device{} : in[0].device;
    }
    return out;
  };
}

// The call's operands (read-only inputs made contiguous, copies kept in `keep`) and the config the
// autotuner picks for its sizes.
int prepare_call(UserKernel& k, std::span<const Tensor> in, std::span<Tensor> out, UserKernelCall& call, std::vector<Tensor>& keep) {
  std::vector<bool> written(in.size(), false);
  for (const Effect& e : k.def.effects)
    if (e.kind == Effect::Kind::writes) written[size_t(e.input)] = true;
  runtime::user_kernel_operands(in, out, written, call.p, call.q, keep);
  std::vector<TensorMeta> meta;  // of the kernel's own inputs (a fused variant's extras come after)
  for (size_t i = 0; i < in.size(); ++i) {
    if (written[i]) call.written.push_back(in[i]), call.written_slot.push_back(i);
    if (i < k.def.inputs.size()) meta.push_back({in[i].shape(), in[i].dtype(), in[i].device()});
  }
  return choose_config(k.tuning ? *k.tuning : k, meta, call, user_kernel_code(k));
}

// The CPU kernel of a user kernel's op.
void run_user_kernel(UserKernel& k, std::span<const Tensor> in, std::span<Tensor> out) {
  UserKernelCall call;
  std::vector<Tensor> keep;
  const int config = prepare_call(k, in, out, call, keep);
  user_kernel_code(k)(call.p.data(), call.q.data(), config);
}

}  // namespace

UserKernel* user_kernel_of(const OpDef* op) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.by_op.find(op);
  return it == r.by_op.end() ? nullptr : it->second.get();
}

std::shared_ptr<UserKernel> user_kernel_ptr(const OpDef* op) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.by_op.find(op);
  return it == r.by_op.end() ? nullptr : it->second;
}

int user_kernel_config(UserKernel& k, std::span<const Tensor> in, std::span<Tensor> out) {
  UserKernelCall call;
  std::vector<Tensor> keep;
  return prepare_call(k, in, out, call, keep);
}

std::string user_kernel_source(const UserKernel& k) {
  const KernelDef& d = k.def;
  std::ostringstream os;
  os << "// user kernel '" << d.name << "': " << d.configs.size() << " config(s)\n#include \"sinter_jit_prelude.h\"\n";
  os << "#line 1 \"" << k.label << "\"\n" << k.text << "\n#line 1 \"<sinter: entry of kernel " << d.name << ">\"\nnamespace {\n";
  for (size_t c = 0; c < d.configs.size(); ++c) {
    os << "struct SinterConfig" << c << " {";
    for (const auto& [name, value] : d.configs[c]) os << " static constexpr int64_t " << name << " = " << value << ";";
    os << " };\n";
  }
  os << "}  // namespace\nextern \"C\" void sinter_user_kernel(char* const* p, const int64_t* q, int config) {\n";
  os << "  const int64_t* d = q;\n";
  const size_t nin = d.inputs.size(), nout = d.outputs.size();
  for (size_t i = 0; i < nin + nout; ++i) {
    const std::string type = i < nin ? "sinter::In<" + c_type(d.inputs[i], d.name) + ">" : "sinter::Out<" + c_type(d.outputs[i - nin], d.name) + ">";
    os << "  " << type << " a" << i << "(p[" << i << "], d); d += 1 + 2 * d[0];\n";
  }
  os << "  switch (config) {\n";
  for (size_t c = 0; c < d.configs.size(); ++c) {
    os << "    case " << c << ": kernel<SinterConfig" << c << ">(";
    for (size_t i = 0; i < nin + nout; ++i) os << (i ? ", " : "") << "a" << i;
    os << "); break;\n";
  }
  os << "  }\n}\n";
  return os.str();
}

UserKernelFn user_kernel_code(UserKernel& k) {
  std::lock_guard lock(k.mu);
  if (!k.module) k.module = jit_load(k.unit.empty() ? user_kernel_source(k) : k.unit, k.def.name, "sinter_user_kernel");
  return reinterpret_cast<UserKernelFn>(k.module->entry);
}

const OpDef& register_kernel_def(KernelDef def) {
  check_def(def);
  auto k = std::make_shared<UserKernel>();
  k->text = read_source(def);
  k->label = def.source_file.empty() ? "<kernel " + def.name + ">" : def.source_file;
  if (def.effects.empty()) def.effects.assign(def.outputs.size(), Effect::fresh());
  OpDef op;
  op.name = def.name;
  op.num_inputs = int(def.inputs.size());
  op.min_inputs = op.num_inputs;
  op.num_outputs = int(def.effects.size());
  op.infer = infer_of(def);
  op.effects = def.effects;
  op.backward = def.backward;
  op.save_inputs = def.save_inputs, op.save_outputs = def.save_outputs;
  k->def = std::move(def);
  std::ostringstream key;
  key << k->text << "\n";
  for (DType t : k->def.inputs) key << dtype_name(t) << " ";
  for (DType t : k->def.outputs) key << dtype_name(t) << " ";
  for (const KernelConfig& c : k->def.configs)
    for (const auto& [n, v] : c) key << n << "=" << v << " ";
  k->def.pointwise.resize(k->def.outputs.size(), false);
  k->hash = content_hash(key.str());
  const OpDef& registered = register_op(std::move(op));
  register_kernel(registered.name, DeviceType::cpu, [k](std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
    run_user_kernel(*k, in, out);
  });
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  r.by_op[&registered] = k;
  return registered;
}

std::shared_ptr<OpDef> variant_op(std::shared_ptr<UserKernel> variant, const std::string& name, int extra_inputs) {
  auto op = std::make_shared<OpDef>();
  op->name = name;
  op->num_inputs = op->min_inputs = int(variant->def.inputs.size()) + extra_inputs;
  op->num_outputs = int(variant->def.outputs.size());
  op->effects = variant->def.effects;
  for (const Effect& e : op->effects)
    if (e.kind == Effect::Kind::writes) op->mutates |= 1u << e.input;
  op->kernels[size_t(DeviceType::cpu)] = [variant](std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
    run_user_kernel(*variant, in, out);
  };
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  r.by_op[op.get()] = std::move(variant);
  r.variants.push_back(op);
  return op;
}

InferFn same_as_input(int i) {
  return [i](std::span<const TensorMeta> in, const Attrs&) {
    SINTER_CHECK(i >= 0 && size_t(i) < in.size(), "the shape is input ", i, "'s, but the call has ", in.size(), " inputs");
    return std::vector<TensorMeta>{in[size_t(i)]};
  };
}

std::vector<TunedChoice> tuned_choices(const std::string& kernel) {
  const OpDef* op = find_op(kernel);
  UserKernel* k = op ? user_kernel_of(op) : nullptr;
  SINTER_CHECK(k != nullptr, "[tuned_choices] no kernel named '", kernel, "' was registered with register_kernel_def");
  std::lock_guard lock(k->mu);
  std::vector<TunedChoice> out;
  for (const auto& [bucket, c] : k->tuned) out.push_back(c);
  return out;
}

}  // namespace sinter::compiler

namespace sinter {
const OpDef& register_kernel_def(KernelDef def) { return compiler::register_kernel_def(std::move(def)); }
InferFn same_as_input(int i) { return compiler::same_as_input(i); }
std::vector<TunedChoice> tuned_choices(const std::string& kernel) { return compiler::tuned_choices(kernel); }
}  // namespace sinter

// A session runs a model's graphs: inputs checked against their specs, the size's table row found,
// the library calls bound once per (graph, size) over the session's slots, the generated code run.
#include <cstring>

#include "core/format.h"
#include "core/view.h"
#include "cpu/cpu.h"
#include "runtime/runtime.h"

namespace sinter::runtime {

// One (graph, size)'s program: slots, library calls indexed by step, and the outputs as views.
struct Session::Bound {
  const Variant* variant = nullptr;
  const int64_t* row = nullptr;
  GraphRunFn run = nullptr;
  SlotStorage slots;
  std::vector<ExternCall> by_step;
  std::vector<Tensor> outputs;
  std::vector<int64_t> slot_bytes;
  std::vector<Tensor*> buffer;  // by slot: the session's buffer of a fresh slot or the arena
};

namespace {
// Reads an operand's shape, strides and offset from a row.
Tensor over(SlotStorage& s, const Operand& o, const int64_t*& at) {
  Shape shape(at, at + o.rank), strides(at + o.rank, at + 2 * o.rank);
  const int64_t offset = at[2 * o.rank];
  at += 2 * o.rank + 1;
  return Tensor::from_storage(s.storage[size_t(o.slot)], shape, strides, offset, o.dtype);
}

std::string range_text(const DimSpec& d) {
  return d.min == d.max ? std::to_string(d.min) : (d.name.empty() ? "" : d.name + " in ") + std::to_string(d.min) + ".." + std::to_string(d.max);
}
}  // namespace

Session::Session(const Model& m) : model_(m) { reset(); }
Session::~Session() = default;

void Session::reset() {
  state_.assign(model_.captured.size(), Tensor());
  for (size_t i = 0; i < model_.captured.size(); ++i) {
    if (!model_.program.captured[i].state) continue;
    const Tensor& init = model_.captured[i];
    state_[i] = Tensor::empty(init.shape(), init.dtype());
    std::memcpy(state_[i].data_ptr(), init.data_ptr(), size_t(init.numel() * init.element_size()));
  }
}

size_t Session::check_inputs(const GraphProgram& g, const std::vector<HostTensor>& in) const {
  SINTER_CHECK_SHAPE(in.size() == g.inputs.size(), "[", g.name, "] takes ", g.inputs.size(), " inputs, got ", in.size());
  int64_t dyn = -1;
  for (size_t i = 0; i < in.size(); ++i) {
    const TensorSpec& s = g.inputs[i];
    const HostTensor& t = in[i];
    SINTER_CHECK_DTYPE(t.dtype == s.dtype, "[", g.name, "] input '", s.name, "' must be ", s.dtype, ", got ", t.dtype);
    SINTER_CHECK_SHAPE(t.shape.size() == s.dims.size(), "[", g.name, "] input '", s.name, "' must have ", s.dims.size(), " dims, got ",
                       t.shape.size(), " ", t.shape);
    SINTER_CHECK(t.data != nullptr || t.shape.numel() == 0, "[", g.name, "] input '", s.name, "' has no data");
    for (size_t d = 0; d < s.dims.size(); ++d) {
      const DimSpec& r = s.dims[d];
      SINTER_CHECK_SHAPE(t.shape[d] >= r.min && t.shape[d] <= r.max, "[", g.name, "] input '", s.name, "' dim ", d, " is ", t.shape[d],
                         ", expected ", range_text(r));
      if (r.name.empty()) continue;
      SINTER_CHECK_SHAPE(dyn < 0 || dyn == t.shape[d], "[", g.name, "] input '", s.name, "' dim ", d, " (", r.name, ") is ", t.shape[d],
                         ", but another input has ", r.name, " = ", dyn);
      dyn = t.shape[d];
    }
  }
  return g.dynamic.empty() ? 0 : size_t(dyn - g.dyn_min);
}

Session::Bound& Session::bind(int graph, size_t size) {
  auto& slot = bound_[{graph, size}];
  if (slot) return *slot;
  const GraphProgram& g = model_.program.graphs[size_t(graph)];
  const SizeEntry& e = g.sizes[size];
  auto b = std::make_unique<Bound>();
  b->variant = &g.variants[size_t(e.variant)];
  b->row = model_.program.tables.data() + e.row;
  b->run = model_.code[size_t(graph)][size_t(e.variant)];
  const Variant& v = *b->variant;
  b->slots.resize(v.slots.size());
  const int64_t* at = b->row + v.num_params;
  b->slot_bytes.assign(at, at + v.slots.size());
  at += v.slots.size();
  int max_step = -1;
  for (const ExternSpec& x : v.externs) max_step = std::max(max_step, x.step);
  b->by_step.resize(size_t(max_step + 1));
  for (size_t k = 0; k < v.externs.size(); ++k) {
    const ExternSpec& x = v.externs[k];
    ExternCall& c = b->by_step[size_t(x.step)];
    c.op = x.op;
    c.kernel = model_.kernel(x);
    c.attrs = &x.attrs;
    for (const auto& [at_call, a] : e.attrs)
      if (size_t(at_call) == k) c.attrs = &a;
    for (const Operand& o : x.in) c.in.push_back(over(b->slots, o, at));
    for (const Operand& o : x.out) c.out.push_back(over(b->slots, o, at));
  }
  for (const Operand& o : v.outputs) b->outputs.push_back(over(b->slots, o, at));
  b->buffer.assign(v.slots.size(), nullptr);
  for (size_t k = 0; k < v.slots.size(); ++k) {
    if (v.slots[k].kind == SlotSpec::Kind::arena) b->buffer[k] = &arena_;
    if (v.slots[k].kind == SlotSpec::Kind::fresh) b->buffer[k] = &fresh_[{graph, e.variant, k}];
  }
  slot = std::move(b);
  return *slot;
}

void Session::run(const std::string& name, const std::vector<HostTensor>& inputs, std::vector<HostTensor>& outputs) {
  const int gi = model_.graph_index(name);
  SINTER_CHECK(gi >= 0, "[run] the model has no graph '", name, "'");
  const GraphProgram& g = model_.program.graphs[size_t(gi)];
  const size_t size = check_inputs(g, inputs);
  SINTER_CHECK_SHAPE(outputs.size() == g.outputs.size(), "[", name, "] has ", g.outputs.size(), " outputs, got room for ", outputs.size());
  Bound& b = bind(gi, size);
  const Variant& v = *b.variant;
  std::vector<char*> table(v.slots.size(), nullptr);
  for (size_t s = 0; s < v.slots.size(); ++s) {
    const SlotSpec& spec = v.slots[s];
    switch (spec.kind) {
      case SlotSpec::Kind::input: {
        const HostTensor& t = inputs[size_t(spec.index)];
        b.slots.set(s, t.data, t.shape.numel() * dtype_size(t.dtype), table.data());
        break;
      }
      case SlotSpec::Kind::captured: {
        const Tensor& t = model_.program.captured[size_t(spec.index)].state ? state_[size_t(spec.index)] : model_.captured[size_t(spec.index)];
        b.slots.set(s, t.data_ptr(), t.storage()->nbytes, table.data());
        break;
      }
      case SlotSpec::Kind::fresh:
      case SlotSpec::Kind::arena: {
        Tensor& buf = *b.buffer[s];
        const int64_t bytes = b.slot_bytes[s];
        if (bytes > 0 && (!buf.defined() || buf.numel() < bytes)) buf = Tensor::empty({bytes}, DType::u8);
        b.slots.set(s, bytes > 0 ? buf.data_ptr() : nullptr, bytes, table.data());
        break;
      }
    }
  }
  b.run(table.data(), b.row, [](void* ctx, int step) { run_extern(static_cast<Bound*>(ctx)->by_step[size_t(step)]); }, &b);
  out_.resize(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& o = b.outputs[i];
    HostTensor& h = outputs[i];
    const size_t bytes = size_t(o.numel() * o.element_size());
    h.dtype = o.dtype();
    h.shape = o.shape();
    if (h.data == nullptr && v.slots[size_t(v.outputs[i].slot)].kind == SlotSpec::Kind::fresh && o.is_contiguous() && o.offset() == 0) {
      h.data = o.data_ptr();  // the session's own buffer, as it is (until the next run)
      h.capacity = bytes;
      continue;
    }
    if (h.data == nullptr) {
      if (!out_[i].defined() || size_t(out_[i].numel()) < bytes) out_[i] = Tensor::empty({int64_t(bytes)}, DType::u8);
      h.data = out_[i].data_ptr();
      h.capacity = bytes;
    }
    SINTER_CHECK_SHAPE(h.capacity >= bytes, "[", name, "] output '", g.outputs[i].name, "' needs ", bytes, " bytes ", o.dtype(), o.shape(),
                       ", the caller's buffer has ", h.capacity);
    auto dst = std::make_shared<Storage>();  // the caller's memory, not owned
    dst->data = h.data, dst->nbytes = int64_t(bytes);
    cpu::copy(o, Tensor::from_storage(dst, o.shape(), detail::contiguous_strides(o.shape()), 0, o.dtype()));
  }
}

}  // namespace sinter::runtime

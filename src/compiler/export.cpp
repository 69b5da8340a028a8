// Ahead-of-time export (sinter/aot.h): each graph is traced whole at every size of its dynamic
// range, prepared as a compile would (passes, plan, code), and recorded as the runtime's program
// (runtime/program.h): sizes whose code and library calls agree share a variant and differ only in
// their table row. The variants' sources and the program compile into model.so; the captured
// tensors go to weights.safetensors; manifest.json lists what a loader checks.
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "compiler/compiled.h"
#include "compiler/user_kernel.h"
#include "runtime/program.h"
#include "runtime/sha256.h"
#include "sinter/aot.h"
#include "sinter/autograd.h"
#include "sinter/io.h"
#include "sinter/version.h"

namespace sinter::aot {

namespace fs = std::filesystem;
using namespace compiler;
using runtime::Operand;
using runtime::SlotSpec;

namespace {

struct Capture {
  Tensor t;
  runtime::CapturedSpec spec;
};

class Exporter {
 public:
  explicit Exporter(const Options& o) : opts_(o) {
    for (const auto& [name, t] : o.names)
      if (t.defined()) names_[t.storage().get()] = name;
  }
  void add(const GraphToExport& gx);
  runtime::Program program;
  std::vector<Capture> captured;
  std::vector<std::string> sources;  // one per variant, one per user kernel
  int64_t traced = 0;

 private:
  const Options& opts_;
  std::map<const Storage*, std::string> names_;
  std::map<const Storage*, int> by_storage_;
  std::map<std::string, int> variant_of_;  // the graph's variants by structure_key
  std::map<std::string, std::string> user_symbols_;  // by translation unit (each trace makes its own fused variants)

  std::string user_symbol(UserKernel& k);
  void user_kernel_call(runtime::ExternSpec& x, const Graph& g, const Node& n, UserKernel& k);

  int capture(const Tensor& t, const std::string& graph);
  std::vector<Tensor> inputs_at(const GraphToExport& gx, int64_t size) const;
  void record(runtime::GraphProgram& gp, Entry& e, const Generated& code, int64_t size);
};

int Exporter::capture(const Tensor& t, const std::string& graph) {
  auto it = by_storage_.find(t.storage().get());
  if (it != by_storage_.end()) {
    const Tensor& had = captured[size_t(it->second)].t;
    SINTER_CHECK_T(CompileError, had.shape() == t.shape() && had.offset() == t.offset() && had.dtype() == t.dtype(), "[export] graph '", graph,
                   "' reads two different views of one captured buffer (", had.dtype(), had.shape(), " and ", t.dtype(), t.shape(),
                   "): export takes whole tensors");
    return it->second;
  }
  auto named = names_.find(t.storage().get());
  const std::string name = named != names_.end() ? named->second : "const." + std::to_string(captured.size());
  SINTER_CHECK_T(CompileError, t.is_contiguous() && t.offset() == 0, "[export] graph '", graph, "' reads '", name,
                 "', a view into a larger buffer (offset ", t.offset(), "): export takes whole, contiguous tensors");
  by_storage_[t.storage().get()] = int(captured.size());
  captured.push_back({t, {name, false, t.dtype(), t.shape()}});
  return int(captured.size()) - 1;
}

std::vector<Tensor> Exporter::inputs_at(const GraphToExport& gx, int64_t size) const {
  std::vector<Tensor> in;
  for (size_t i = 0; i < gx.example_inputs.size(); ++i) {
    Shape shape = gx.example_inputs[i].shape();
    for (const Dim& d : gx.options.dynamic)
      if (size_t(d.input) == i) shape[size_t(d.dim)] = size;
    in.push_back(zeros(shape, gx.example_inputs[i].dtype()));
  }
  return in;
}

// A user kernel's translation unit joins model.so once, its entry renamed for it.
std::string Exporter::user_symbol(UserKernel& k) {
  std::string src = k.unit.empty() ? user_kernel_source(k) : k.unit;
  auto [it, added] = user_symbols_.try_emplace(src, "sinter_user_kernel_" + std::to_string(user_symbols_.size()));
  if (added) {
    const std::string entry = "extern \"C\" void sinter_user_kernel(";
    const size_t at = src.find(entry);
    SINTER_CHECK_T(CompileError, at != std::string::npos, "[export] user kernel ", k.def.name, ": its translation unit has no entry");
    src.replace(at, entry.size(), "extern \"C\" void " + it->second + "(");
    sources.push_back(std::move(src));
  }
  return it->second;
}

// A user kernel's library call runs its entry in model.so with the config the autotuner picks
// for this size (tuned now, on zero-filled operands of the call's sizes, if its bucket is new).
void Exporter::user_kernel_call(runtime::ExternSpec& x, const Graph& g, const Node& n, UserKernel& k) {
  std::vector<Tensor> in, out;
  for (int v : n.inputs) in.push_back(zeros(g.values[size_t(v)].meta.shape, g.values[size_t(v)].meta.dtype));
  for (int v : n.outputs) out.push_back(zeros(g.values[size_t(v)].meta.shape, g.values[size_t(v)].meta.dtype));
  Shape writes;
  for (const Effect& e : k.def.effects)
    if (e.kind == Effect::Kind::writes) writes.push_back(e.input);
  x.attrs.set("__user_kernel", user_symbol(k));
  x.attrs.set("__config", int64_t(user_kernel_config(k, in, out)));
  x.attrs.set("__writes", writes);
}

// A readable key of a variant's structure: two sizes with equal keys share code and call list.
std::string structure_key(const runtime::Variant& v, const std::string& source) {
  std::ostringstream k;
  k << source;
  auto ops = [&](const std::vector<Operand>& os) {
    for (const Operand& o : os) k << " " << o.slot << ":" << dtype_name(o.dtype) << ":" << o.rank;
  };
  for (const SlotSpec& s : v.slots) k << "\nslot " << int(s.kind) << " " << s.index;
  for (const runtime::ExternSpec& x : v.externs) {
    k << "\ncall " << x.step << " " << x.op;  // attributes may differ by size (SizeEntry::attrs)
    ops(x.in), ops(x.out);
  }
  k << "\nout";
  ops(v.outputs);
  k << "\nparams " << v.num_params;
  return k.str();
}

void Exporter::record(runtime::GraphProgram& gp, Entry& e, const Generated& code, int64_t size) {
  const Graph& g = e.graph;
  runtime::Variant v;
  v.num_params = int64_t(code.params.size());
  std::vector<int64_t> row = code.params, bytes(size_t(e.slots.count), 0);
  v.slots.resize(size_t(e.slots.count));
  for (size_t i = 0; i < g.values.size(); ++i) {
    const Value& x = g.values[i];
    if (!x.owns_buffer() || e.slots.of_value[i] < 0) continue;
    const size_t s = size_t(e.slots.of_value[i]);
    if (x.kind == ValueKind::input) v.slots[s] = {SlotSpec::Kind::input, x.index};
    else if (x.kind == ValueKind::captured) v.slots[s] = {SlotSpec::Kind::captured, capture(x.captured, gp.name)};
    else if (e.plan.fresh[i]) v.slots[s] = {SlotSpec::Kind::fresh, -1}, bytes[s] = std::max(bytes[s], x.meta.shape.numel() * dtype_size(x.meta.dtype));
  }
  if (e.slots.arena >= 0) v.slots[size_t(e.slots.arena)] = {SlotSpec::Kind::arena, -1}, bytes[size_t(e.slots.arena)] = e.plan.arena_bytes;
  row.insert(row.end(), bytes.begin(), bytes.end());
  auto operand = [&](int val) {  // as the JIT's executor addresses a value
    const Value& x = g.values[size_t(val)];
    row.insert(row.end(), x.meta.shape.begin(), x.meta.shape.end());
    row.insert(row.end(), x.strides.begin(), x.strides.end());
    row.push_back(slot_offset(e, val));
    return Operand{e.slots.of_value[size_t(val)], x.meta.dtype, int(x.meta.shape.size())};
  };
  for (size_t i = 0; i < e.plan.steps.size(); ++i) {
    const Step& st = e.plan.steps[i];
    if (st.group >= 0) continue;
    const Node& n = g.nodes[size_t(st.node)];
    runtime::ExternSpec x{int(i), n.op->name, n.attrs, {}, {}};
    if (UserKernel* k = user_kernel_of(n.op)) user_kernel_call(x, g, n, *k);
    for (int val : n.inputs) x.in.push_back(operand(val));
    for (int val : n.outputs) x.out.push_back(operand(val));
    v.externs.push_back(std::move(x));
  }
  for (int val : g.outputs) v.outputs.push_back(operand(val));
  const std::string key = structure_key(v, code.source);
  auto [it, added] = variant_of_.try_emplace(key, int(gp.variants.size()));
  const int variant = it->second;
  if (added) {
    v.symbol = "sinter_graph_run_" + std::to_string(program.graphs.size()) + "_" + std::to_string(variant);
    std::string src = code.source;
    for (size_t at = src.find("sinter_graph_run"); at != std::string::npos; at = src.find("sinter_graph_run", at + v.symbol.size()))
      src.replace(at, std::strlen("sinter_graph_run"), v.symbol);
    sources.push_back(std::move(src));
    gp.variants.push_back(std::move(v));
  }
  runtime::SizeEntry entry{size, variant, int64_t(program.tables.size()), {}};
  if (!added) {
    const runtime::Variant& had = gp.variants[size_t(variant)];
    for (size_t k = 0; k < had.externs.size(); ++k)
      if (!(had.externs[k].attrs == v.externs[k].attrs)) entry.attrs.emplace_back(int(k), v.externs[k].attrs);
  }
  gp.sizes.push_back(std::move(entry));
  program.tables.insert(program.tables.end(), row.begin(), row.end());
}

void Exporter::add(const GraphToExport& gx) {
  const GraphOptions& go = gx.options;
  runtime::GraphProgram gp;
  gp.name = go.name;
  variant_of_.clear();
  for (const runtime::GraphProgram& other : program.graphs)
    SINTER_CHECK_T(CompileError, other.name != go.name, "[export] two graphs are named '", go.name, "'");
  int64_t lo = 0, hi = 0;
  for (const Dim& d : go.dynamic) {
    SINTER_CHECK_T(CompileError, d.input >= 0 && size_t(d.input) < gx.example_inputs.size() && d.dim >= 0 &&
                                     d.dim < gx.example_inputs[size_t(d.input)].dim(),
                   "[export] graph '", go.name, "': dynamic dim ", d.name, " names input ", d.input, " dim ", d.dim, ", which does not exist");
    SINTER_CHECK_T(CompileError, d.min >= 1 && d.max >= d.min, "[export] graph '", go.name, "': dynamic dim ", d.name, " has an empty range ",
                   d.min, "..", d.max);
    SINTER_CHECK_T(CompileError, gp.dynamic.empty() || (gp.dynamic == d.name && lo == d.min && hi == d.max), "[export] graph '", go.name,
                   "' has two dynamic sizes (", gp.dynamic, ", ", d.name, "): export takes one per graph");
    gp.dynamic = d.name, lo = d.min, hi = d.max;
  }
  gp.dyn_min = lo, gp.dyn_max = hi;
  for (size_t i = 0; i < gx.example_inputs.size(); ++i) {
    const Tensor& t = gx.example_inputs[i];
    runtime::TensorSpec spec{i < go.input_names.size() ? go.input_names[i] : "input" + std::to_string(i), t.dtype(), {}};
    for (int64_t d = 0; d < t.dim(); ++d) spec.dims.push_back({t.size(d), t.size(d), ""});
    for (const Dim& d : go.dynamic)
      if (size_t(d.input) == i) spec.dims[size_t(d.dim)] = {d.min, d.max, d.name};
    gp.inputs.push_back(spec);
  }
  CompileOptions copts{.fullgraph = true, .name = go.name};
  std::vector<std::vector<TensorMeta>> out_meta;
  const int64_t first = gp.dynamic.empty() ? 0 : lo, last = gp.dynamic.empty() ? 0 : hi;
  for (int64_t size = first; size <= last; ++size) {
    if (opts_.progress) opts_.progress("trace " + go.name, size - first, last - first + 1);
    NoGradGuard no_grad;
    TraceResult r;
    try {
      r = trace(gx.fn, inputs_at(gx, size), copts);
    } catch (const CompileError& e) {  // a break under fullgraph
      SINTER_THROW(CompileError, "[export] graph '", go.name, "' at ", gp.dynamic.empty() ? "its size" : gp.dynamic + " = " + std::to_string(size),
                   ": ", e.what(), ": export needs the whole function as one graph");
    }
    SINTER_CHECK_T(CompileError, r.graph.random_blocks == 0, "[export] graph '", go.name, "' draws random numbers: export takes",
                   " inference graphs (sample in the caller)");
    for (const Node& n : r.graph.nodes) {
      if (!n.op->mutates) continue;
      for (size_t k = 0; k < n.outputs.size(); ++k) {
        const Value& b = r.graph.values[size_t(r.graph.buffer_of(n.outputs[k]))];
        if (n.op->effects[k].kind == Effect::Kind::writes && b.kind == ValueKind::captured) captured[size_t(capture(b.captured, go.name))].spec.state = true;
        SINTER_CHECK_T(CompileError, !(n.op->effects[k].kind == Effect::Kind::writes && b.kind == ValueKind::input), "[export] graph '",
                       go.name, "' writes its input ", b.index, " in place: exported graphs write only their state");
      }
    }
    out_meta.emplace_back();
    for (int v : r.graph.outputs) out_meta.back().push_back(r.graph.values[size_t(v)].meta);
    Entry e;
    e.graph = std::move(r.graph);
    e.debug_name = gp.dynamic.empty() ? go.name : go.name + "." + gp.dynamic + std::to_string(size);  // SINTER_COMPILE_DEBUG files
    const Generated code = prepare(e, copts, cpp_target());
    record(gp, e, code, size);
    ++traced;
  }
  for (size_t o = 0; o < out_meta[0].size(); ++o) {
    const TensorMeta& m0 = out_meta[0][o];
    runtime::TensorSpec spec{o < go.output_names.size() ? go.output_names[o] : "output" + std::to_string(o), m0.dtype, {}};
    for (size_t d = 0; d < m0.shape.size(); ++d) {
      int64_t mn = m0.shape[d], mx = mn;
      bool follows = out_meta.size() > 1;
      for (size_t k = 0; k < out_meta.size(); ++k) {
        const int64_t x = out_meta[k][o].shape[d];
        mn = std::min(mn, x), mx = std::max(mx, x), follows = follows && x == first + int64_t(k);
      }
      spec.dims.push_back({mn, mx, follows ? gp.dynamic : ""});
    }
    gp.outputs.push_back(spec);
  }
  program.graphs.push_back(std::move(gp));
}

// The program's own translation unit: its JSON and its tables, behind two C functions.
std::string program_unit(const runtime::Program& p) {
  const std::string json = runtime::program_json(p);
  SINTER_CHECK_T(CompileError, json.find(")SINTERAOT\"") == std::string::npos, "[export] a name holds the program's delimiter");
  std::string s = "#include <cstddef>\n#include <cstdint>\nstatic const char kProgram[] = R\"SINTERAOT(" + json + ")SINTERAOT\";\n";
  s += "static const int64_t kTables[] = {";
  for (size_t i = 0; i < p.tables.size(); ++i) {
    s += i == 0 ? "\n" : i % 16 ? "," : ",\n";
    s += p.tables[i] == INT64_MIN ? "INT64_MIN" : std::to_string(p.tables[i]) + "LL";
  }
  if (p.tables.empty()) s += "0";
  s += "};\n";
  s += "extern \"C\" const char* sinter_aot_program(size_t* n) { *n = sizeof kProgram - 1; return kProgram; }\n";
  s += "extern \"C\" const int64_t* sinter_aot_tables(size_t* n) { *n = " + std::to_string(p.tables.size()) + "; return kTables; }\n";
  return s;
}

nlohmann::json spec_json(const runtime::TensorSpec& s) {
  nlohmann::json dims = nlohmann::json::array();
  for (const runtime::DimSpec& d : s.dims)
    dims.push_back(d.name.empty() && d.min == d.max ? nlohmann::json(d.min) : nlohmann::json{{"name", d.name}, {"min", d.min}, {"max", d.max}});
  return {{"name", s.name}, {"dtype", dtype_name(s.dtype)}, {"dims", dims}};
}

std::string manifest(const Exporter& x, const Options& o, const std::string& dir) {
  nlohmann::json graphs = nlohmann::json::object(), state = nlohmann::json::array();
  for (const runtime::GraphProgram& g : x.program.graphs) {
    nlohmann::json in = nlohmann::json::array(), out = nlohmann::json::array();
    for (const auto& s : g.inputs) in.push_back(spec_json(s));
    for (const auto& s : g.outputs) out.push_back(spec_json(s));
    graphs[g.name] = {{"inputs", in}, {"outputs", out}, {"variants", g.variants.size()}};
  }
  int64_t weights = 0;
  for (const Capture& c : x.captured) {
    if (c.spec.state) state.push_back({{"name", c.spec.name}, {"dtype", dtype_name(c.spec.dtype)}, {"shape", c.spec.shape}});
    else ++weights;
  }
  nlohmann::json files = nlohmann::json::object();
  for (const char* f : {"model.so", "weights.safetensors"})
    files[f] = {{"sha256", runtime::sha256_file(dir + "/" + f)}, {"bytes", int64_t(fs::file_size(dir + "/" + f))}};
  return nlohmann::json{{"format", "sinter-aot"},
                        {"abi_version", runtime::kAbiVersion},
                        {"sinter_version", SINTER_VERSION},
                        {"isa", o.isa},
                        {"graphs", graphs},
                        {"weights", weights},
                        {"state", state},
                        {"files", files}}
             .dump(2) + "\n";
}

}  // namespace

Exported export_graphs(const std::vector<GraphToExport>& graphs, const Options& options, const std::string& dir) {
  const auto t0 = std::chrono::steady_clock::now();
  SINTER_CHECK_T(CompileError, options.isa == "x86-64-v3" || options.isa == "x86-64-v4", "[export] --isa must be x86-64-v3 or x86-64-v4, got '",
                 options.isa, "'");
  SINTER_CHECK_T(CompileError, !graphs.empty(), "[export] no graph to export");
  Exporter x(options);
  for (const GraphToExport& g : graphs) x.add(g);
  x.program.captured.clear();
  for (const Capture& c : x.captured) x.program.captured.push_back(c.spec);
  std::error_code ec;
  fs::create_directories(dir, ec);
  SINTER_CHECK_T(IOError, !ec, "[export] cannot create ", dir, ": ", ec.message());
  std::vector<std::string> units = x.sources;
  units.push_back(program_unit(x.program));
  if (options.progress) options.progress("compile", 0, 1);
  compile_library(units, dir + "/model.so", options.isa);
  std::map<std::string, Tensor> tensors;
  for (const Capture& c : x.captured) {
    SINTER_CHECK_T(CompileError, tensors.emplace(c.spec.name, c.t).second, "[export] two captured tensors are named '", c.spec.name, "'");
  }
  io::save_safetensors(dir + "/weights.safetensors", tensors, {{"format", "sinter-aot"}}, 64);  // cache-line aligned when mapped
  write_atomic(dir + "/manifest.json", manifest(x, options, dir));
  if (options.progress) options.progress("compile", 1, 1);
  Exported r;
  r.dir = dir;
  r.model_so_bytes = int64_t(fs::file_size(dir + "/model.so"));
  r.weights_bytes = int64_t(fs::file_size(dir + "/weights.safetensors"));
  for (const Capture& c : x.captured) ++(c.spec.state ? r.state : r.weights);
  r.sizes_traced = x.traced;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

Exported export_graph(const TensorFn& fn, const std::vector<Tensor>& example_inputs, const Options& options, const std::string& dir) {
  return export_graphs({{fn, example_inputs, options.graph}}, options, dir);
}

}  // namespace sinter::aot

// An exported program to and from JSON, with every index checked on the way in: a model.so whose
// program is damaged is refused with what is wrong, never run.
#include "runtime/program.h"

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "sinter/error.h"

namespace sinter::runtime {

using nlohmann::json;

int64_t Variant::row_width() const {
  int64_t w = num_params + int64_t(slots.size());
  for (const ExternSpec& e : externs)
    for (const auto* ops : {&e.in, &e.out})
      for (const Operand& o : *ops) w += 2 * o.rank + 1;
  for (const Operand& o : outputs) w += 2 * o.rank + 1;
  return w;
}

namespace {

// Numbers read only as what they are: a float where an integer belongs (or one out of range) is
// an error, not a conversion (nlohmann's would be undefined behaviour).
int64_t i64(const json& j) {
  if (j.is_number_unsigned() && j.get<uint64_t>() <= uint64_t(INT64_MAX)) return int64_t(j.get<uint64_t>());
  if (!j.is_number_integer() || j.is_number_unsigned()) throw std::runtime_error("expected an integer, got " + j.dump().substr(0, 40));
  return j.get<int64_t>();
}
int i32(const json& j) {
  const int64_t v = i64(j);
  if (v < INT32_MIN || v > INT32_MAX) throw std::runtime_error("integer out of range: " + std::to_string(v));
  return int(v);
}
Shape ints(const json& j) {
  if (!j.is_array()) throw std::runtime_error("expected a list of integers");
  Shape out;
  for (const json& x : j) out.push_back(i64(x));
  return out;
}
double f64(const json& j) {
  if (!j.is_number()) throw std::runtime_error("expected a number");
  return j.get<double>();
}
bool flag(const json& j) {
  if (!j.is_boolean()) throw std::runtime_error("expected true or false");
  return j.get<bool>();
}

json attrs_json(const Attrs& a) {
  json out = json::array();
  for (auto& [k, v] : a.items()) {
    json item = {k};
    std::visit([&](const auto& x) {
      using T = std::decay_t<decltype(x)>;
      if constexpr (std::is_same_v<T, int64_t>) item.push_back("i"), item.push_back(x);
      else if constexpr (std::is_same_v<T, double>) item.push_back("f"), item.push_back(x);
      else if constexpr (std::is_same_v<T, bool>) item.push_back("b"), item.push_back(x);
      else if constexpr (std::is_same_v<T, Shape>) item.push_back("ints"), item.push_back(std::vector<int64_t>(x.begin(), x.end()));
      else if constexpr (std::is_same_v<T, DType>) item.push_back("dtype"), item.push_back(dtype_name(x));
      else if constexpr (std::is_same_v<T, std::string>) item.push_back("s"), item.push_back(x);
      else item.push_back("device"), item.push_back({int(x.type), x.index});
    }, v);
    out.push_back(item);
  }
  return out;
}

Device device_from(const json& v) {
  const int type = i32(v.at(0));
  if (type < 0 || type >= kNumDeviceTypes) throw std::runtime_error("unknown device type " + std::to_string(type));
  return Device{DeviceType(type), i32(v.at(1))};
}

Attrs attrs_from(const json& j) {
  Attrs a;
  for (const json& item : j) {
    const std::string key = item.at(0), kind = item.at(1);
    const json& v = item.at(2);
    if (kind == "i") a.set(key, i64(v));
    else if (kind == "f") a.set(key, f64(v));
    else if (kind == "b") a.set(key, flag(v));
    else if (kind == "ints") a.set(key, ints(v));
    else if (kind == "dtype") a.set(key, dtype_from_name(v.get<std::string>()));
    else if (kind == "s") a.set(key, v.get<std::string>());
    else if (kind == "device") a.set(key, device_from(v));
    else throw std::runtime_error("attribute '" + key + "' has an unknown kind '" + kind + "'");
  }
  return a;
}

json operands_json(const std::vector<Operand>& v) {
  json out = json::array();
  for (const Operand& o : v) out.push_back({o.slot, dtype_name(o.dtype), o.rank});
  return out;
}
std::vector<Operand> operands_from(const json& j) {
  std::vector<Operand> out;
  for (const json& o : j) out.push_back({i32(o.at(0)), dtype_from_name(o.at(1).get<std::string>()), i32(o.at(2))});
  return out;
}

json spec_json(const TensorSpec& s) {
  json dims = json::array();
  for (const DimSpec& d : s.dims) dims.push_back({d.min, d.max, d.name});
  return {{"name", s.name}, {"dtype", dtype_name(s.dtype)}, {"dims", dims}};
}
TensorSpec spec_from(const json& j) {
  TensorSpec s{j.at("name"), dtype_from_name(j.at("dtype").get<std::string>()), {}};
  for (const json& d : j.at("dims")) s.dims.push_back({i64(d.at(0)), i64(d.at(1)), d.at(2).get<std::string>()});
  return s;
}

const char* kind_name(SlotSpec::Kind k) {
  switch (k) {
    case SlotSpec::Kind::input: return "input";
    case SlotSpec::Kind::captured: return "captured";
    case SlotSpec::Kind::fresh: return "fresh";
    case SlotSpec::Kind::arena: return "arena";
  }
  return "?";
}
SlotSpec::Kind kind_from(const std::string& s) {
  for (auto k : {SlotSpec::Kind::input, SlotSpec::Kind::captured, SlotSpec::Kind::fresh, SlotSpec::Kind::arena})
    if (s == kind_name(k)) return k;
  throw std::runtime_error("unknown slot kind '" + s + "'");
}

json variant_json(const Variant& v) {
  json slots = json::array(), externs = json::array();
  for (const SlotSpec& s : v.slots) slots.push_back({kind_name(s.kind), s.index});
  for (const ExternSpec& e : v.externs)
    externs.push_back({{"step", e.step}, {"op", e.op}, {"attrs", attrs_json(e.attrs)}, {"in", operands_json(e.in)}, {"out", operands_json(e.out)}});
  return {{"symbol", v.symbol}, {"slots", slots}, {"externs", externs}, {"outputs", operands_json(v.outputs)}, {"params", v.num_params}};
}
Variant variant_from(const json& j) {
  Variant v;
  v.symbol = j.at("symbol");
  for (const json& s : j.at("slots")) v.slots.push_back({kind_from(s.at(0)), i32(s.at(1))});
  for (const json& e : j.at("externs"))
    v.externs.push_back({i32(e.at("step")), e.at("op"), attrs_from(e.at("attrs")), operands_from(e.at("in")), operands_from(e.at("out"))});
  v.outputs = operands_from(j.at("outputs"));
  v.num_params = i64(j.at("params"));
  return v;
}

// Every index a run will follow, checked.
void check(const Program& p, size_t num_tables) {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw std::runtime_error(what);
  };
  for (const CapturedSpec& c : p.captured)
    for (int64_t d : c.shape) need(d >= 0, "captured tensor '" + c.name + "' has a negative dim");
  for (const GraphProgram& g : p.graphs) {
    const std::string gn = "graph '" + g.name + "': ";
    need(!g.variants.empty() && !g.sizes.empty(), gn + "no code");
    for (const TensorSpec& s : g.inputs) need(s.dims.size() <= 8, gn + "input '" + s.name + "' has more than 8 dims");
    for (const TensorSpec& s : g.outputs) need(s.dims.size() <= 8, gn + "output '" + s.name + "' has more than 8 dims");
    for (const Variant& v : g.variants) {
      need(v.num_params >= 0 && v.num_params < (int64_t(1) << 40) && v.outputs.size() == g.outputs.size(),
           gn + "a variant's parameters or outputs do not match the graph's");
      for (const SlotSpec& s : v.slots) {
        const size_t n = s.kind == SlotSpec::Kind::input ? g.inputs.size() : s.kind == SlotSpec::Kind::captured ? p.captured.size() : 1;
        need(s.kind == SlotSpec::Kind::fresh || s.kind == SlotSpec::Kind::arena || (s.index >= 0 && size_t(s.index) < n),
             gn + "a slot names input or captured tensor " + std::to_string(s.index) + ", which does not exist");
      }
      auto operands = [&](const std::vector<Operand>& ops) {
        for (const Operand& o : ops)
          need(o.slot >= 0 && size_t(o.slot) < v.slots.size() && o.rank >= 0 && o.rank <= 16, gn + "an operand's slot or rank is out of range");
      };
      for (const ExternSpec& e : v.externs) operands(e.in), operands(e.out), need(e.step >= 0, gn + "a negative step");
      operands(v.outputs);
    }
    int64_t last = -1;
    for (const SizeEntry& s : g.sizes) {
      need(s.variant >= 0 && size_t(s.variant) < g.variants.size(), gn + "a size names a variant that does not exist");
      need(s.value > last, gn + "sizes are not ascending");
      last = s.value;
      const int64_t w = g.variants[size_t(s.variant)].row_width();
      need(s.row >= 0 && uint64_t(s.row) + uint64_t(w) <= num_tables, gn + "a size's table row lies past the end of the tables");
      for (const auto& [k, a] : s.attrs)
        need(k >= 0 && size_t(k) < g.variants[size_t(s.variant)].externs.size(), gn + "a size's attributes name a call that does not exist");
    }
    if (!g.dynamic.empty())
      need(g.dyn_min >= 1 && g.dyn_max >= g.dyn_min && int64_t(g.sizes.size()) == g.dyn_max - g.dyn_min + 1 &&
               g.sizes.front().value == g.dyn_min,
           gn + "the sizes do not cover the dynamic range");
  }
}

}  // namespace

std::string program_json(const Program& p) {
  json captured = json::array(), graphs = json::array();
  for (const CapturedSpec& c : p.captured)
    captured.push_back({{"name", c.name}, {"state", c.state}, {"dtype", dtype_name(c.dtype)}, {"shape", std::vector<int64_t>(c.shape.begin(), c.shape.end())}});
  for (const GraphProgram& g : p.graphs) {
    json in = json::array(), out = json::array(), variants = json::array(), sizes = json::array();
    for (const TensorSpec& s : g.inputs) in.push_back(spec_json(s));
    for (const TensorSpec& s : g.outputs) out.push_back(spec_json(s));
    for (const Variant& v : g.variants) variants.push_back(variant_json(v));
    for (const SizeEntry& s : g.sizes) {
      json attrs = json::array();
      for (const auto& [k, a] : s.attrs) attrs.push_back({k, attrs_json(a)});
      sizes.push_back({s.value, s.variant, s.row, attrs});
    }
    graphs.push_back({{"name", g.name}, {"inputs", in}, {"outputs", out}, {"dynamic", {g.dynamic, g.dyn_min, g.dyn_max}},
                      {"variants", variants}, {"sizes", sizes}});
  }
  return json{{"abi_version", kAbiVersion}, {"captured", captured}, {"graphs", graphs}}.dump();
}

Program parse_program(const std::string& text, const int64_t* tables, size_t num_tables, const std::string& where) {
  try {
    const json j = json::parse(text);
    Program p;
    for (const json& c : j.at("captured"))
      p.captured.push_back({c.at("name"), flag(c.at("state")), dtype_from_name(c.at("dtype").get<std::string>()),
                            ints(c.at("shape"))});
    for (const json& gj : j.at("graphs")) {
      GraphProgram g;
      g.name = gj.at("name");
      for (const json& s : gj.at("inputs")) g.inputs.push_back(spec_from(s));
      for (const json& s : gj.at("outputs")) g.outputs.push_back(spec_from(s));
      const json& d = gj.at("dynamic");
      g.dynamic = d.at(0).get<std::string>(), g.dyn_min = i64(d.at(1)), g.dyn_max = i64(d.at(2));
      for (const json& v : gj.at("variants")) g.variants.push_back(variant_from(v));
      for (const json& s : gj.at("sizes")) {
        SizeEntry e{i64(s.at(0)), i32(s.at(1)), i64(s.at(2)), {}};
        for (const json& a : s.at(3)) e.attrs.emplace_back(i32(a.at(0)), attrs_from(a.at(1)));
        g.sizes.push_back(std::move(e));
      }
      p.graphs.push_back(std::move(g));
    }
    check(p, num_tables);
    p.tables.assign(tables, tables + num_tables);
    return p;
  } catch (const std::exception& e) {
    SINTER_THROW(IOError, "[", where, "] the exported program is damaged: ", e.what());
  }
}

Manifest parse_manifest(const std::string& text, const std::string& where) {
  json m;
  try {
    m = json::parse(text);
  } catch (const json::exception& e) {
    SINTER_THROW(IOError, "[", where, "] is not valid JSON: ", e.what());
  }
  SINTER_CHECK_T(IOError, m.is_object() && m.value("format", json()) == "sinter-aot", "[", where,
                 "] is not a Sinter export manifest (no \"format\": \"sinter-aot\")");
  Manifest out;
  const json abi = m.value("abi_version", json());
  SINTER_CHECK_T(IOError, abi.is_number_integer(), "[", where, "] has no abi_version");
  out.abi_version = abi.is_number_unsigned() ? int64_t(std::min<uint64_t>(abi.get<uint64_t>(), uint64_t(INT64_MAX))) : abi.get<int64_t>();
  const json isa = m.value("isa", json()), version = m.value("sinter_version", json());
  out.isa = isa.is_string() ? isa.get<std::string>() : "";
  out.sinter_version = version.is_string() ? version.get<std::string>() : "";
  const json files = m.value("files", json());
  SINTER_CHECK_T(IOError, files.is_object(), "[", where, "] lists no files");
  for (auto& [name, f] : files.items()) {
    const json sha = f.is_object() ? f.value("sha256", json()) : json();
    SINTER_CHECK_T(IOError, sha.is_string() && sha.get<std::string>().size() == 64, "[", where, "] has no SHA-256 for ", name);
    out.sha256[name] = sha.get<std::string>();
  }
  return out;
}

std::vector<Tensor> match_weights(const Program& p, const std::map<std::string, Tensor>& tensors, const std::string& where) {
  std::vector<Tensor> out;
  for (const CapturedSpec& c : p.captured) {
    auto it = tensors.find(c.name);
    SINTER_CHECK_T(IOError, it != tensors.end(), "[", where, "] has no tensor '", c.name, "', which the model reads");
    const Tensor& t = it->second;
    SINTER_CHECK_T(IOError, t.dtype() == c.dtype && t.shape() == c.shape, "[", where, "] tensor '", c.name, "' is ", t.dtype(), t.shape(),
                   ", the model was exported with ", c.dtype, c.shape, " (weights of another model?)");
    out.push_back(t);
  }
  return out;
}

}  // namespace sinter::runtime

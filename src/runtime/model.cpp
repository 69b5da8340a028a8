// Loading an exported folder: every check before anything runs, each failure naming the file and
// what is wrong (the bad-file tests in tests/aot_test.cpp go through each).
#include <dlfcn.h>
#include <elf.h>

#include <cstring>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/format.h"
#include "runtime/runtime.h"
#include "runtime/sha256.h"
#include "sinter/io.h"

namespace sinter::runtime {

namespace fs = std::filesystem;

Model::~Model() {
  captured.clear();
  if (handle) dlclose(handle);
}

int Model::graph_index(const std::string& name) const {
  for (size_t i = 0; i < program.graphs.size(); ++i)
    if (program.graphs[i].name == name) return int(i);
  return -1;
}

const KernelFn* Model::kernel(const ExternSpec& call) const {
  if (!call.attrs.has("__user_kernel")) return find_kernel(call.op);
  auto it = user_kernels.find(call.attrs.str("__user_kernel"));
  return it == user_kernels.end() ? nullptr : &it->second;
}

namespace {

// A user kernel's entry as a kernel: read-only inputs made contiguous, the config the export chose
// for the call's size (attributes __config, __writes).
KernelFn user_kernel(UserKernelFn fn) {
  return [fn](std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
    std::vector<bool> written(in.size(), false);
    for (int64_t i : a.ints("__writes"))
      if (i >= 0 && size_t(i) < in.size()) written[size_t(i)] = true;
    std::vector<char*> p;
    std::vector<int64_t> q;
    std::vector<Tensor> keep;
    user_kernel_operands(in, out, written, p, q, keep);
    fn(p.data(), q.data(), int(a.i("__config")));
  };
}

std::string read_file(const std::string& path, size_t limit) {
  std::ifstream f(path, std::ios::binary);
  SINTER_CHECK_T(IOError, f.good(), "[", path, "] cannot be read (missing?)");
  std::ostringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  SINTER_CHECK_T(IOError, s.size() <= limit, "[", path, "] is larger than ", limit, " bytes: not a manifest");
  return s;
}

// The manifest: format, ABI version, ISA level, and each file's SHA-256 (checked here).
void check_manifest(const std::string& dir) {
  const std::string path = dir + "/manifest.json";
  const Manifest m = parse_manifest(read_file(path, 1 << 24), path);
  SINTER_CHECK_T(IOError, m.abi_version == kAbiVersion, "[", path, "] the model was exported for runtime ABI version ", m.abi_version,
                 "; this runtime (libsinter_rt) reads version ", kAbiVersion, ": export it again with this Sinter");
  SINTER_CHECK_T(IOError, cpu_supports_isa(m.isa), "[", path, "] the model was compiled for ISA level '", m.isa,
                 "', which this CPU does not run (export it with --isa x86-64-v3, or for this machine)");
  for (const char* name : {"model.so", "weights.safetensors"}) {
    SINTER_CHECK_T(IOError, m.sha256.count(name), "[", path, "] has no SHA-256 for ", name);
    const std::string file = dir + "/" + name;
    SINTER_CHECK_T(IOError, fs::is_regular_file(file), "[", file, "] is missing");
    const std::string got = sha256_file(file);
    SINTER_CHECK_T(IOError, m.sha256.at(name) == got, "[", file, "] does not match the manifest: its SHA-256 is ", got, ", the manifest says ",
                   m.sha256.at(name), " (a damaged or replaced file)");
  }
}

// What dlopen would trust: an x86-64 ELF shared object whose headers and loadable segments lie
// inside the file (a truncated file would otherwise be mapped past its end: SIGBUS, not an error).
void check_elf(const std::string& so) {
  std::ifstream f(so, std::ios::binary | std::ios::ate);
  SINTER_CHECK_T(IOError, f.good(), "[", so, "] cannot be read");
  const uint64_t size = uint64_t(f.tellg());
  Elf64_Ehdr h{};
  f.seekg(0);
  f.read(reinterpret_cast<char*>(&h), sizeof h);
  SINTER_CHECK_T(IOError, size >= sizeof h && std::memcmp(h.e_ident, ELFMAG, SELFMAG) == 0 && h.e_ident[EI_CLASS] == ELFCLASS64 &&
                              h.e_type == ET_DYN && h.e_machine == EM_X86_64,
                 "[", so, "] is not an x86-64 ELF shared object");
  SINTER_CHECK_T(IOError, h.e_phentsize == sizeof(Elf64_Phdr) && h.e_phoff + uint64_t(h.e_phnum) * sizeof(Elf64_Phdr) <= size &&
                              h.e_shoff + uint64_t(h.e_shnum) * h.e_shentsize <= size,
                 "[", so, "] is truncated: its headers lie past its end (", size, " bytes)");
  for (int i = 0; i < h.e_phnum; ++i) {
    Elf64_Phdr p{};
    f.seekg(std::streamoff(h.e_phoff + uint64_t(i) * sizeof p));
    f.read(reinterpret_cast<char*>(&p), sizeof p);
    SINTER_CHECK_T(IOError, p.p_type != PT_LOAD || p.p_offset + p.p_filesz <= size, "[", so, "] is truncated: a segment ends at byte ",
                   p.p_offset + p.p_filesz, " of ", size);
  }
}

// The program model.so carries: its JSON and its tables.
void open_code(Model& m) {
  const std::string so = m.dir + "/model.so";
  check_elf(so);
  m.handle = dlopen(fs::absolute(so).c_str(), RTLD_NOW | RTLD_LOCAL);
  SINTER_CHECK_T(IOError, m.handle != nullptr, "[", so, "] cannot be loaded: ", dlerror());
  using Text = const char* (*)(size_t*);
  using Table = const int64_t* (*)(size_t*);
  auto text = reinterpret_cast<Text>(dlsym(m.handle, "sinter_aot_program"));
  auto table = reinterpret_cast<Table>(dlsym(m.handle, "sinter_aot_tables"));
  SINTER_CHECK_T(IOError, text && table, "[", so, "] is not an exported Sinter model (no sinter_aot_program)");
  size_t n = 0, rows = 0;
  const char* json_text = text(&n);
  const int64_t* tables = table(&rows);
  m.program = parse_program(std::string(json_text, n), tables, rows, so);
  for (const GraphProgram& g : m.program.graphs) {
    auto& fns = m.code.emplace_back();
    for (const Variant& v : g.variants) {
      auto fn = reinterpret_cast<GraphRunFn>(dlsym(m.handle, v.symbol.c_str()));
      SINTER_CHECK_T(IOError, fn != nullptr, "[", so, "] has no ", v.symbol, " (graph ", g.name, ")");
      fns.push_back(fn);
    }
    for (const Variant& v : g.variants)
      for (const ExternSpec& e : v.externs) {
        if (e.attrs.has("__user_kernel")) {
          const std::string& sym = e.attrs.str("__user_kernel");
          auto fn = reinterpret_cast<UserKernelFn>(dlsym(m.handle, sym.c_str()));
          SINTER_CHECK_T(IOError, fn != nullptr, "[", so, "] has no ", sym, " (user kernel ", e.op, ")");
          m.user_kernels.try_emplace(sym, user_kernel(fn));
        }
        SINTER_CHECK_T(IOError, m.kernel(e) != nullptr, "[", so, "] graph ", g.name, " calls op '", e.op,
                       "', which this runtime has no kernel for");
      }
  }
}

// The weights (and state's exported values): mapped, each checked against the program's spec.
void map_weights(Model& m) {
  const std::string path = m.dir + "/weights.safetensors";
  m.captured = match_weights(m.program, io::load_safetensors(path).tensors, path);
}

}  // namespace

std::unique_ptr<Model> load_model(const std::string& dir) {
  auto m = std::make_unique<Model>();
  m->dir = dir;
  check_manifest(dir);
  open_code(*m);
  map_weights(*m);
  return m;
}

}  // namespace sinter::runtime

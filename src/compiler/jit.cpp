// Generated source -> g++ -> a verified, content-addressed cache entry -> dlopen.
#include "core/format.h"
#include "compiler/jit.h"

#include "sinter/version.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <atomic>
#include <map>
#include <mutex>
#include <sstream>

#include "sinter/error.h"

namespace sinter::compiler {

extern const char* const kJitPrelude;  // generated/jit_prelude.cpp

namespace {
namespace fs = std::filesystem;

// The eager elementwise kernels' flags (CMakeLists.txt): each op's own rounding, so a fused chain
// equals the eager ops bit for bit, and whole AVX-512 registers where the CPU has them (for Intel,
// -march=native alone picks 256-bit vectors: the chain6 kernel of `sinter bench compile` takes
// 1.27x as long at that width on 4M floats, on an AVX-512 Xeon). The functors' explicit fused
// multiply-adds (src/ops/scalar_fns.h) follow the library's build: a library built without FMA
// instructions has generated code round its products apart too.
#if defined(__FMA__)
#define SINTER_JIT_FMA "1"
#else
#define SINTER_JIT_FMA "0"
#endif
#if defined(__x86_64__)
#define SINTER_JIT_WIDTH "-mprefer-vector-width=512 "
#else
#define SINTER_JIT_WIDTH ""
#endif
// A sanitizer build's generated code runs under AddressSanitizer at -O1, which builds it in less than
// half -O3's time (an 11-kernel graph: 1.2 s against 2.8 s) and rounds the same (no contraction).
#if defined(SINTER_JIT_SANITIZE)
#define SINTER_JIT_OPT "-O1"
#define SINTER_JIT_ASAN " -fsanitize=address -fno-omit-frame-pointer"
#else
#define SINTER_JIT_OPT "-O3"
#define SINTER_JIT_ASAN ""
#endif
#if !defined(SINTER_JIT_CXX)
#define SINTER_JIT_CXX "g++"
#endif
constexpr const char* kFlags =
    "-std=c++20 " SINTER_JIT_OPT " -march=native " SINTER_JIT_WIDTH "-fPIC -shared -fopenmp -ffp-contract=off -fno-math-errno -fno-trapping-math "
    "-DSINTER_FUNCTORS_FMA=" SINTER_JIT_FMA SINTER_JIT_ASAN;
constexpr const char* kSinterVersion = SINTER_VERSION;

uint64_t fnv(const std::string& s, uint64_t h = 0xcbf29ce484222325ull) {
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}
}  // namespace

std::string content_hash(const std::string& s) { return hex(fnv(s), 16) + hex(fnv(s, 0x9e3779b97f4a7c15ull), 16); }

namespace {

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string compiler() {
  const char* c = std::getenv("SINTER_CXX");
  return c && *c ? c : SINTER_JIT_CXX;
}

// Runs a shell command, returning its exit status and what it printed (stdout and stderr).
int run(const std::string& cmd, std::string& output) {
  output.clear();
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) output.append(buf, n);
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// The compiler's identity (its --version line), asked once per compiler name.
std::string compiler_identity(const std::string& cxx) {
  static std::mutex mu;
  static std::map<std::string, std::string> known;
  std::lock_guard lock(mu);
  if (auto it = known.find(cxx); it != known.end()) return it->second;
  std::string out;
  const int rc = run(shell_quote(cxx) + " --version", out);
  SINTER_CHECK_T(CompileError, rc == 0, "[compile] the C++ compiler '", cxx, "' cannot be run (exit ", rc, "): ",
                 out.substr(0, 400), rc == 127 ? " (set SINTER_CXX to a C++20 compiler, or install g++)" : "");
  return known[cxx] = out.substr(0, out.find('\n'));
}



// Holds an exclusive lock on <path>.lock while it lives.
struct FileLock {
  explicit FileLock(const std::string& path) : fd(::open((path + ".lock").c_str(), O_CREAT | O_RDWR, 0644)) {
    if (fd >= 0) ::flock(fd, LOCK_EX);
  }
  ~FileLock() {
    if (fd >= 0) ::flock(fd, LOCK_UN), ::close(fd);
  }
  int fd;
};

bool valid_entry(const std::string& so, const std::string& sum) {
  std::error_code ec;
  if (!fs::exists(so, ec) || !fs::exists(sum, ec)) return false;
  return read_all(sum) == content_hash(read_all(so));
}

// The cache entry `file` beside its checksum (`sum`), under the lock of `base`: true when a valid
// one was there; otherwise `build(tmp)` writes it (throwing on failure, tmp removed), then it is
// renamed into place and its checksum written.
bool cached_entry(const std::string& base, const std::string& file, const std::string& sum,
                  const std::function<void(const std::string& tmp)>& build) {
  FileLock lock(base);
  if (valid_entry(file, sum)) return true;
  static std::atomic<uint64_t> serial{0};  // threads of one process build apart
  const std::string tmp = file + ".tmp." + std::to_string(getpid()) + "." + std::to_string(serial++);
  try {
    build(tmp);
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
  fs::rename(tmp, file);
  write_atomic(sum, content_hash(read_all(file)));
  return false;
}

}  // namespace

void write_atomic(const std::string& path, const std::string& text) {
  static std::atomic<uint64_t> serial{0};  // threads of one process write apart too
  const std::string tmp = path + ".tmp." + std::to_string(getpid()) + "." + std::to_string(serial++);
  {
    std::ofstream f(tmp, std::ios::binary);
    f << text;
    SINTER_CHECK_T(CompileError, f.good(), "[compile] cannot write ", tmp);
  }
  fs::rename(tmp, path);
}

std::string cpu_features() {
  static const std::string flags = [] {
    std::ifstream f("/proc/cpuinfo");
    std::string line;
    while (std::getline(f, line))
      if (line.rfind("flags", 0) == 0) return line;
    return std::string("unknown");
  }();
  return flags;
}

std::string cache_dir() {
  if (const char* d = std::getenv("SINTER_CACHE_DIR"); d && *d) return d;
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : "/tmp") + "/.cache/sinter";
}

JitModule::~JitModule() = default;  // the code stays loaded: outputs and callbacks may still point into it

std::string debug_dir() {
  const char* d = std::getenv("SINTER_COMPILE_DEBUG");
  return d && *d ? d : "";
}

void debug_write(const std::string& file, const std::string& text) {
  const std::string dir = debug_dir();
  if (dir.empty()) return;
  std::error_code ec;
  fs::create_directories(dir, ec);
  std::ofstream(dir + "/" + file, std::ios::binary) << text;
}

namespace {
// One dlopen per entry per process; one compile of a key at a time (different keys in parallel).
struct Loaded {
  std::mutex mu;  // guards the maps, never held across a compile
  std::map<std::string, std::weak_ptr<JitModule>> modules;
  std::map<std::string, std::shared_ptr<std::mutex>> building;
  std::shared_ptr<JitModule> find(const std::string& key) {
    std::lock_guard lock(mu);
    auto it = modules.find(key);
    return it == modules.end() ? nullptr : it->second.lock();
  }
};
Loaded& loaded() {
  static Loaded l;
  return l;
}
}  // namespace

std::shared_ptr<JitModule> jit_load(const std::string& source, const std::string& name, const std::string& symbol) {
  const std::string cxx = compiler();
  const std::string identity = compiler_identity(cxx);
  const std::string key = content_hash(source + "\n" + identity + "\n" + kFlags + "\n" + cpu_features() + "\n" + kSinterVersion +
                                       "\n" + kJitPrelude);
  Loaded& l = loaded();
  if (auto m = l.find(key)) return m;
  std::shared_ptr<std::mutex> key_mu;
  {
    std::lock_guard lock(l.mu);
    auto& b = l.building[key];
    if (!b) b = std::make_shared<std::mutex>();
    key_mu = b;
  }
  std::lock_guard building(*key_mu);
  if (auto m = l.find(key)) return m;  // another thread compiled it meanwhile
  const std::string dir = cache_dir();
  std::error_code ec;
  fs::create_directories(dir, ec);
  SINTER_CHECK_T(CompileError, !ec, "[compile] cannot create the cache folder ", dir, ": ", ec.message());
  const std::string base = dir + "/" + key, so = base + ".so", sum = base + ".sum";
  auto m = std::make_shared<JitModule>();
  m->from_cache = cached_entry(base, so, sum, [&](const std::string& tmp) {
    // The prelude by its own hash: processes of different versions sharing the cache never swap it.
    const std::string prelude_name = "sinter_jit_prelude_" + content_hash(kJitPrelude) + ".h";
    const std::string src = base + ".cpp";
    if (!fs::exists(dir + "/" + prelude_name, ec)) write_atomic(dir + "/" + prelude_name, kJitPrelude);
    std::string text = source;
    const std::string plain = "#include \"sinter_jit_prelude.h\"";
    if (const size_t at = text.find(plain); at != std::string::npos) text.replace(at, plain.size(), "#include \"" + prelude_name + "\"");
    write_atomic(src, text);
    const std::string cmd = shell_quote(cxx) + " " + kFlags + " -I" + shell_quote(dir) + " -o " + shell_quote(tmp) + " " + shell_quote(src);
    debug_write(name + ".cmd", cmd + "\n");
    std::string out;
    const int rc = run(cmd, out);
    SINTER_CHECK_T(CompileError, rc == 0, "[compile] the C++ compiler '", cxx, "' failed (exit ", rc, ") on ", src, ":\n",
                   out.substr(0, 2000));
  });
  m->path = so;
  m->handle = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
  SINTER_CHECK_T(CompileError, m->handle != nullptr, "[compile] cannot load ", so, ": ", dlerror());
  m->entry = dlsym(m->handle, symbol.c_str());
  SINTER_CHECK_T(CompileError, m->entry != nullptr, "[compile] ", so, " has no ", symbol);
  if (symbol == "sinter_graph_run") m->run = reinterpret_cast<GraphRunFn>(m->entry);
  std::lock_guard lock(l.mu);
  l.modules[key] = m;
  return m;
}

namespace {
// One export unit's object: from the cache when an earlier export compiled the same source with the
// same compiler, flags and prelude (a re-export of new weights, or another dynamic range, compiles
// only what changed); otherwise compiled into it, under the key's lock.
std::string unit_object(const std::string& cxx, const std::string& flags, const fs::path& dir, size_t i, const std::string& source) {
  const std::string key = content_hash(source + "\n" + compiler_identity(cxx) + "\n" + flags + "\n" + kSinterVersion + "\n" + kJitPrelude);
  std::error_code ec;
  fs::create_directories(cache_dir(), ec);  // without a cache folder, the export's own one serves
  const std::string base = ec ? (dir / ("unit-" + key)).string() : cache_dir() + "/unit-" + key, obj = base + ".o";
  cached_entry(base, obj, base + ".sum", [&](const std::string& tmp) {
    const std::string src = (dir / ("unit" + std::to_string(i) + ".cpp")).string();
    write_atomic(src, source);
    std::string msg;
    const std::string cmd =
        shell_quote(cxx) + " " + flags + " -c -I" + shell_quote(dir.string()) + " -o " + shell_quote(tmp) + " " + shell_quote(src);
    const int rc = run(cmd, msg);
    SINTER_CHECK_T(CompileError, rc == 0, "[export] the C++ compiler '", cxx, "' failed (exit ", rc, ") on ", src, ":\n",
                   msg.substr(0, 2000));
  });
  return obj;
}
}  // namespace

void compile_library(const std::vector<std::string>& sources, const std::string& out, const std::string& march) {
  const std::string cxx = compiler();
  (void)compiler_identity(cxx);  // a missing compiler is named before any work
  std::string flags = kFlags;
  flags.replace(flags.find("-march=native"), std::strlen("-march=native"), "-march=" + march);
  std::error_code ec;
  const fs::path dir = fs::temp_directory_path() / ("sinter-export-" + std::to_string(getpid()) + "-" + content_hash(out).substr(0, 8));
  fs::create_directories(dir, ec);
  SINTER_CHECK_T(CompileError, !ec, "[export] cannot create ", dir.string(), ": ", ec.message());
  struct Cleanup {
    fs::path d;
    ~Cleanup() {
      std::error_code e;
      fs::remove_all(d, e);
    }
  } cleanup{dir};
  write_atomic((dir / "sinter_jit_prelude.h").string(), kJitPrelude);
  std::vector<std::future<std::string>> units;
  for (size_t i = 0; i < sources.size(); ++i)
    units.push_back(std::async(std::launch::async, [&, i] { return unit_object(cxx, flags, dir, i, sources[i]); }));
  std::string objects;
  std::vector<std::string> names;
  for (auto& u : units) names.push_back(u.get());  // every unit finished (or threw) before the folder goes
  for (const std::string& o : names) objects.append(" ").append(shell_quote(o));
  const std::string tmp = out + ".tmp." + std::to_string(getpid());
  std::string msg;
  const int rc = run(shell_quote(cxx) + " " + flags + " -o " + shell_quote(tmp) + objects, msg);
  if (rc != 0) fs::remove(tmp, ec);
  SINTER_CHECK_T(CompileError, rc == 0, "[export] linking ", out, " with '", cxx, "' failed (exit ", rc, "):\n", msg.substr(0, 2000));
  fs::rename(tmp, out, ec);
  SINTER_CHECK_T(CompileError, !ec, "[export] cannot write ", out, ": ", ec.message());
}

}  // namespace sinter::compiler

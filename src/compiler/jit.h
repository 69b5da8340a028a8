#pragma once
// The system C++ compiler behind sinter::compile (jit.cpp): generated source -> shared object in
// a content-addressed disk cache -> dlopen. The cache (SINTER_CACHE_DIR, default
// ~/.cache/sinter) is keyed by a hash of the source, the compiler's identity, the flags, the
// CPU's features and Sinter's version. Entries are written atomically beside a checksum and
// verified on load: a corrupt or truncated one is rebuilt. A lock file per key makes processes
// that compile the same graph at once wait for one another.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/executor.h"

namespace sinter::compiler {

using runtime::GraphRunFn;

struct JitModule {
  void* handle = nullptr;
  GraphRunFn run = nullptr;  // sinter_graph_run, for a graph's translation unit
  void* entry = nullptr;     // the symbol jit_load was asked for
  std::string path;
  bool from_cache = false;  // loaded without compiling
  ~JitModule();
};

// Compiles (or loads from the cache) a translation unit that defines `symbol` (a graph's:
// sinter_graph_run). Throws CompileError naming the compiler and showing its message when it is
// missing or fails. Compiles of different sources run in parallel: a key's lock, not a global one.
std::shared_ptr<JitModule> jit_load(const std::string& source, const std::string& name, const std::string& symbol = "sinter_graph_run");

// Compiles translation units (generated sources, which include the prelude) into one shared
// library at `out`, for export: the JIT's flags with -march=`march`, each unit in parallel (its
// object cached as the JIT's entries are, so a re-export compiles only new units), then one link;
// written atomically. Throws CompileError naming the compiler and showing its message.
void compile_library(const std::vector<std::string>& sources, const std::string& out, const std::string& march);

// The content hash the cache keys by, the cache folder, the CPU's feature line, and an atomic
// write (temporary file, rename): what the autotuner's records share with the code cache.
std::string content_hash(const std::string& s);
std::string cache_dir();
std::string cpu_features();
void write_atomic(const std::string& path, const std::string& text);

// The directory SINTER_COMPILE_DEBUG names, or empty: graphs, sources and command lines go there.
std::string debug_dir();
void debug_write(const std::string& file, const std::string& text);

}  // namespace sinter::compiler

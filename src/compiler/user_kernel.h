#pragma once
// User kernels inside the compiler (include/sinter/kernel.h): the source record an op registered
// by register_kernel_def points to, its translation unit (every config instantiated, chosen by a
// parameter), its compile through the JIT's disk cache, and the autotuner (autotune.cpp) that
// picks a config per key bucket and keeps the choice on disk.
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "compiler/jit.h"
#include "sinter/kernel.h"

namespace sinter::compiler {

using runtime::UserKernelFn;

struct UserKernel {
  KernelDef def;
  std::string text;   // the source
  std::string label;  // the file diagnostics name (source_file, or "<kernel NAME>")
  std::string hash;   // of the source, the configs and the dtypes: what a tuning record is for
  std::mutex mu;      // guards module and tuned
  std::shared_ptr<JitModule> module;
  std::map<std::vector<int64_t>, TunedChoice> tuned;  // by key bucket
  bool tuned_loaded = false;
  // A variant with a fused epilogue (user_epilogue.cpp): its whole translation unit, and the
  // kernel whose tuning it shares.
  std::string unit;
  UserKernel* tuning = nullptr;
};

// The user kernel an op was registered from, or null.
UserKernel* user_kernel_of(const OpDef* op);
std::shared_ptr<UserKernel> user_kernel_ptr(const OpDef* op);
// An op (not in the op table) for a variant of a user kernel: its inputs the kernel's then
// `extra_inputs` more, its outputs and effects the kernel's; it runs `variant`.
std::shared_ptr<OpDef> variant_op(std::shared_ptr<UserKernel> variant, const std::string& name, int extra_inputs);
// Its translation unit: the prelude, the user's source under #line, one struct per config, and
// the entry sinter_user_kernel, which builds the In/Out views and runs the config asked for.
std::string user_kernel_source(const UserKernel& k);
// Compiles (or loads) its code once; later calls return it. Throws CompileError naming the kernel.
UserKernelFn user_kernel_code(UserKernel& k);
// The config a call of these operands runs (autotuned on them when its key bucket is new): what
// export records per size.
int user_kernel_config(UserKernel& k, std::span<const Tensor> in, std::span<Tensor> out);

// autotune.cpp: the config for this call's sizes; the first call with a new key bucket times every
// config on the call's own buffers (inputs the kernel writes cloned for the trials) and records
// the fastest, in memory and on disk (per kernel hash, bucket and CPU), atomically.
struct UserKernelCall {
  std::vector<char*> p;
  std::vector<int64_t> q;
  std::vector<Tensor> written;  // inputs the kernel writes (the trials run on clones of them)
  std::vector<size_t> written_slot;
};
int choose_config(UserKernel& k, std::span<const TensorMeta> in, UserKernelCall& call, UserKernelFn fn);

}  // namespace sinter::compiler

// The runtime's kernel registry: the CPU kernels register into it by op name (the same call the
// library's op table takes, cpu::register_all_kernels), and an exported program's library calls
// look their kernels up here at load.
#include <map>
#include <mutex>

#include "cpu/cpu.h"
#include "ops/common.h"
#include "runtime/runtime.h"

namespace sinter::runtime {
namespace {
std::map<std::string, KernelFn, std::less<>>& table() {
  static std::map<std::string, KernelFn, std::less<>> t;
  return t;
}
}  // namespace
}  // namespace sinter::runtime

namespace sinter::detail {
void add_kernel(std::string_view name, DeviceType device, KernelFn kernel) {
  if (device == DeviceType::cpu) runtime::table()[std::string(name)] = std::move(kernel);
}
}  // namespace sinter::detail

namespace sinter::runtime {

const KernelFn* find_kernel(const std::string& op) {
  static std::once_flag once;
  std::call_once(once, cpu::register_all_kernels);
  auto it = table().find(op);
  return it == table().end() ? nullptr : &it->second;
}

bool cpu_supports_isa(const std::string& isa) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  // (the level's marks that both GCC and clang can ask for)
  const bool v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2");
  if (isa == "x86-64-v3") return v3;
  if (isa == "x86-64-v4")
    return v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vl");
#endif
  return false;
}

}  // namespace sinter::runtime

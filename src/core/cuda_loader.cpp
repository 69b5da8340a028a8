// Loads the CUDA backend library on first use (include/sinter/cuda.h): SINTER_CUDA_LIBRARY, else
// libsinter_cuda.so next to libsinter. Every failure becomes the reason unavailable_reason() gives.
#include <dlfcn.h>

#include <filesystem>
#include <mutex>

#include "core/cuda_hooks.h"
#include "sinter/cuda.h"
#include "sinter/error.h"

namespace sinter::cuda {
namespace {

struct State {
  std::once_flag once;
  bool ok = false;
  std::string reason;
  detail::CudaHooks hooks;
};
State& state() {
  static State s;
  return s;
}

std::string library_path() {
  if (const char* p = std::getenv("SINTER_CUDA_LIBRARY")) return p;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&library_path), &info) && info.dli_fname)
    return (std::filesystem::path(info.dli_fname).parent_path() / "libsinter_cuda.so").string();
  return "libsinter_cuda.so";
}

void load(State& s) {
  const std::string path = library_path();
  if (!std::filesystem::exists(path)) {
    s.reason = "this Sinter has no CUDA backend (" + path +
               " does not exist; it is built where nvcc and CUDA >= 12.8 are found, with SINTER_CUDA=AUTO or ON)";
    return;
  }
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    s.reason = "could not load " + path + ": " + dlerror();
    return;
  }
  const auto attach = reinterpret_cast<detail::CudaAttachFn>(dlsym(lib, "sinter_cuda_attach"));
  if (!attach) {
    s.reason = path + " has no sinter_cuda_attach: it is not a Sinter CUDA backend";
    return;
  }
  if (const char* why = attach(&s.hooks, detail::kCudaHooksAbi)) {
    s.reason = why;
    return;
  }
  s.ok = true;
}

State& loaded() {
  State& s = state();
  std::call_once(s.once, [&] { load(s); });
  return s;
}

}  // namespace

bool available() { return loaded().ok; }
std::string unavailable_reason() { return loaded().ok ? std::string() : loaded().reason; }
int device_count() { return loaded().ok ? loaded().hooks.device_count : 0; }
bool emulated() { return loaded().ok && loaded().hooks.emulated; }

void require_device(int index) {
  detail::require_cuda();
  SINTER_CHECK_T(DeviceError, index >= 0 && index < device_count(), "[cuda] cuda:", index, " is not a device of this machine (it has ",
                 device_count(), " CUDA device", device_count() == 1 ? "" : "s", ")");
}

void synchronize(int device) {
  detail::require_cuda();
  loaded().hooks.synchronize(device);
}

MemoryStats memory_stats(int device) {
  detail::require_cuda();
  int64_t v[3] = {0, 0, 0};
  loaded().hooks.memory_stats(device, v);
  return {v[0], v[1], v[2]};
}

int64_t host_synchronizations() { return available() ? loaded().hooks.host_synchronizations() : 0; }

std::string device_name(int device) {
  require_device(device);
  return loaded().hooks.device_name(device);
}

void copy_device_bytes(void* dst, const void* src, int64_t bytes, int device) {
  require_device(device);
  loaded().hooks.copy_bytes(dst, src, bytes, device);
}

void empty_cache() {
  if (available()) loaded().hooks.empty_cache();
}

Graph::Graph(int device, const std::function<void()>& fn) {
  require_device(device);
  handle_ = loaded().hooks.graph_capture(device, fn);
}

Graph::~Graph() {
  if (handle_) loaded().hooks.graph_free(handle_);
}

Graph& Graph::operator=(Graph&& o) noexcept {
  if (this != &o) {
    if (handle_) loaded().hooks.graph_free(handle_);
    handle_ = o.handle_, o.handle_ = nullptr;
  }
  return *this;
}

void Graph::replay() {
  SINTER_CHECK(handle_, "[cuda] replaying a graph that was moved from");
  loaded().hooks.graph_replay(handle_);
}

}  // namespace sinter::cuda

namespace sinter::detail {
void require_cuda() {
  if (!cuda::available()) SINTER_THROW(DeviceError, "[cuda] no CUDA device: ", cuda::unavailable_reason());
}
}  // namespace sinter::detail

// The warning handler (sinter/error.h): one per process, swapped under a lock.
#include <mutex>

#include "sinter/error.h"

namespace sinter {
namespace {
std::mutex g_mu;
WarningHandler g_handler;
}  // namespace

WarningHandler set_warning_handler(WarningHandler handler) {
  std::lock_guard<std::mutex> lock(g_mu);
  std::swap(g_handler, handler);
  return handler;
}

void warn(const std::string& message) {
  WarningHandler h;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    h = g_handler;
  }
  if (h) h(message);
}

}  // namespace sinter

// The tile unit's permission (amx.h).
#include "cpu/simd/amx.h"

#include <cstdlib>
#include <string>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace sinter::cpu::simd {

bool amx_ready() {
  static const bool ok = [] {
#if defined(__AMX_TILE__) && defined(__linux__)
    if (const char* e = std::getenv("SINTER_AMX"); e && std::string(e) == "0") return false;
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
#else
    return false;
#endif
  }();
  return ok;
}

}  // namespace sinter::cpu::simd

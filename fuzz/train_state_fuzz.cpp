// libFuzzer target for train_state.json (the commit record of a checkpoint): any byte string must
// parse into a valid state or raise sinter::Error naming the file (built with ASan + UBSan).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "train/internal.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto st = sinter::train::detail::parse_train_state(std::string(reinterpret_cast<const char*>(data), size), "fuzz/train_state.json");
    if (st.step < 0) std::abort();
    for (const auto& [plain, file] : st.files)
      if (plain.empty() || file.empty() || file.find('/') != std::string::npos) std::abort();  // only bare names reach a path
  } catch (const sinter::Error&) {
  }
  return 0;
}

// libFuzzer target for the safetensors parser: any byte string must parse or raise sinter::Error,
// never crash, hang or read out of bounds (built with ASan + UBSan).
#include <sinter/io.h>

#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto st = sinter::io::parse_safetensors(data, size, "fuzz");
    for (auto& [name, t] : st.tensors) (void)sinter::to_double_vector(t);  // touch every byte claimed
  } catch (const sinter::Error&) {
  }
  return 0;
}

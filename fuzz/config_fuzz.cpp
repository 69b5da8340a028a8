// libFuzzer target for config.json: any byte string must give a ModelConfig or raise sinter::Error
// naming the file, never crash, hang or allocate a model (built with ASan + UBSan).
#include <sinter/nn.h>

#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto cfg = sinter::nn::ModelConfig::from_json(std::string(reinterpret_cast<const char*>(data), size), "fuzz/config.json");
    (void)sinter::nn::ModelConfig::from_json(cfg.to_json(), "fuzz/round-trip.json");  // what it accepts, it writes readably
  } catch (const sinter::Error&) {
  }
  return 0;
}

// libFuzzer target: what a loader of an exported folder parses before anything runs: the manifest,
// the program model.so carries (its JSON and tables), and the weights matched against it. The
// input is the manifest, a 0 byte, the program's JSON, a 0 byte, then the weights file's bytes;
// the tables are the program's own sizes read from the weights' first bytes. Every input must end
// in a value or an IOError/Error, never a crash.
#include <cstdint>
#include <cstring>
#include <string>

#include "runtime/program.h"
#include "sinter/io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string all(reinterpret_cast<const char*>(data), size);
  const size_t a = all.find('\0'), b = a == std::string::npos ? std::string::npos : all.find('\0', a + 1);
  const std::string manifest = all.substr(0, a);
  const std::string program = a == std::string::npos ? "" : all.substr(a + 1, b == std::string::npos ? std::string::npos : b - a - 1);
  const std::string weights = b == std::string::npos ? "" : all.substr(b + 1);
  try {
    (void)sinter::runtime::parse_manifest(manifest, "manifest.json");
  } catch (const sinter::Error&) {
  }
  std::vector<int64_t> tables(weights.size() / 8);
  if (!tables.empty()) std::memcpy(tables.data(), weights.data(), tables.size() * 8);
  try {
    const sinter::runtime::Program p = sinter::runtime::parse_program(program, tables.data(), tables.size(), "model.so");
    const sinter::io::SafeTensors st = sinter::io::parse_safetensors(weights.data(), weights.size(), "weights.safetensors");
    (void)sinter::runtime::match_weights(p, st.tensors, "weights.safetensors");
  } catch (const sinter::Error&) {
  }
  return 0;
}

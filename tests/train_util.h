#pragma once
// Helpers shared by the training tests: scratch folders, small files, a micro model config.
#include <filesystem>
#include <fstream>
#include <string>

#include <sinter/nn.h>

namespace sinter::test {

// An empty folder under the system's temp directory (emptied if it existed).
inline std::string temp_dir(const std::string& name) {
  const std::filesystem::path d = std::filesystem::temp_directory_path() / ("sinter_nn_test_" + name);
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d.string();
}

inline void write_file(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }
inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// A two-layer model of hidden size 32: "gpt2", "llama" (GQA) or "llama-window" (sliding window 8).
inline nn::ModelConfig micro_config(const std::string& type) {
  const bool llama = type.rfind("llama", 0) == 0;
  nn::ModelConfig c = nn::ModelConfig::preset(llama ? "llama-tiny" : "tiny");
  c.hidden_size = 32, c.intermediate_size = 64, c.num_hidden_layers = 2, c.num_attention_heads = 4;
  c.num_key_value_heads = llama ? 2 : 4;
  c.max_position_embeddings = 128;
  if (type == "llama-window") c.sliding_window = 8;
  return c;
}

}  // namespace sinter::test

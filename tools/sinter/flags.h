#pragma once
// Each command-line option declared once, with the field of the library's options it sets: the
// library's errors name fields ("Options::resume"), and the command line shows them as the flags
// a user typed ("--resume").
#include <CLI/CLI.hpp>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

namespace sinter::cli {

inline std::map<std::string, std::string>& flag_names() {  // "Options::resume" -> "--resume"
  static std::map<std::string, std::string> m;
  return m;
}

// app->add_option(flag, var, help), recording that it sets `field` ("Options::steps").
template <class T> CLI::Option* option(CLI::App* app, const std::string& flag, const std::string& field, T& var, const std::string& help) {
  flag_names()[field] = flag;
  return app->add_option(flag, var, help);
}
inline CLI::Option* flag(CLI::App* app, const std::string& flag, const std::string& field, bool& var, const std::string& help) {
  flag_names()[field] = flag;
  return app->add_flag(flag, var, help);
}

// A library message in the command line's words: every field name recorded above becomes its flag.
inline std::string in_flags(std::string message) {
  std::vector<std::pair<std::string, std::string>> names(flag_names().begin(), flag_names().end());
  // Longest first: "SparsifyOptions::seq_len" before "Options::seq_len", which it contains.
  std::sort(names.begin(), names.end(), [](auto& a, auto& b) { return a.first.size() > b.first.size(); });
  for (const auto& [field, flag] : names)
    for (size_t at = message.find(field); at != std::string::npos; at = message.find(field, at + flag.size()))
      message.replace(at, field.size(), flag);
  return message;
}

}  // namespace sinter::cli

// Whole-step checkpoint commits. A save writes the step's files under names that carry the step
// ("model.step-00000500.safetensors", "optimizer.step-00000500.safetensors", the sharded
// "model.step-00000500.index.json" and its shards, "config.step-00000500.json"), each atomically;
// then train_state.json, which names them, replaces the previous one atomically: that rename is
// the commit. Only then do the plain names ("model.safetensors", "config.json", ...) become hard
// links to the new step's files (for tools and people that open them by name), and steps beyond
// the last `keep` go. Readers resolve files through train_state.json, so they see the last
// committed step whole: a save killed at any point leaves the previous step intact, and its own
// partial files are removed at the next start.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "io/atomic_file.h"
#include "sinter/io.h"
#include "train/internal.h"

namespace sinter::train::detail {

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

// The step a file of a step carries in its name ("model.step-00000500.safetensors"), or -1.
int64_t step_of(const std::string& name) {
  const size_t at = name.find(".step-");
  if (at == std::string::npos || name.size() < at + 14) return -1;
  const std::string digits = name.substr(at + 6, 8);
  if (digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
}

// train_state.json as committed, or null when there is none (or it cannot be read: the
// training loop reports that itself, naming the file).
json committed_state(const std::string& dir) {
  std::error_code ec;
  const std::string path = dir + "/train_state.json";
  if (!fs::exists(path, ec)) return nullptr;
  try {
    return json::parse(read_file(path));
  } catch (const std::exception&) {
    return nullptr;
  }
}

// Points `plain` at `target` (both in dir): a hard link renamed into place, a copy where the
// filesystem has no hard links.
void point_at(const std::string& dir, const std::string& plain, const std::string& target) {
  const std::string tmp = dir + "/" + plain + ".tmp." + std::to_string(::getpid()) + ".link";
  std::error_code ec;
  fs::remove(tmp, ec);
  fs::create_hard_link(dir + "/" + target, tmp, ec);
  if (ec) fs::copy_file(dir + "/" + target, tmp, fs::copy_options::overwrite_existing, ec);
  SINTER_CHECK_T(IOError, !ec, "[", dir, "/", plain, "] cannot point it at ", target, ": ", ec.message());
  fs::rename(tmp, dir + "/" + plain, ec);
  SINTER_CHECK_T(IOError, !ec, "[", dir, "/", plain, "] cannot replace it: ", ec.message());
}

}  // namespace

std::string step_name(const std::string& stem, int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, ".step-%08lld", (long long)step);
  return stem + buf;
}

std::string committed_path(const std::string& dir, const std::string& plain) {
  const json st = committed_state(dir);
  if (st.is_object() && st.contains("files") && st["files"].is_object() && st["files"].contains(plain) && st["files"][plain].is_string()) {
    const std::string path = dir + "/" + st["files"][plain].get<std::string>();
    std::error_code ec;
    SINTER_CHECK_T(IOError, fs::exists(path, ec), "[", dir, "/train_state.json] names ", path, " for ", plain, ", which is missing");
    return path;
  }
  return dir + "/" + plain;
}

std::string sharded_stem(const std::string& dir, const std::string& stem) {
  const std::string index = fs::path(committed_path(dir, stem + ".index.json")).filename().string();
  return index.substr(0, index.size() - std::string(".index.json").size());
}

void remove_uncommitted_steps(const std::string& dir, int keep) {
  const json st = committed_state(dir);
  const int64_t committed = st.is_object() && st.contains("step") && st["step"].is_number_integer() ? st["step"].get<int64_t>() : -1;
  std::error_code ec;
  std::set<int64_t> steps;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (const int64_t s = step_of(e.path().filename().string()); s >= 0) steps.insert(s);
  // The committed step and the (keep - 1) before it stay; later ones are a killed save's.
  std::set<int64_t> kept;
  for (auto it = steps.rbegin(); it != steps.rend() && int(kept.size()) < std::max(keep, 1); ++it)
    if (*it <= committed) kept.insert(*it);
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const int64_t s = step_of(e.path().filename().string());
    if (s >= 0 && !kept.count(s)) fs::remove(e.path(), ec);
  }
}

void commit_step(const std::string& dir, json state, const std::map<std::string, std::string>& files, int keep,
                 const std::vector<std::string>& stale) {
  state["files"] = files;
  io::atomic_write(dir + "/train_state.json", state.dump() + "\n");  // the commit
  std::error_code ec;
  for (const std::string& f : stale) fs::remove(dir + "/" + f, ec);
  for (const auto& [plain, target] : files) point_at(dir, plain, target);
  remove_uncommitted_steps(dir, keep);
}

}  // namespace sinter::train::detail

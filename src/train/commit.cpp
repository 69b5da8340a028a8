// Whole-step checkpoint commits. A save writes the step's files under names that carry the step
// ("model.step-00000500.safetensors", the optimizer's, the config's, a sharded index and its
// shards), each atomically; then train_state.json, which names them, replaces the previous one
// atomically: that rename is the commit. Then the plain names ("model.safetensors", ...) become
// hard links to the new files and steps beyond the last `keep` go. Readers resolve files through
// train_state.json: a save killed at any point leaves the previous step whole, and its partial
// files are removed at the next start.
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "core/format.h"
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

// train_state.json as committed, or nothing when there is none. A corrupt one is an error naming it.
std::optional<TrainState> committed_state(const std::string& dir) {
  std::error_code ec;
  const std::string path = dir + "/train_state.json";
  if (!fs::exists(path, ec)) return std::nullopt;
  return parse_train_state(read_file(path), path);
}

bool bare_file_name(const std::string& s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos && s.find('\0') == std::string::npos;
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

TrainState parse_train_state(const std::string& text, const std::string& path) {
  json st;
  try {
    st = json::parse(text);
  } catch (const json::exception& e) {
    SINTER_THROW(IOError, "[", path, "] corrupt training state: ", e.what());
  }
  auto bad = [&](const std::string& what) { SINTER_THROW(IOError, "[", path, "] corrupt training state: ", what); };
  if (!st.is_object()) bad("not a JSON object");
  TrainState s;
  if (!st.contains("step") || !st["step"].is_number_integer()) bad("\"step\" must be an integer");
  s.step = st["step"].is_number_unsigned() && st["step"].get<uint64_t>() > uint64_t(INT64_MAX) ? -1 : st["step"].get<int64_t>();
  if (s.step < 0) bad("\"step\" is " + st["step"].dump() + ", not a step count");
  if (st.contains("options")) {
    if (!st["options"].is_object()) bad("\"options\" must be an object");
    s.options = st["options"];
  }
  if (st.contains("data_fingerprint")) {
    if (!st["data_fingerprint"].is_string()) bad("\"data_fingerprint\" must be a string");
    s.data_fingerprint = st["data_fingerprint"].get<std::string>();
  }
  if (st.contains("files")) {
    if (!st["files"].is_object()) bad("\"files\" must be an object of file names");
    for (const auto& [plain, target] : st["files"].items()) {
      if (!bare_file_name(plain) || !target.is_string() || !bare_file_name(target.get<std::string>()))
        bad("\"files\": " + json(plain).dump() + " -> " + target.dump() + " is not a file name in the checkpoint's folder");
      s.files[plain] = target.get<std::string>();
    }
  }
  return s;
}

std::string step_name(const std::string& stem, int64_t step) {
  return stem + ".step-" + zero_pad(step, 8);
}

std::string committed_path(const std::string& dir, const std::string& plain) {
  const std::optional<TrainState> st = committed_state(dir);
  if (st && st->files.count(plain)) {
    const std::string path = dir + "/" + st->files.at(plain);
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
  int64_t committed = -1;  // none, or unreadable (a run that replaces the checkpoint): no step is kept
  try {
    if (const std::optional<TrainState> st = committed_state(dir)) committed = st->step;
  } catch (const IOError&) {
  }
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

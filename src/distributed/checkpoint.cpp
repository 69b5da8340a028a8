// Sharded checkpoints. Every rank writes the pieces it owns (one copy of each: replicas on other
// coordinates skip) to its own safetensors file; rank 0 then writes the index (each tensor's
// global shape, dtype and where its pieces live) atomically, last. File names carry a generation,
// so a save interrupted before its index leaves the previous checkpoint whole; files of older
// generations are removed once the new index is in place. Loading reads, for each piece a rank
// wants, the overlapping parts of whatever pieces were written: any mesh to any mesh.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <cstring>
#include <sstream>

#include "core/format.h"
#include "sinter/autograd.h"
#include "sinter/dist.h"
#include "sinter/io.h"

namespace sinter::dist {

namespace {
using json = nlohmann::json;
namespace fs = std::filesystem;

struct Box {
  Shape offsets, lengths;
};

// Where this rank's piece sits in the global tensor, and whether this rank is the one that writes it.
Box piece_box(const DTensor& t, bool* owner) {
  Box b{Shape(t.shape().size(), 0), t.shape()};
  *owner = true;
  const DeviceMesh& m = t.mesh();
  for (int64_t i = 0; i < m.ndim(); ++i) {
    const Placement& p = t.placements()[size_t(i)];
    if (p.is_shard()) {
      const auto [s, l] = shard_range(b.lengths[size_t(p.dim)], m.size(i), m.coordinate(i));
      b.offsets[size_t(p.dim)] += s;
      b.lengths[size_t(p.dim)] = l;
    } else if (m.coordinate(i) != 0) {
      *owner = false;  // a replica (or a partial term: checkpoints hold whole values, redistribute first)
    }
    SINTER_CHECK_T(DistError, !p.is_partial(), "[save_sharded] a Partial tensor holds terms of a sum; redistribute it first");
  }
  return b;
}

std::vector<std::string> all_gather_strings(const std::string& mine) {
  auto w = world();
  Tensor len = all_gather(full({1}, double(mine.size()), DType::i64), *w, 0, std::vector<int64_t>(size_t(w->size()), 1));
  std::vector<int64_t> sizes(len.data<int64_t>(), len.data<int64_t>() + w->size());
  Tensor bytes = Tensor::empty({int64_t(mine.size())}, DType::u8);
  if (!mine.empty()) std::memcpy(bytes.data_ptr(), mine.data(), mine.size());
  Tensor all = all_gather(bytes, *w, 0, sizes);
  std::vector<std::string> out;
  int64_t off = 0;
  for (int64_t s : sizes) {
    out.emplace_back(s ? reinterpret_cast<const char*>(all.data<uint8_t>()) + off : "", size_t(s));
    off += s;
  }
  return out;
}

json read_index(const std::string& dir, const std::string& stem) {
  const std::string path = dir + "/" + stem + ".index.json";
  std::ifstream f(path);
  SINTER_CHECK_T(IOError, f.good(), "[", path, "] sharded checkpoint index not found");
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    json j = json::parse(ss.str());
    SINTER_CHECK_T(IOError, j.value("format", "") == "sinter-sharded" && j.contains("tensors"), "[", path,
                   "] is not a Sinter sharded checkpoint index");
    return j;
  } catch (const json::exception& e) {
    SINTER_THROW(IOError, "[", path, "] corrupt index: ", e.what());
  }
}

// Copies the part of `chunk` (at `chunk_box` in the global tensor) that overlaps `target` (at `box`).
void copy_overlap(const Tensor& chunk, const Box& chunk_box, Tensor& target, const Box& box) {
  Tensor src = chunk, dst = target;
  for (size_t d = 0; d < box.offsets.size(); ++d) {
    const int64_t lo = std::max(box.offsets[d], chunk_box.offsets[d]);
    const int64_t hi = std::min(box.offsets[d] + box.lengths[d], chunk_box.offsets[d] + chunk_box.lengths[d]);
    if (hi <= lo) return;
    src = src.narrow(int64_t(d), lo - chunk_box.offsets[d], hi - lo);
    dst = dst.narrow(int64_t(d), lo - box.offsets[d], hi - lo);
  }
  dst.copy_(src);
}

// Fills `target` (this rank's piece at `box`) from the pieces the index lists for `name`.
void fill_from_index(const std::string& dir, const json& index, const std::string& name, Tensor& target, const Box& box,
                     std::map<std::string, io::SafeTensors>& files) {
  const std::string where = dir + "/" + name;
  SINTER_CHECK_T(IOError, index["tensors"].contains(name), "[", dir, "] the sharded checkpoint has no tensor '", name, "'");
  const json& e = index["tensors"][name];
  const Shape global = e.at("shape").get<std::vector<int64_t>>();
  SINTER_CHECK_T(IOError, int64_t(global.size()) == int64_t(box.offsets.size()), "[", where, "] has shape ", global,
                 ", the model wants rank ", box.offsets.size());
  int64_t covered = 0;
  NoGradGuard g;
  for (const json& c : e.at("chunks")) {
    const std::string file = c.at("file").get<std::string>();
    auto it = files.find(file);
    if (it == files.end()) it = files.emplace(file, io::load_safetensors(dir + "/" + file)).first;
    auto t = it->second.tensors.find(name);
    SINTER_CHECK_T(IOError, t != it->second.tensors.end(), "[", dir, "/", file, "] lacks '", name, "' that the index puts there");
    Box cb{c.at("offsets").get<std::vector<int64_t>>(), c.at("shape").get<std::vector<int64_t>>()};
    SINTER_CHECK_T(IOError, t->second.shape() == cb.lengths, "[", dir, "/", file, "] '", name, "' is ", t->second.shape(),
                   ", the index says ", cb.lengths);
    int64_t overlap = 1;
    for (size_t d = 0; d < box.offsets.size(); ++d)
      overlap *= std::max<int64_t>(0, std::min(box.offsets[d] + box.lengths[d], cb.offsets[d] + cb.lengths[d]) -
                                          std::max(box.offsets[d], cb.offsets[d]));
    if (overlap == 0) continue;
    copy_overlap(t->second.dtype() == target.dtype() ? t->second : t->second.to(target.dtype()), cb, target, box);
    covered += overlap;
  }
  SINTER_CHECK_T(IOError, covered == box.lengths.numel(), "[", where, "] the checkpoint's pieces cover ", covered, " of the ",
                 box.lengths.numel(), " elements this rank needs");
}

}  // namespace

bool has_sharded(const std::string& dir, const std::string& stem) {
  std::error_code ec;
  return fs::exists(dir + "/" + stem + ".index.json", ec);
}

void save_sharded(const std::string& dir, const std::string& stem, const std::map<std::string, DTensor>& tensors,
                  const std::map<std::string, Tensor>& replicated) {
  auto w = world();
  // One generation name for every rank of this save.
  std::random_device rd;
  const int64_t gen = broadcast(full({1}, double(rd() & 0x7fffffff), DType::i64), *w, 0).item<int64_t>();
  const std::string file = stem + "-" + hex(uint64_t(gen), 8) + ".shard-" + zero_pad(w->rank(), 5) + "-of-" + zero_pad(w->size(), 5) +
                           ".safetensors";

  std::map<std::string, Tensor> mine;
  json chunks = json::object();
  auto add = [&](const std::string& name, const Tensor& local, const Box& b, const Shape& global) {
    mine[name] = local.contiguous();
    chunks[name] = {{"offsets", b.offsets}, {"shape", b.lengths}, {"global", global}, {"dtype", dtype_name(local.dtype())}};
  };
  for (auto& [name, t] : tensors) {
    bool owner = false;
    Box b = piece_box(t, &owner);
    if (owner) add(name, t.to_local().detach(), b, t.shape());
  }
  if (w->rank() == 0)
    for (auto& [name, t] : replicated) add(name, t.detach(), Box{Shape(t.shape().size(), 0), t.shape()}, t.shape());
  std::error_code ec;
  fs::create_directories(dir, ec);
  SINTER_CHECK_T(IOError, !ec, "[", dir, "] cannot create the folder: ", ec.message());
  io::save_safetensors(dir + "/" + file, mine, {{"format", "sinter-sharded"}});

  const std::vector<std::string> all = all_gather_strings(json{{"file", file}, {"chunks", chunks}}.dump());
  if (w->rank() == 0) {
    json index{{"format", "sinter-sharded"}, {"world", w->size()}, {"tensors", json::object()}};
    std::set<std::string> files;
    for (const std::string& s : all) {
      const json r = json::parse(s);
      files.insert(r["file"].get<std::string>());
      for (auto& [name, c] : r["chunks"].items()) {
        json& e = index["tensors"][name];
        e["shape"] = c["global"], e["dtype"] = c["dtype"];
        e["chunks"].push_back({{"file", r["file"]}, {"offsets", c["offsets"]}, {"shape", c["shape"]}});
      }
    }
    io::atomic_write(dir + "/" + stem + ".index.json", index.dump(1) + "\n");
    // The new index is in place: pieces of older saves go.
    const std::string prefix = stem + "-";
    for (auto& entry : fs::directory_iterator(dir, ec)) {
      const std::string n = entry.path().filename().string();
      if (n.rfind(prefix, 0) == 0 && n.find(".shard-") != std::string::npos && !files.count(n)) fs::remove(entry.path(), ec);
    }
  }
  w->barrier().wait();
}

std::map<std::string, Tensor> load_sharded(const std::string& dir, const std::string& stem) {
  const json index = read_index(dir, stem);
  std::map<std::string, io::SafeTensors> files;
  std::map<std::string, Tensor> out;
  for (auto& [name, e] : index["tensors"].items()) {
    const Shape global = e.at("shape").get<std::vector<int64_t>>();
    Tensor t = Tensor::empty(global, dtype_from_name(e.at("dtype").get<std::string>()));
    fill_from_index(dir, index, name, t, Box{Shape(global.size(), 0), global}, files);
    out[name] = t;
  }
  return out;
}

void load_sharded_into(const std::string& dir, const std::string& stem, const std::map<std::string, DTensor>& targets,
                       const std::map<std::string, Tensor>& whole) {
  const json index = read_index(dir, stem);
  std::map<std::string, io::SafeTensors> files;
  for (auto& [name, t] : whole) {
    SINTER_CHECK_T(IOError, index["tensors"].contains(name), "[", dir, "] the sharded checkpoint has no tensor '", name, "'");
    const Shape global = index["tensors"][name].at("shape").get<std::vector<int64_t>>();
    SINTER_CHECK_T(IOError, global == t.shape(), "[", dir, "/", name, "] was saved with shape ", global, ", the model has ", t.shape());
    Tensor target = t;
    fill_from_index(dir, index, name, target, Box{Shape(t.shape().size(), 0), t.shape()}, files);
  }
  for (auto& [name, t] : targets) {
    SINTER_CHECK_T(IOError, index["tensors"].contains(name), "[", dir, "] the sharded checkpoint has no tensor '", name, "'");
    const Shape global = index["tensors"][name].at("shape").get<std::vector<int64_t>>();
    SINTER_CHECK_T(IOError, global == t.shape(), "[", dir, "/", name, "] was saved with shape ", global, ", the model has ", t.shape());
    bool owner = false;
    Tensor local = t.to_local();
    fill_from_index(dir, index, name, local, piece_box(t, &owner), files);
  }
}

}  // namespace sinter::dist

// Autotuning a user kernel: a key bucket (the key sizes rounded up to powers of two) is timed once
// per process, or read from its record on disk (per kernel hash and CPU), and the fastest config
// kept. A record that does not parse is ignored and written again.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "compiler/user_kernel.h"
#include "cpu/cpu.h"

namespace sinter::compiler {
namespace {

std::vector<int64_t> key_bucket(const KernelDef& d, std::span<const TensorMeta> in) {
  std::vector<int64_t> key;
  if (d.key) key = d.key(in);
  else
    for (const TensorMeta& m : in)
      for (int64_t s : m.shape) key.push_back(s);
  for (int64_t& s : key) {
    int64_t p = 1;
    while (p < s) p *= 2;
    s = p;
  }
  return key;
}

std::string record_path(const UserKernel& k) {
  return cache_dir() + "/tune-" + k.def.name + "-" + content_hash(k.hash + "\n" + cpu_features()) + ".txt";
}

// "64,1024 1" per line: a bucket and its config. Any line that does not parse voids the file.
std::map<std::vector<int64_t>, int> read_records(const UserKernel& k) {
  std::map<std::vector<int64_t>, int> out;
  std::ifstream f(record_path(k));
  for (std::string line; std::getline(f, line);) {
    std::istringstream ls(line);
    std::string sizes;
    int config = -1;
    if (!(ls >> sizes >> config) || config < 0 || config >= int(k.def.configs.size())) return {};
    std::vector<int64_t> bucket;
    std::istringstream ss(sizes == "-" ? std::string() : sizes);
    for (std::string s; std::getline(ss, s, ',');) {
      try {
        bucket.push_back(std::stoll(s));
      } catch (const std::exception&) {
        return {};
      }
    }
    out[bucket] = config;
  }
  return out;
}

void write_records(const UserKernel& k) {
  std::map<std::vector<int64_t>, int> all = read_records(k);  // another process's choices stay
  for (const auto& [bucket, c] : k.tuned) all[bucket] = c.config;
  std::ostringstream os;
  for (const auto& [bucket, config] : all) {
    for (size_t i = 0; i < bucket.size(); ++i) os << (i ? "," : "") << bucket[i];
    os << (bucket.empty() ? "-" : "") << " " << config << "\n";
  }
  std::error_code ec;
  std::filesystem::create_directories(cache_dir(), ec);
  write_atomic(record_path(k), os.str());
}

// Times every config on the call's buffers; the inputs it writes are cloned for the trials.
TunedChoice tune(const UserKernel& k, const std::vector<int64_t>& bucket, const UserKernelCall& call, UserKernelFn fn) {
  std::vector<char*> p = call.p;
  std::vector<Tensor> clones;
  for (const Tensor& w : call.written) {
    clones.push_back(cpu::contiguous_as(w, w.dtype()).clone());
    char* real = static_cast<char*>(w.data_ptr());
    for (char*& slot : p)
      if (slot == real) slot = static_cast<char*>(clones.back().data_ptr());
  }
  TunedChoice c{bucket, 0, {}};
  for (int cfg = 0; cfg < int(k.def.configs.size()); ++cfg) {
    fn(p.data(), call.q.data(), cfg);  // warm
    double best = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      fn(p.data(), call.q.data(), cfg);
      best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    c.ms.push_back(best);
    if (best < c.ms[size_t(c.config)]) c.config = cfg;
  }
  return c;
}

}  // namespace

int choose_config(UserKernel& k, std::span<const TensorMeta> in, UserKernelCall& call, UserKernelFn fn) {
  if (k.def.configs.size() == 1) return 0;
  const std::vector<int64_t> bucket = key_bucket(k.def, in);
  {
    std::lock_guard lock(k.mu);
    if (!k.tuned_loaded) {
      for (const auto& [b, config] : read_records(k)) k.tuned[b] = TunedChoice{b, config, {}};
      k.tuned_loaded = true;
    }
    if (auto it = k.tuned.find(bucket); it != k.tuned.end()) return it->second.config;
  }
  // (Written inputs are cloned, not mutated: tuning the same bucket twice at once is only wasted time.)
  TunedChoice c = tune(k, bucket, call, fn);
  std::lock_guard lock(k.mu);
  k.tuned[bucket] = c;
  write_records(k);
  return c.config;
}

}  // namespace sinter::compiler

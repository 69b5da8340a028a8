// AOT export and the runtime: exported against in-process (eager logits, `sinter generate`'s
// greedy tokens), the runtime's dynamic dims, sessions on threads, and bad files. The runtime is
// driven through its C ABI (libsinter_rt), in this process beside libsinter.
#include <gtest/gtest.h>
#include <sinter/sinter_rt.h>
#include <unistd.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "runtime/sha256.h"
#include "sinter/sinter.h"
#include "sinter/train.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace sinter;

namespace {

std::string temp(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("sinter_aot_test_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(d);
  return d.string();
}

// A checkpoint trained for a few steps from a preset.
std::string checkpoint(const std::string& preset) {
  static std::map<std::string, std::string> made;
  if (made.count(preset)) return made[preset];
  train::Options o;
  o.preset = preset, o.out_dir = temp("ckpt_" + preset), o.steps = 3, o.batch = 4, o.seq_len = 32, o.quiet = true;
  o.val_every = 1000, o.val_batches = 1;
  train::run(o);
  return made[preset] = o.out_dir;
}

std::string exported(const std::string& ckpt, const std::string& name, const std::string& dynamic = "") {
  static std::map<std::string, std::string> made;
  const std::string key = ckpt + "|" + dynamic;
  if (made.count(key)) return made[key];
  train::ExportOptions o;
  o.checkpoint = ckpt, o.out_dir = temp("export_" + name), o.dynamic = dynamic;
  train::export_model(o);
  return made[key] = o.out_dir;
}

struct Model {
  sinter_rt_model* m;
  explicit Model(const std::string& dir) : m(sinter_rt_load(dir.c_str())) {}
  ~Model() { sinter_rt_model_free(m); }
};
struct Session {
  sinter_rt_session* s;
  explicit Session(const Model& m) : s(sinter_rt_session_new(m.m)) {}
  ~Session() { sinter_rt_session_free(s); }
};

// Runs `graph` on (1, n) tokens; the logits, or the error.
std::vector<float> run(sinter_rt_session* s, const char* graph, const std::vector<int64_t>& tokens, std::string* error = nullptr) {
  sinter_rt_tensor in = {(void*)tokens.data(), SINTER_RT_I64, 2, {1, int64_t(tokens.size())}, 0};
  sinter_rt_tensor out = {};
  if (sinter_rt_run(s, graph, &in, 1, &out, 1) != 0) {
    if (error) *error = sinter_rt_last_error();
    else ADD_FAILURE() << sinter_rt_last_error();
    return {};
  }
  int64_t n = 1;
  for (int d = 0; d < out.rank; ++d) n *= out.shape[d];
  const float* p = static_cast<const float*>(out.data);
  return std::vector<float>(p, p + n);
}

int64_t argmax_last(const std::vector<float>& logits, int64_t V) {
  const float* row = logits.data() + logits.size() - size_t(V);
  return std::max_element(row, row + V) - row;
}

// Greedy ids through the runtime: prefill, then decode (no window slide: callers stay short).
std::vector<int64_t> greedy(sinter_rt_session* s, std::vector<int64_t> ids, int64_t max_new, int64_t V) {
  int64_t next = argmax_last(run(s, "prefill", ids), V);
  for (int64_t i = 0; i < max_new; ++i) {
    ids.push_back(next);
    if (i + 1 < max_new) next = argmax_last(run(s, "decode", {next}), V);
  }
  return ids;
}

std::string shell(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  pclose(p);
  return out;
}

}  // namespace

TEST(Aot, ExportedForwardEqualsEagerAtEverySizeAsked) {
  const std::string ck = checkpoint("tiny");
  const std::string dir = exported(ck, "tiny_128", "seq=1..128");
  Model m(dir);
  ASSERT_NE(m.m, nullptr) << sinter_rt_last_error();
  Session s(m);
  auto model = train::load_model(ck);
  model->eval();
  NoGradGuard g;
  manual_seed(1);
  for (int64_t n : {1, 37, 128}) {
    SCOPED_TRACE(n);
    const Tensor tokens = randint(0, 256, {1, n});
    const std::vector<float> ours = run(s.s, "forward", tokens.to_vector<int64_t>());
    const std::vector<float> eager = model->forward(tokens).to_vector<float>();
    ASSERT_EQ(ours.size(), eager.size());
    double worst = 0;
    for (size_t i = 0; i < ours.size(); ++i) worst = std::max(worst, std::abs(double(ours[i]) - eager[i]));
    EXPECT_LE(worst, 1e-5);
  }
}

TEST(Aot, AFunctionsWeightsAndStateRunAsInProcessAndResetPutsTheStateBack) {
  manual_seed(3);
  Tensor w = randn({4, 3}), count = zeros({2});
  const TensorFn fn = [&](const std::vector<Tensor>& in) {
    count.add_(1.0);  // state: the graph writes it
    return std::vector<Tensor>{gelu(matmul(in[0], w.t())) + sum(count)};
  };
  const std::string dir = temp("fn");
  aot::Options o;
  o.names = {{"w", w}, {"count", count}};
  o.graph = {.name = "step", .input_names = {"x"}, .output_names = {"y"}, .dynamic = {{.name = "n", .input = 0, .dim = 0, .min = 1, .max = 5}}};
  const aot::Exported r = aot::export_graph(fn, {zeros({2, 3})}, o, dir);
  EXPECT_EQ(r.weights, 1);
  EXPECT_EQ(r.state, 1);
  EXPECT_EQ(r.sizes_traced, 5);
  Model m(dir);
  ASSERT_NE(m.m, nullptr) << sinter_rt_last_error();
  Session s(m);
  const Tensor start = count.clone();
  for (int round = 0; round < 2; ++round) {
    count.copy_(start);
    for (int64_t n : {3, 1, 5}) {
      const Tensor x = randn({n, 3});
      const Tensor want = fn({x})[0];
      sinter_rt_tensor in = {x.data_ptr(), SINTER_RT_F32, 2, {n, 3}, 0};
      std::vector<float> buf(size_t(n * 4));
      sinter_rt_tensor out = {buf.data(), SINTER_RT_F32, 0, {}, buf.size() * sizeof(float)};  // the caller's buffer
      ASSERT_EQ(sinter_rt_run(s.s, "step", &in, 1, &out, 1), 0) << sinter_rt_last_error();
      EXPECT_EQ(out.rank, 2);
      EXPECT_EQ(out.shape[0], n);
      EXPECT_EQ(buf, want.to_vector<float>());
    }
    ASSERT_EQ(sinter_rt_session_reset(s.s), 0);
  }
  std::vector<float> small(1);
  const Tensor x = randn({2, 3});
  sinter_rt_tensor in = {x.data_ptr(), SINTER_RT_F32, 2, {2, 3}, 0}, out = {small.data(), SINTER_RT_F32, 0, {}, sizeof(float)};
  EXPECT_NE(sinter_rt_run(s.s, "step", &in, 1, &out, 1), 0);
  EXPECT_NE(std::string(sinter_rt_last_error()).find("output 'y' needs 32 bytes"), std::string::npos) << sinter_rt_last_error();
}

// An export's units are compiled once into the cache: a second export of the same graph (new
// weights) compiles none of them, a corrupt cached object is compiled again, and each model.so
// runs its own weights.
TEST(Aot, AReExportTakesItsUnitsFromTheCacheAndRebuildsACorruptOne) {
  const std::string cache = temp("unit_cache");
  test::ScopedEnv env("SINTER_CACHE_DIR", cache);
  manual_seed(4);
  Tensor w = randn({4, 3});
  const TensorFn fn = [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{gelu(matmul(in[0], w.t()))}; };
  aot::Options o;
  o.names = {{"w", w}};
  o.graph = {.name = "f", .input_names = {"x"}, .output_names = {"y"}, .dynamic = {{.name = "n", .input = 0, .dim = 0, .min = 1, .max = 3}}};
  const auto objects = [&] {
    std::map<std::string, fs::file_time_type> m;
    for (const auto& e : fs::directory_iterator(cache))
      if (e.path().extension() == ".o") m[e.path().string()] = e.last_write_time();
    return m;
  };
  const auto runs_as_in_process = [&](const std::string& dir) {
    Model m(dir);
    ASSERT_NE(m.m, nullptr) << sinter_rt_last_error();
    Session s(m);
    const Tensor x = randn({2, 3});
    std::vector<float> buf(8);
    sinter_rt_tensor in = {x.data_ptr(), SINTER_RT_F32, 2, {2, 3}, 0}, out = {buf.data(), SINTER_RT_F32, 0, {}, buf.size() * sizeof(float)};
    ASSERT_EQ(sinter_rt_run(s.s, "f", &in, 1, &out, 1), 0) << sinter_rt_last_error();
    EXPECT_EQ(buf, fn({x})[0].to_vector<float>());
  };
  const std::string a = temp("cached_a"), b = temp("cached_b"), c = temp("cached_c");
  aot::export_graph(fn, {zeros({2, 3})}, o, a);
  const auto first = objects();
  ASSERT_FALSE(first.empty());
  runs_as_in_process(a);
  w.copy_(randn({4, 3}));
  aot::export_graph(fn, {zeros({2, 3})}, o, b);
  EXPECT_EQ(objects(), first) << "the second export compiled a unit again";
  runs_as_in_process(b);
  const std::string corrupt = first.begin()->first;
  fs::resize_file(corrupt, fs::file_size(corrupt) / 2);
  const auto broken = objects();
  aot::export_graph(fn, {zeros({2, 3})}, o, c);
  const auto third = objects();
  EXPECT_EQ(third.size(), first.size());
  for (const auto& [path, when] : broken) EXPECT_EQ(third.at(path) != when, path == corrupt) << path;
  runs_as_in_process(c);
}

// A user kernel with two configs (the autotuner picks one per key bucket) and a pointwise output
// whose consumers fuse into its store(): exported, it runs from model.so as in process.
TEST(Aot, GraphsWithUserKernelsRunTheirKernelsFromTheExportedLibrary) {
  const OpDef& op = find_op("aot_test_scaled_square") ? *find_op("aot_test_scaled_square") : register_kernel_def({
      .name = "aot_test_scaled_square",
      .source = R"(template <class Cfg> void kernel(sinter::In<float> x, auto& y) {
  for (int64_t i = 0; i < y.numel(); ++i) y.store(i, x[i] * x[i] * float(Cfg::K));
})",
      .inputs = {DType::f32},
      .outputs = {DType::f32},
      .shape = [](std::span<const TensorMeta> in, const Attrs&) { return std::vector<TensorMeta>{in[0]}; },
      .configs = {{{"K", 2}}, {{"K", 2}}},
      .pointwise = {true},
  });
  manual_seed(4);
  Tensor w = randn({6, 5});
  const TensorFn fn = [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{relu(call1(op, {matmul(in[0], w)}) * 0.5 - 1.0)};
  };
  const std::string dir = temp("user_kernel");
  aot::Options o;
  o.names = {{"w", w}};
  o.graph = {.name = "f", .input_names = {}, .output_names = {}, .dynamic = {{.name = "n", .input = 0, .dim = 0, .min = 1, .max = 9}}};
  aot::export_graph(fn, {zeros({4, 6})}, o, dir);
  Model m(dir);
  ASSERT_NE(m.m, nullptr) << sinter_rt_last_error();
  Session s(m);
  for (int64_t n : {1, 4, 9}) {
    const Tensor x = randn({n, 6});
    sinter_rt_tensor in = {x.data_ptr(), SINTER_RT_F32, 2, {n, 6}, 0}, out = {};
    ASSERT_EQ(sinter_rt_run(s.s, "f", &in, 1, &out, 1), 0) << sinter_rt_last_error();
    const std::vector<float> want = fn({x})[0].to_vector<float>();
    ASSERT_EQ(out.shape[0] * out.shape[1], int64_t(want.size()));
    EXPECT_EQ(std::vector<float>(static_cast<float*>(out.data), static_cast<float*>(out.data) + want.size()), want) << n;
  }
}

TEST(Aot, AGraphBreakIsAnErrorNamingTheOp) {
  const TensorFn fn = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] * sum(in[0]).item<float>()}; };
  EXPECT_TRUE(test::throws_naming("export", [&] { aot::export_graph(fn, {ones({3})}, {}, temp("break")); }));
  try {
    aot::export_graph(fn, {ones({3})}, {}, temp("break"));
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("graph break at item"), std::string::npos) << e.what();
  }
}

TEST(Aot, DynamicDimsOutsideTheirRangeWrongDtypeAndRankAreErrorsNamingTheInput) {
  const std::string dir = exported(checkpoint("tiny"), "tiny_128", "seq=1..128");
  Model m(dir);
  Session s(m);
  std::string err;
  EXPECT_TRUE(run(s.s, "forward", std::vector<int64_t>(129, 1), &err).empty());
  EXPECT_NE(err.find("input 'tokens' dim 1 is 129, expected seq in 1..128"), std::string::npos) << err;
  std::vector<float> f(4);
  sinter_rt_tensor in = {f.data(), SINTER_RT_F32, 2, {1, 4}, 0}, out = {};
  EXPECT_NE(sinter_rt_run(s.s, "forward", &in, 1, &out, 1), 0);
  EXPECT_NE(std::string(sinter_rt_last_error()).find("input 'tokens' must be i64, got f32"), std::string::npos) << sinter_rt_last_error();
  int64_t ids[4] = {1, 2, 3, 4};
  in = {ids, SINTER_RT_I64, 1, {4}, 0};
  EXPECT_NE(sinter_rt_run(s.s, "forward", &in, 1, &out, 1), 0);
  EXPECT_NE(std::string(sinter_rt_last_error()).find("input 'tokens' must have 2 dims, got 1"), std::string::npos) << sinter_rt_last_error();
  sinter_rt_tensor_info info;
  ASSERT_EQ(sinter_rt_input_info(m.m, "forward", 0, &info), 0);
  EXPECT_EQ(std::string(info.name), "tokens");
  EXPECT_EQ(info.min[1], 1);
  EXPECT_EQ(info.max[1], 128);
  EXPECT_EQ(std::string(info.dim_name[1]), "seq");
}

TEST(Aot, FourSessionsOnFourThreadsEachEqualTheirSingleThreadedRun) {
  const std::string dir = exported(checkpoint("tiny"), "tiny_full");
  Model m(dir);
  ASSERT_NE(m.m, nullptr) << sinter_rt_last_error();
  const std::vector<std::vector<int64_t>> prompts = {{84, 104, 101, 32}, {65}, {10, 10, 81, 58, 32}, {119, 104, 121}};
  std::vector<std::vector<int64_t>> alone, together(prompts.size());
  for (const auto& p : prompts) {
    Session s(m);
    alone.push_back(greedy(s.s, p, 24, 256));
  }
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i)
    threads.emplace_back([&, i] {
      Session s(m);
      for (int round = 0; round < 3; ++round) {
        sinter_rt_session_reset(s.s);
        together[i] = greedy(s.s, prompts[i], 24, 256);
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(together, alone);
}

// The C example against `sinter generate --temperature 0`, with no compiler on PATH.
class AotGenerate : public ::testing::TestWithParam<std::string> {};

TEST_P(AotGenerate, TheCExampleGreedyTokensEqualSinterGenerate) {
  std::string ck;
  const std::string which = GetParam();
  if (which == "tiny" || which == "llama-tiny") ck = checkpoint(which);
  else if (which == "hf-llama") ck = std::string(SINTER_TEST_DATA) + "/hf/llama-f32";
  else {  // "sparse-f32", "sparse-i8": the tiny checkpoint pruned to 2:4
    train::SparsifyOptions s;
    s.checkpoint = checkpoint("tiny"), s.out_dir = temp(which), s.finetune_steps = 0, s.values = which.substr(7), s.quiet = true;
    s.batch = 4, s.seq_len = 32, s.val_batches = 1;
    train::sparsify(s);
    ck = s.out_dir;
  }
  const std::string dir = exported(ck, which);
  const std::string ids = "84,104,101,32,113";
  const std::string want = shell(std::string(SINTER_CLI) + " generate --checkpoint " + ck + " --ids " + ids +
                                 " --max-new-tokens 40 --temperature 0 2>/dev/null");
  const std::string empty = temp("empty_path");
  fs::create_directories(empty);
  const std::string got = shell("env PATH=" + empty + " " + SINTER_AOT_GENERATE + " " + dir + " --ids " + ids + " --max-new-tokens 40 2>&1");
  auto line = [](const std::string& s) { return s.substr(0, s.find_last_not_of('\n') + 1); };
  EXPECT_EQ(line(got), line(want));
  EXPECT_GT(std::count(got.begin(), got.end(), ','), 40);
  if (which != "tiny" && which != "sparse-i8") return;  // the ctypes script: the same loop, in Python
  const std::string py = shell("python3 " + std::string(SINTER_SOURCE_DIR) + "/examples/aot/generate.py " + dir + " --ids " + ids +
                               " --max-new-tokens 40 --lib " + SINTER_RT_LIBRARY + " 2>&1");
  EXPECT_EQ(line(py), line(want));
}

INSTANTIATE_TEST_SUITE_P(Models, AotGenerate, ::testing::Values("tiny", "llama-tiny", "hf-llama", "sparse-f32", "sparse-i8"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

TEST(Aot, TheRuntimeAndTheExampleLinkNothingButTheirRuntimes) {
  const std::string needed = shell("readelf -d " + std::string(SINTER_AOT_GENERATE) + " " + SINTER_RT_LIBRARY + " | grep NEEDED");
  std::stringstream lines(needed);
  for (std::string l; std::getline(lines, l);) {
    const size_t a = l.find('['), b = l.find(']');
    ASSERT_NE(a, std::string::npos);
    const std::string lib = l.substr(a + 1, b - a - 1);
    const bool ok = lib.rfind("libsinter_rt.so", 0) == 0 || lib.rfind("libdnnl.so", 0) == 0 || lib.rfind("libgomp.so", 0) == 0 ||
                    lib.rfind("libomp.so", 0) == 0 ||  // clang builds: LLVM's OpenMP runtime
                    lib.rfind("libstdc++.so", 0) == 0 || lib.rfind("libm.so", 0) == 0 || lib.rfind("libgcc_s.so", 0) == 0 ||
                    lib.rfind("libc.so", 0) == 0 || lib.rfind("ld-linux", 0) == 0;
    EXPECT_TRUE(ok) << "links " << lib;
  }
  EXPECT_NE(needed.find("libsinter_rt.so"), std::string::npos);
  const std::string symbols = shell("nm -D --defined-only " + std::string(SINTER_RT_LIBRARY));
  std::stringstream ss(symbols);
  int count = 0;
  for (std::string l; std::getline(ss, l);) {
    const std::string name = l.substr(l.rfind(' ') + 1);
    if (name == "SINTER_RT_1") continue;
    ++count;
    EXPECT_EQ(name.rfind("sinter_rt_", 0), 0u) << "exports " << name;
  }
  EXPECT_GE(count, 10);
}

TEST(Aot, LoadingAndRunningStartNoProcess) {
  const std::string dir = exported(checkpoint("tiny"), "tiny_128", "seq=1..128");
  const std::string self = shell(std::string(SINTER_AOT_NO_PROCESS) + " --selftest 2>&1; echo \"exit $?\"");
  EXPECT_NE(self.find("started a process: popen\nexit 3"), std::string::npos) << self;  // the interposition catches a start
  const std::string run = shell(std::string(SINTER_AOT_NO_PROCESS) + " " + dir + " 2>&1; echo \"exit $?\"");
  EXPECT_EQ(run, "ok\nexit 0\n");
}

// Each bad folder: a copy of a good one with one thing wrong; loading fails naming what.
class AotBadFiles : public ::testing::Test {
 protected:
  std::string dir;
  void SetUp() override {
    const std::string good = exported(checkpoint("tiny"), "tiny_128", "seq=1..128");
    dir = temp(::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::copy(good, dir);
  }
  nlohmann::json manifest() { return nlohmann::json::parse(std::ifstream(dir + "/manifest.json")); }
  void write_manifest(const nlohmann::json& j) { std::ofstream(dir + "/manifest.json") << j.dump(); }
  void rehash(const char* file) {
    auto j = manifest();
    j["files"][file]["sha256"] = runtime::sha256_file(dir + "/" + file);
    write_manifest(j);
  }
  void truncate(const std::string& file, double keep) { fs::resize_file(dir + "/" + file, uintmax_t(double(fs::file_size(dir + "/" + file)) * keep)); }
  std::string load_error() {
    sinter_rt_model* m = sinter_rt_load(dir.c_str());
    if (m) {
      sinter_rt_model_free(m);
      return "(loaded)";
    }
    return sinter_rt_last_error();
  }
};

TEST_F(AotBadFiles, AGoodCopyLoads) { EXPECT_EQ(load_error(), "(loaded)"); }

TEST_F(AotBadFiles, ATruncatedModelSoFailsItsHash) {
  truncate("model.so", 0.5);
  EXPECT_NE(load_error().find("model.so] does not match the manifest"), std::string::npos) << load_error();
  rehash("model.so");  // with the manifest made to agree, the loader refuses the file itself
  EXPECT_NE(load_error().find("model.so] is truncated"), std::string::npos) << load_error();
  std::ofstream(dir + "/model.so") << "not an ELF file";
  rehash("model.so");
  EXPECT_NE(load_error().find("model.so] is not an x86-64 ELF shared object"), std::string::npos) << load_error();
}

TEST_F(AotBadFiles, AManifestWithAnotherAbiVersionOrHashIsRefused) {
  auto j = manifest();
  j["abi_version"] = 99;
  write_manifest(j);
  EXPECT_NE(load_error().find("exported for runtime ABI version 99; this runtime (libsinter_rt) reads version 1"), std::string::npos)
      << load_error();
  j["abi_version"] = 1;
  j["files"]["weights.safetensors"]["sha256"] = std::string(64, '0');
  write_manifest(j);
  EXPECT_NE(load_error().find("weights.safetensors] does not match the manifest"), std::string::npos) << load_error();
  std::ofstream(dir + "/manifest.json") << "{\"format\": \"sinter-aot\", ";
  EXPECT_NE(load_error().find("manifest.json] is not valid JSON"), std::string::npos) << load_error();
}

TEST_F(AotBadFiles, WeightsOfAnotherModelAMissingFileAndATruncatedTensorAreNamed) {
  // another model: same names, other shapes (a wider tiny model)
  nn::ModelConfig c = nn::ModelConfig::preset("tiny");
  c.hidden_size = 64, c.intermediate_size = 256;
  nn::GPT other(c);
  std::map<std::string, Tensor> tensors;
  for (auto& [name, t] : other.named_parameters()) tensors[name] = *t;
  for (int i = 0; i < c.num_hidden_layers; ++i)
    for (const char* kv : {"k", "v"})
      tensors["cache." + std::to_string(i) + "." + kv] = zeros({1, c.num_key_value_heads, c.max_position_embeddings, c.head_dim()});
  tensors["cache.pos"] = zeros({}, DType::i64);
  io::save_safetensors(dir + "/weights.safetensors", tensors);
  EXPECT_NE(load_error().find("weights.safetensors] does not match the manifest"), std::string::npos) << load_error();
  rehash("weights.safetensors");
  EXPECT_NE(load_error().find("(weights of another model?)"), std::string::npos) << load_error();
  fs::remove(dir + "/weights.safetensors");
  EXPECT_NE(load_error().find("weights.safetensors] is missing"), std::string::npos) << load_error();
  fs::copy(exported(checkpoint("tiny"), "tiny_128", "seq=1..128") + "/weights.safetensors", dir + "/weights.safetensors");
  truncate("weights.safetensors", 0.6);
  rehash("weights.safetensors");
  const std::string e = load_error();
  EXPECT_NE(e.find("weights.safetensors]"), std::string::npos) << e;
  EXPECT_EQ(e.find("(loaded)"), std::string::npos);
}

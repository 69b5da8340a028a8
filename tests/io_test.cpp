#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "test_util.h"

using namespace sinter;
using sinter::test::throws_naming;

namespace {

std::string temp_dir() {
  static std::string dir = [] {
    std::string t = (std::filesystem::temp_directory_path() / "sinter_io_test_XXXXXX").string();
    return std::string(::mkdtemp(t.data()));
  }();
  return dir;
}

std::string write_raw(const std::string& name, const std::string& bytes) {
  const std::string path = temp_dir() + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string with_header(const std::string& json, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = json.size();
  std::memcpy(out.data(), &n, 8);
  return out + json + data;
}

}  // namespace

TEST(SafeTensors, RoundTripsEveryDType) {
  manual_seed(2);
  std::map<std::string, Tensor> ts;
  for (int i = 0; i < kNumDTypes; ++i) {
    const DType dt = DType(i);
    Tensor t = dt == DType::boolean ? lt(rand({3, 5}), full({}, 0.5)) : (randn({3, 5}) * 10.0).to(dt);
    ts[std::string("t_") + dtype_name(dt)] = t;
  }
  ts["empty"] = zeros({0, 4});
  ts["scalar"] = full({}, 2.5);
  ts["strided"] = arange(0, 12, 1, DType::f32).reshape({3, 4}).t();
  const std::string path = temp_dir() + "/all.safetensors";
  io::save_safetensors(path, ts, {{"format", "pt"}});
  auto loaded = io::load_safetensors(path);
  EXPECT_EQ(loaded.metadata.at("format"), "pt");
  ASSERT_EQ(loaded.tensors.size(), ts.size());
  for (auto& [name, t] : ts) {
    const Tensor& l = loaded.tensors.at(name);
    EXPECT_EQ(l.shape(), t.shape()) << name;
    EXPECT_EQ(l.dtype(), t.dtype()) << name;
    EXPECT_EQ(to_double_vector(l), to_double_vector(t)) << name;
  }
  // Loaded tensors are writable copies-on-write: changing one never touches the file.
  NoGradGuard g;
  loaded.tensors.at("t_f32").fill_(0.0);
  EXPECT_EQ(to_double_vector(io::load_safetensors(path).tensors.at("t_f32")), to_double_vector(ts.at("t_f32")));
}

TEST(SafeTensors, ReadsTheReferenceLayout) {
  // Built by hand from the format description: {"a": F32 [2] at [0, 8]}, then 1.0, 2.0.
  const float v[2] = {1.0f, 2.0f};
  std::string data(reinterpret_cast<const char*>(v), 8);
  const std::string file = with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", data);
  auto st = io::parse_safetensors(file.data(), file.size(), "mem");
  EXPECT_EQ(st.tensors.at("a").to_vector<float>(), (std::vector<float>{1, 2}));
}

TEST(SafeTensors, CorruptFilesRaiseErrorsNamingTheFileAndTheProblem) {
  const std::string good = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string data(8, '\0');
  struct Bad { std::string name, bytes, problem; };
  std::string absurd(8, '\xff');
  const std::vector<Bad> cases{
      {"empty", "", "truncated"},
      {"short", "abc", "truncated"},
      {"absurd_header", absurd + "{}", "exceeds"},
      {"header_past_end", with_header(good, data).substr(0, 30), "runs past the end"},
      {"bad_json", with_header(R"({"a":{"dtype":"F32",)", ""), "not valid JSON"},
      {"not_object", with_header("[1,2]", ""), "must be a JSON object"},
      {"unknown_dtype", with_header(R"({"a":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", data), "unsupported dtype"},
      {"negative_dim", with_header(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data), "non-negative"},
      {"offsets_out_of_range", with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,800]}})", data), "out of range"},
      {"offsets_reversed", with_header(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", data), "begin after end"},
      {"byte_count_mismatch", with_header(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data), "needs 12"},
      {"overlap", with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", data), "overlap"},
      {"gap", with_header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", data), "gap"},
      {"trailing_bytes", with_header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", data), "cover"},
      {"missing_offsets", with_header(R"({"a":{"dtype":"F32","shape":[2]}})", data), "data_offsets"},
      {"bad_metadata", with_header(R"({"__metadata__":{"k":3}})", ""), "not a string"},
      {"bad_bool", with_header(R"({"a":{"dtype":"BOOL","shape":[8],"data_offsets":[0,8]}})", std::string(8, '\x07')), "BOOL"},
      {"overflowing_shape", with_header(R"({"a":{"dtype":"F32","shape":[281474976710655,281474976710655],"data_offsets":[0,8]}})", data), "overflows"},
  };
  for (const Bad& b : cases) {
    const std::string path = write_raw(b.name + ".safetensors", b.bytes);
    try {
      io::load_safetensors(path);
      ADD_FAILURE() << b.name << ": no error";
    } catch (const IOError& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind("[" + path + "]", 0), 0u) << b.name << ": " << msg;
      EXPECT_NE(msg.find(b.problem), std::string::npos) << b.name << ": " << msg;
    }
  }
  EXPECT_TRUE(throws_naming(temp_dir() + "/missing.safetensors", [] { io::load_safetensors(temp_dir() + "/missing.safetensors"); }));
}

TEST(SafeTensors, AFailedSaveLeavesThePreviousFileIntact) {
  const std::string path = temp_dir() + "/keep.safetensors";
  io::save_safetensors(path, {{"w", ones({4})}});
  // Symbolic tensors have no data: the save fails after the temporary file was opened.
  EXPECT_THROW(io::save_safetensors(path, {{"a", ones({2})}, {"w", Tensor::symbolic({4})}}), IOError);
  EXPECT_EQ(io::load_safetensors(path).tensors.at("w").to_vector<float>(), std::vector<float>(4, 1.0f));
  for (auto& e : std::filesystem::directory_iterator(temp_dir()))
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << "leftover " << e.path();
}

TEST(SafeTensors, LoadedTensorsOutliveAReplacedFile) {
  const std::string path = temp_dir() + "/replace.safetensors";
  io::save_safetensors(path, {{"w", full({3}, 1.0)}});
  auto first = io::load_safetensors(path);
  io::save_safetensors(path, {{"w", full({3}, 2.0)}});
  EXPECT_EQ(first.tensors.at("w").to_vector<float>(), std::vector<float>(3, 1.0f));
  EXPECT_EQ(io::load_safetensors(path).tensors.at("w").to_vector<float>(), std::vector<float>(3, 2.0f));
}

TEST(SafeTensors, AlignedSavesStartEveryTensorOnTheBoundaryAndLoadTheSameValues) {
  const std::string path = (std::filesystem::temp_directory_path() / ("sinter_aligned_" + std::to_string(::getpid()) + ".safetensors")).string();
  const std::map<std::string, Tensor> tensors = {{"a", randn({3})}, {"b", randint(0, 9, {5}, DType::i64)}, {"c", randn({7, 3}).to(DType::bf16)}};
  io::save_safetensors(path, tensors, {}, 64);
  const io::SafeTensors st = io::load_safetensors(path);
  for (const auto& [name, t] : tensors) {
    const Tensor& got = st.tensors.at(name);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(got.data_ptr()) % 64, 0u) << name;
    EXPECT_TRUE(test::bitwise_equal(got, t)) << name;
  }
  EXPECT_EQ(st.tensors.size(), 6u);  // a, b, c and a filler after each (no size is a multiple of 64)
  EXPECT_THROW(io::save_safetensors(path, tensors, {}, 48), IOError);
  std::filesystem::remove(path);
}

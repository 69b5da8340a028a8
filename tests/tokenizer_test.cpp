// Byte-level BPE against Hugging Face `tokenizers` (tests/data/bpe, from scripts/bpe_reference.py):
// the same ids for every reference string, decoding back to its bytes, and clear errors.
#include <sinter/tokenizer.h>
#include <sinter/train.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "test_util.h"
#include "train_util.h"

using namespace sinter;
using sinter::test::temp_dir;
using sinter::test::write_file;

namespace {
const std::string kDir = std::string(SINTER_TEST_DATA) + "/bpe";

nlohmann::json reference() {
  std::ifstream f(kDir + "/reference.json");
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str());
}
}  // namespace

TEST(Tokenizer, ByteLevelBpeEncodesAsHuggingFaceTokenizersDoes) {
  const text::Tokenizer tok = text::Tokenizer::from_file(kDir + "/tokenizer.json");
  const nlohmann::json ref = reference();
  EXPECT_EQ(tok.vocab_size(), ref["vocab_size"].get<int64_t>());
  int cases = 0;
  for (const auto& c : ref["cases"]) {
    const std::string s = c["text"].get<std::string>();
    EXPECT_EQ(tok.encode(s), c["ids"].get<std::vector<int64_t>>()) << "'" << s << "'";
    EXPECT_EQ(tok.decode(c["ids"].get<std::vector<int64_t>>()), c["decoded"].get<std::string>()) << "'" << s << "'";
    ++cases;
  }
  EXPECT_EQ(cases, 14);
}

TEST(Tokenizer, AnyBytesRoundTrip) {
  const text::Tokenizer bpe = text::Tokenizer::from_file(kDir + "/tokenizer.json"), bytes = text::Tokenizer::bytes();
  std::mt19937 rng(7);
  for (int i = 0; i < 200; ++i) {
    std::string s(size_t(rng() % 40), '\0');
    static constexpr char kAlphabet[] = " aZ'9\xc3\xa9\n\t.";
    for (char& ch : s) ch = char(i % 2 ? rng() % 256 : kAlphabet[rng() % (sizeof kAlphabet - 1)]);  // raw bytes, invalid UTF-8 included
    EXPECT_EQ(bpe.decode(bpe.encode(s)), s);
    EXPECT_EQ(bytes.decode(bytes.encode(s)), s);
    EXPECT_EQ(bytes.encode(s).size(), s.size());
  }
  EXPECT_EQ(bytes.vocab_size(), 256);
  EXPECT_TRUE(test::throws_naming("tokenizer", [&] { bpe.decode({bpe.vocab_size()}); }));
}

TEST(Tokenizer, AFileItCannotReadIsAnErrorNamingItAndWhy) {
  const std::string dir = temp_dir("tokenizer_bad");
  const auto fails_with = [&](const std::string& name, const std::string& content, const std::string& why) {
    const std::string path = dir + "/" + name;
    write_file(path, content);
    try {
      text::Tokenizer::from_file(path);
      return ::testing::AssertionFailure() << name << " was accepted";
    } catch (const IOError& e) {
      const std::string m = e.what();
      if (m.find(path) == std::string::npos || m.find(why) == std::string::npos) return ::testing::AssertionFailure() << m;
      return ::testing::AssertionSuccess();
    }
  };
  EXPECT_TRUE(fails_with("notjson.json", "{\"model\": ", "is not JSON"));
  EXPECT_TRUE(fails_with("unigram.json", R"({"model": {"type": "Unigram", "vocab": []}})", "model is Unigram"));
  EXPECT_TRUE(fails_with("metaspace.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "pre_tokenizer": {"type": "Metaspace"}})",
                         "pre_tokenizer is Metaspace"));
  EXPECT_TRUE(fails_with("badmerge.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [[1, 2]]}, "pre_tokenizer": {"type": "ByteLevel"}})",
                         "is not a tokenizer.json as transformers writes it"));
  EXPECT_TRUE(fails_with("hugeid.json", R"({"model": {"type": "BPE", "vocab": {"a": 1000000000000}, "merges": []}, "pre_tokenizer": {"type": "ByteLevel"}})",
                         "has no valid id"));
  EXPECT_TRUE(fails_with("nomerges.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "pre_tokenizer": {"type": "ByteLevel"}})",
                         "has no 'merges'"));
  try {
    text::Tokenizer::from_file(dir + "/missing.json");
    ADD_FAILURE() << "a missing file was accepted";
  } catch (const IOError& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/missing.json"), std::string::npos) << e.what();
  }
}

// `sinter generate` on a Hugging Face folder with a tokenizer.json: the prompt is encoded by it,
// the greedy tokens are the library's, and the text printed is their bytes.
TEST(Tokenizer, GenerateReadsTheCheckpointsTokenizer) {
  const std::string dir = temp_dir("tokenizer_cli");
  nn::ModelConfig c = test::micro_config("gpt2");
  c.vocab_size = 420;
  {
    nn::GPT model(c);
    model.init_weights(4);
    model.save_pretrained(dir + "/model");
  }
  std::filesystem::copy_file(kDir + "/tokenizer.json", dir + "/model/tokenizer.json", std::filesystem::copy_options::overwrite_existing);
  const std::string cmd = std::string(SINTER_CLI) + " generate --checkpoint " + dir + "/model --prompt 'Hello world' --temperature 0 " +
                          "--max-new-tokens 6 --format json > " + dir + "/out.json 2> " + dir + "/err.txt";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << test::read_file(dir + "/err.txt");
  const nlohmann::json j = nlohmann::json::parse(test::read_file(dir + "/out.json"));
  const text::Tokenizer tok = text::Tokenizer::from_file(kDir + "/tokenizer.json");
  const std::vector<int64_t> prompt = tok.encode("Hello world");
  EXPECT_EQ(j["prompt_ids"].get<std::vector<int64_t>>(), prompt);
  auto model = nn::GPT::from_pretrained(dir + "/model");
  train::Sampling greedy;
  greedy.temperature = 0;
  const std::vector<int64_t> all = train::generate(*model, tensor<int64_t>(prompt), 6, greedy).to_vector<int64_t>();
  const std::vector<int64_t> ids = j["ids"].get<std::vector<int64_t>>();
  EXPECT_EQ(ids, std::vector<int64_t>(all.begin() + long(prompt.size()), all.end()));
  EXPECT_EQ(j["text"].get<std::string>(), tok.decode(ids));
  // Training and sparsify read byte-level data: a BPE model is refused rather than fed byte ids.
  for (const std::string& cmd : {"train --init " + dir + "/model --steps 1 --out " + dir + "/ft", "sparsify " + dir + "/model --out " + dir + "/sp"}) {
    EXPECT_NE(std::system((std::string(SINTER_CLI) + " " + cmd + " > /dev/null 2> " + dir + "/err3.txt").c_str()), 0) << cmd;
    EXPECT_NE(test::read_file(dir + "/err3.txt").find("has a tokenizer.json"), std::string::npos) << test::read_file(dir + "/err3.txt");
  }
  // Without a tokenizer.json a model whose vocabulary is not bytes is refused, naming the way out.
  std::filesystem::remove(dir + "/model/tokenizer.json");
  EXPECT_NE(std::system((std::string(SINTER_CLI) + " generate --checkpoint " + dir + "/model --prompt Hi 2> " + dir + "/err2.txt").c_str()), 0);
  EXPECT_NE(test::read_file(dir + "/err2.txt").find("no tokenizer.json; drive it with --ids"), std::string::npos);
}

// Training faults. A corrupt train_state.json (the commit record) is refused naming the file and
// the key. A step whose loss or gradients are not finite: `--on-nan stop` ends the run keeping the last
// checkpoint; `--on-nan skip` drops exactly that step's update and goes on. The NaN comes from the
// fault hook Options::inject_nan_steps (the listed steps read as non-finite, as an overflow would).
#include <cmath>
#include <cstdlib>
#include <cstring>

#include <sinter/train.h>

#include "test_util.h"
#include "train/internal.h"
#include "train_util.h"

using namespace sinter;
using test::micro_config, test::read_file, test::temp_dir, test::write_file;

namespace {

train::Options options(const std::string& name) {
  const std::string dir = temp_dir("nan_" + name);
  write_file(dir + "/config.json", micro_config("gpt2").to_json());
  train::Options o;
  o.config_path = dir + "/config.json", o.steps = 5, o.batch = 2, o.seq_len = 16, o.warmup = 1;
  o.val_every = 100, o.val_batches = 1, o.save_every = 100, o.quiet = true, o.on_nan = "skip";
  o.out_dir = dir + "/out";
  return o;
}

// The committed model and optimizer state of `step` in two folders are equal bit for bit.
void expect_same_state(const std::string& a, int a_step, const std::string& b, int b_step) {
  for (const char* stem : {"model", "optimizer"}) {
    char fa[64], fb[64];
    std::snprintf(fa, sizeof fa, "/%s.step-%08d.safetensors", stem, a_step);
    std::snprintf(fb, sizeof fb, "/%s.step-%08d.safetensors", stem, b_step);
    auto x = io::load_safetensors(a + fa), y = io::load_safetensors(b + fb);
    ASSERT_EQ(x.tensors.size(), y.tensors.size()) << stem;
    for (auto& [name, t] : x.tensors) {
      const Tensor& u = y.tensors.at(name);
      ASSERT_EQ(t.shape(), u.shape()) << name;
      EXPECT_EQ(0, std::memcmp(t.data_ptr(), u.data_ptr(), size_t(t.numel() * t.element_size()))) << stem << ": " << name;
    }
  }
}

}  // namespace

TEST(OnNan, SkipDropsExactlyThatStepsUpdateAndGoesOn) {
  for (const bool compiled : {false, true}) {
    SCOPED_TRACE(compiled ? "compiled" : "eager");
    // Reference: the same run stopped after step 4 (the schedule is the same: steps = 5).
    train::Options ref = options(compiled ? "ref_c" : "ref");
    ref.compile = compiled, ref.stop_after = 4;
    EXPECT_EQ(train::run(ref).step, 4);
    // Step 5 goes wrong: its update is skipped, so step 5's checkpoint holds step 4's weights and
    // optimizer state (AdamW's step count included).
    train::Options o = options(compiled ? "last_c" : "last");
    o.compile = compiled, o.inject_nan_steps = {5};
    const train::Result r = train::run(o);
    EXPECT_EQ(r.step, 5);
    EXPECT_EQ(r.skipped, std::vector<int64_t>{5});
    EXPECT_EQ(r.losses.size(), 4u);
    expect_same_state(ref.out_dir, 4, o.out_dir, 5);
  }
}

TEST(OnNan, ARunWithASkippedStepInTheMiddleFinishesFiniteAndLogsTheGap) {
  train::Options o = options("middle");
  o.steps = 6, o.log_every = 1, o.inject_nan_steps = {3};
  const train::Result r = train::run(o);
  EXPECT_EQ(r.skipped, std::vector<int64_t>{3});
  ASSERT_EQ(r.losses.size(), 5u);
  for (double l : r.losses) EXPECT_TRUE(std::isfinite(l));
  EXPECT_NE(read_file(o.out_dir + "/log.csv").find("\n3,,"), std::string::npos) << read_file(o.out_dir + "/log.csv");
  auto model = train::load_model(o.out_dir);  // finite weights were saved (a NaN checkpoint is refused)
  EXPECT_EQ(model->num_parameters() > 0, true);
}

TEST(OnNan, TooManySkipsInARowStopAndStopModeStopsAtTheStep) {
  train::Options o = options("many");
  o.steps = 10, o.max_skips = 3;
  o.inject_nan_steps = {2, 3, 4, 5, 6, 7, 8, 9};
  try {
    train::run(o);
    ADD_FAILURE() << "ran on through 8 non-finite steps";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("step 5: 4 steps in a row"), std::string::npos) << e.what();
  }
  train::Options s = options("stop");
  s.on_nan = "stop", s.inject_nan_steps = {3};
  try {
    train::run(s);
    ADD_FAILURE() << "--on-nan stop went on past a NaN step";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("[train] step 3: the loss is nan"), std::string::npos) << e.what();
  }
  s.on_nan = "sometimes";
  EXPECT_TRUE(test::throws_naming("train", [&] { train::run(s); }));
}

TEST(TrainState, EveryCorruptKeyIsRefusedNamingTheFileAndTheKey) {
  const std::string path = "ckpt/train_state.json";
  const auto st = train::detail::parse_train_state(
      R"({"step": 7, "files": {"model.safetensors": "model.step-00000007.safetensors"}, "options": {"batch": 2},
          "data_fingerprint": "12:ab"})", path);
  EXPECT_EQ(st.step, 7);
  EXPECT_EQ(st.files.at("model.safetensors"), "model.step-00000007.safetensors");
  EXPECT_EQ(st.options["batch"], 2);
  EXPECT_EQ(st.data_fingerprint, "12:ab");
  const std::pair<const char*, const char*> bad[] = {
      {"[1, 2]", "not a JSON object"},
      {R"({"step": "7"})", "\"step\" must be an integer"},
      {R"({"step": -50})", "\"step\" is -50"},
      {R"({"step": 18446744073709551615})", "\"step\" is 18446744073709551615"},
      {R"({"step": 1, "options": 3})", "\"options\" must be an object"},
      {R"({"step": 1, "data_fingerprint": 3})", "\"data_fingerprint\" must be a string"},
      {R"({"step": 1, "files": []})", "\"files\" must be an object"},
      {R"({"step": 1, "files": {"model.safetensors": "../../etc/passwd"}})", "\"../../etc/passwd\" is not a file name"},
      {R"({"step": 1, "files": {"model.safetensors": 5}})", "-> 5 is not a file name"},
      {R"({"step": 1, "files": {"..": "model.safetensors"}})", "\"..\" -> \"model.safetensors\" is not"},
      {R"({"step": 1,)", "corrupt training state: [json.exception.parse_error"},
  };
  for (const auto& [text, want] : bad) {
    try {
      train::detail::parse_train_state(text, path);
      ADD_FAILURE() << "accepted " << text;
    } catch (const IOError& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind("[" + path + "] corrupt training state: ", 0), 0u) << msg;
      EXPECT_NE(msg.find(want), std::string::npos) << text << " -> " << msg;
    }
  }
}

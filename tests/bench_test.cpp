// The benchmark harness behind `sinter bench`: rows and ratios, the PyTorch merge, JSON, the
// markdown section it rewrites. (Speed itself is measured by the benchmarks, not tested.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "../bench/harness.h"
#include "test_util.h"

using namespace sinter;
namespace fs = std::filesystem;

namespace {
std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
std::string scratch(const std::string& name) {
  const std::string d = (fs::temp_directory_path() / ("sinter_bench_test_" + std::to_string(::getpid()))).string();
  fs::create_directories(d);
  return d + "/" + name;
}
}  // namespace

TEST(BenchReport, RatiosArePeerOverOursAndPeersMergeByCase) {
  bench::Report r;
  r.add("linear f32 M=1", {2.0, 2.5}, "oneDNN", {3.0, 3.1}, "note");
  r.ours_only("train f32 step", {100.0, 110.0}, "tok/s");
  r.ours_only("not timed by the peer", {1.0, 1.0});
  EXPECT_EQ(r.merge_peer("PyTorch 9", {{"train f32 step", {150.0, 160.0}}, {"linear f32 M=1", {4.0, 4.0}}, {"unknown", {1, 1}}}), 2);
  ASSERT_EQ(r.rows().size(), 4u);  // the placeholder of "train" was replaced, linear got a second row
  EXPECT_EQ(r.rows()[0].peer, "oneDNN");
  EXPECT_DOUBLE_EQ(r.rows()[0].ratio(), 1.5);
  EXPECT_EQ(r.rows()[1].peer, "PyTorch 9");
  EXPECT_DOUBLE_EQ(r.rows()[1].ratio(), 2.0);
  EXPECT_EQ(r.rows()[2].case_name, "train f32 step");
  EXPECT_DOUBLE_EQ(r.rows()[2].ratio(), 1.5);
  EXPECT_TRUE(r.rows()[3].peer.empty());
  const auto j = nlohmann::json::parse(r.json());
  ASSERT_EQ(j.size(), 4u);
  for (const char* k : {"case", "ours_ms", "peer", "peer_ms", "ratio"}) EXPECT_TRUE(j[0].contains(k)) << k;
  EXPECT_DOUBLE_EQ(j[2]["ratio"].get<double>(), 1.5);
  EXPECT_TRUE(j[3]["ratio"].is_null());
  EXPECT_NE(r.svg_chart("t").find("<svg"), std::string::npos);
}

// With the suite's case count given, the last case prints "[bench] N/N cases ... ETA 0s" on
// stderr (not a terminal here, so the lines between are at most one per 30 s); a case timed
// against two peers counts once, and without expect() nothing is printed.
TEST(BenchReport, ProgressCountsCasesOnceAndEndsAtTheTotal) {
  bench::Report quiet;
  testing::internal::CaptureStderr();
  quiet.add("a", {1, 1}, "p", {1, 1});
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");

  bench::Report r;
  r.expect(3);
  testing::internal::CaptureStderr();
  r.add("linear f32 M=1", {2.0, 2.5}, "oneDNN, plain", {3.0, 3.1});
  r.add("linear f32 M=1", {2.0, 2.5}, "oneDNN, prepacked", {3.5, 3.6});
  r.ours_only("train f32 step", {100.0, 110.0});
  const std::string before_last = testing::internal::GetCapturedStderr();
  EXPECT_EQ(before_last.find("3/3"), std::string::npos) << before_last;
  testing::internal::CaptureStderr();
  r.add("sparse f32 M=1", {1.0, 1.0}, "oneDNN", {1.8, 1.8});
  const std::string last = testing::internal::GetCapturedStderr();
  EXPECT_NE(last.find("[bench] 3/3 cases"), std::string::npos) << last;
  EXPECT_NE(last.find("ETA 0s\n"), std::string::npos) << last;
}

TEST(BenchReport, MarkdownSectionIsReplacedAndTheRestKept) {
  const std::string md = scratch("BENCH.md");
  {
    std::ofstream(md) << "# title\n\n<!-- sinter bench ops -->\nold table\n<!-- /sinter bench ops -->\n\ntail text\n";
  }
  bench::update_markdown_section(md, "ops", "new table\n");
  bench::update_markdown_section(md, "linear", "linear table\n");
  const std::string text = slurp(md);
  EXPECT_EQ(text.find("old table"), std::string::npos);
  EXPECT_NE(text.find("<!-- sinter bench ops -->\nnew table\n<!-- /sinter bench ops -->"), std::string::npos) << text;
  EXPECT_NE(text.find("tail text"), std::string::npos);
  EXPECT_NE(text.find("<!-- sinter bench linear -->\nlinear table\n<!-- /sinter bench linear -->"), std::string::npos);
}

TEST(BenchCli, MergesThePeerScriptsRowsIntoTheJson) {
  // A stand-in for python3 + bench/torch_peer.py that times one case of the ops suite, once as its
  // own peer and once as a peer a row names (as the sweep's torch.compile rows do).
  const std::string fake = scratch("fake_python.sh"), out = scratch("ops.json");
  {
    std::ofstream f(fake);
    f << "#!/bin/sh\nif [ \"$1\" = \"-c\" ]; then exit 0; fi\nout=\"\"\n"
         "while [ $# -gt 0 ]; do if [ \"$1\" = \"--json\" ]; then out=\"$2\"; fi; shift; done\n"
         "echo '{\"peer\": \"FakeTorch 0.1\", \"threads\": 1, \"rows\": [{\"case\": \"overhead add 16 f32\", "
         "\"best_ms\": 0.5, \"median_ms\": 0.6}, {\"case\": \"overhead add 16 f32\", \"best_ms\": 1.5, \"median_ms\": 1.6, "
         "\"peer\": \"FakeCompile 0.1\"}]}' > \"$out\"\n";
  }
  fs::permissions(fake, fs::perms::owner_all);
  const std::string cmd = std::string(SINTER_CLI) + " bench ops --threads 1 --python " + fake + " --json " + out + " > " +
                          scratch("log.txt") + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(scratch("log.txt"));
  const auto j = nlohmann::json::parse(slurp(out));
  int fake_rows = 0, compile_rows = 0, copy_rows = 0;
  for (auto& row : j) {
    if (row["peer"] == "FakeTorch 0.1") {
      ++fake_rows;
      EXPECT_EQ(row["case"], "overhead add 16 f32");
      EXPECT_NEAR(row["ratio"].get<double>(), 0.5 / row["ours_ms"].get<double>(), 1e-9);
    }
    if (row["peer"] == "FakeCompile 0.1") {
      ++compile_rows;
      EXPECT_EQ(row["case"], "overhead add 16 f32");
      EXPECT_NEAR(row["ratio"].get<double>(), 1.5 / row["ours_ms"].get<double>(), 1e-9);
    }
    if (row["peer"] == "memcpy, same bytes") ++copy_rows;
  }
  EXPECT_EQ(fake_rows, 1);
  EXPECT_EQ(compile_rows, 1);
  EXPECT_EQ(copy_rows, 7);  // 4 elementwise + softmax + layer_norm + rms_norm
  EXPECT_NE(slurp(scratch("log.txt")).find("the 5 lowest ratios:"), std::string::npos);
}

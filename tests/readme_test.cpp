// The README's C++ example, compiled and run as written, so the front page cannot rot (the full
// tour of the API is examples/tour/tour.cpp, run as the test example_tour).
#include <cmath>
#include <filesystem>
#include <fstream>

#include "test_util.h"

using namespace sinter;

TEST(Readme, ExampleRunsAsWritten) {
  const auto dir = std::filesystem::temp_directory_path() / "sinter_readme_test";
  std::filesystem::create_directories(dir);
  std::filesystem::current_path(dir);

  // README:begin
  manual_seed(0);                                   // Philox: same values on any thread count
  Tensor x = randn({4, 8});                         // f32 by default
  Tensor w = (randn({16, 8}) * 0.1).requires_grad_(), b = zeros({16}).requires_grad_();
  Tensor loss = mean(gelu(linear(x, w, b)));        // gelu(x w^T + b)
  loss.backward();                                  // w.grad(), b.grad()

  nn::GPT gpt(nn::ModelConfig::preset("llama-tiny"));          // RMSNorm, RoPE, SwiGLU, GQA
  optim::AdamW opt(gpt.named_parameters(), 3e-3);
  Tensor ids = data::encode("hello world, hello sinter");      // bytes as token ids
  Tensor inp = ids.narrow(0, 0, 24).reshape({1, 24}), tgt = ids.narrow(0, 1, 24).reshape({1, 24});
  Tensor lm_loss = cross_entropy(gpt.forward(inp).reshape({-1, 256}), tgt.reshape({-1}));
  lm_loss.backward();
  opt.step();
  gpt.save_pretrained("llama-hf");                             // a folder transformers loads

  SemiStructuredSparse sw = to_sparse_semi_structured(prune_2_4(randn({16, 8})));
  Tensor ys = linear(x, sw, b, "gelu");                        // == gelu(linear(x, sw.to_dense(), b))

  CompiledFunction cf = compile([](const std::vector<Tensor>& in) {  // trace, fuse, generate C++, g++
    return std::vector<Tensor>{gelu(in[0] * 1.5 + in[1], true) * sigmoid(in[0])};
  });
  Tensor yc = cf({x, randn({8})})[0];                          // one fused kernel, bit for bit eager's

  // Errors name the op and show the shapes: matmul(randn({2, 3}), randn({4, 5})) throws
  //   sinter::ShapeError: [matmul] inner dimensions differ: a(2, 3) b(4, 5)
  // README:end

  EXPECT_EQ(w.grad().shape(), w.shape());
  EXPECT_TRUE(b.grad().defined());
  EXPECT_NEAR(lm_loss.item<float>(), std::log(256.0), 0.5);
  EXPECT_EQ(opt.steps(), 1);
  EXPECT_TRUE(nn::GPT::from_pretrained("llama-hf")->config().llama());
  EXPECT_TRUE(test::all_close(ys, gelu(linear(x, sw.to_dense(), b)), 1e-5, 1e-5));
  EXPECT_EQ(yc.shape(), Shape({4, 8}));
  try {
    matmul(randn({2, 3}), randn({4, 5}));
    ADD_FAILURE() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_STREQ(e.what(), "[matmul] inner dimensions differ: a(2, 3) b(4, 5)");
  }
}

// The README shows the block above line for line (so what this test runs is what a reader copies).
TEST(Readme, ShowsTheExampleThisTestRuns) {
  auto lines = [](const std::string& path) {
    std::ifstream f(path);
    EXPECT_TRUE(f.good()) << path;
    std::vector<std::string> out;
    for (std::string l; std::getline(f, l);) out.push_back(l);
    return out;
  };
  auto trim = [](std::string l) {
    l.erase(0, std::min(l.find_first_not_of(' '), l.size()));
    return l;
  };
  std::vector<std::string> ours;
  bool in = false;
  for (const std::string& l : lines(__FILE__)) {
    if (trim(l) == "// README:end") break;
    if (in) ours.push_back(trim(l));
    if (trim(l) == "// README:begin") in = true;
  }
  std::vector<std::string> readme;
  in = false;
  for (const std::string& l : lines(std::string(SINTER_SOURCE_DIR) + "/README.md")) {
    if (in && l == "```") break;
    if (in) readme.push_back(trim(l));
    if (l == "```cpp") in = true;
  }
  const std::vector<std::string> head{"#include <sinter/sinter.h>", "using namespace sinter;", ""};
  ASSERT_GE(readme.size(), head.size());
  EXPECT_EQ(std::vector<std::string>(readme.begin(), readme.begin() + 3), head);
  EXPECT_EQ(std::vector<std::string>(readme.begin() + 3, readme.end()), ours);
}

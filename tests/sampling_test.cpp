// train::sample against a plain reference: the tokens a setting may draw (the top_k largest
// logits, then the nucleus, in double) and their probabilities. A draw outside that set fails,
// and each token's count must lie within 5 standard deviations (+1) of its expected count. On the
// CPU, and on a GPU, where the draw runs on the device and the id comes back in one wait.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "cuda_test_util.h"
#include "sinter/train.h"

using namespace sinter;

namespace {

// Each token's probability under s (0 where dropped), from the logits in double.
std::vector<double> reference(const std::vector<float>& logits, const train::Sampling& s) {
  const size_t V = logits.size(), k = s.top_k > 0 ? std::min(size_t(s.top_k), V) : V;
  std::vector<size_t> order(V);
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return logits[a] > logits[b]; });
  std::vector<double> w(k), p(V, 0.0);
  double z = 0, ahead = 0, kept = 0;
  for (size_t i = 0; i < k; ++i) z += w[i] = std::exp((double(logits[order[i]]) - logits[order[0]]) / s.temperature);
  for (size_t i = 0; i < k; ahead += w[i++])
    if (ahead < s.top_p * z) kept += p[order[i]] = w[i];
  for (double& q : p) q /= kept;
  return p;
}

std::string name(const train::Sampling& s) {
  return "temperature " + std::to_string(s.temperature) + " top_k " + std::to_string(s.top_k) + " top_p " + std::to_string(s.top_p);
}

void expect_draws_follow(const Tensor& logits, const train::Sampling& s, int draws) {
  const std::vector<double> p = reference(logits.to(Device::cpu()).to_vector<float>(), s);
  std::vector<int> count(p.size(), 0);
  manual_seed(3);
  for (int i = 0; i < draws; ++i) {
    const int64_t t = train::sample(logits, s);
    ASSERT_TRUE(t >= 0 && t < int64_t(p.size())) << name(s) << ": token " << t;
    ASSERT_GT(p[size_t(t)], 0) << name(s) << ": drew token " << t << ", which this setting drops";
    ++count[size_t(t)];
  }
  for (size_t t = 0; t < p.size(); ++t) {
    const double mean = draws * p[t], sd = std::sqrt(draws * p[t] * (1 - p[t]));
    EXPECT_LE(std::abs(count[t] - mean), 5 * sd + 1) << name(s) << ": token " << t << " drawn " << count[t] << " times";
  }
}

const train::Sampling kSettings[] = {{.temperature = 1, .top_k = 5},
                                     {.temperature = 0.7, .top_p = 0.6},
                                     {.temperature = 1.3, .top_k = 12, .top_p = 0.8},
                                     {.temperature = 1, .top_k = 1000},
                                     {.temperature = 2}};

// 300 logits: a top_p over all of them sorts the row on a GPU (topk past 64 values).
Tensor logits_row() {
  manual_seed(21);
  return randn({300}) * 2;
}

}  // namespace

TEST(Sampling, DrawsFollowTheTopKAndNucleusDistribution) {
  const Tensor l = logits_row();
  for (const train::Sampling& s : kSettings) expect_draws_follow(l, s, 3000);
  EXPECT_EQ(train::sample(l, {.temperature = 0}), argmax(l, 0).item<int64_t>());
}

TEST(Sampling, BadLogitsAndSettingsAreErrorsNamingThem) {
  EXPECT_TRUE(test::throws_naming("sample", [] { (void)train::sample(ones({2, 3}), {}); }, "needs a 1-D row of logits, got shape (2, 3)"));
  EXPECT_TRUE(test::throws_naming("sample", [] { (void)train::sample(ones({3}), {.top_p = 0}); }, "0 < top_p <= 1"));
  const Tensor nan = tensor<float>({1, NAN, 2});
  for (const train::Sampling& s : kSettings)
    EXPECT_TRUE(test::throws_naming("sample", [&] { (void)train::sample(nan, s); }, "logits are not finite (nan)")) << name(s);
}

TEST(CudaSampling, DrawsFollowTheTopKAndNucleusDistributionWaitingOncePerToken) {
  NEEDS_GPU();
  const Tensor l = logits_row().to(Device::cuda(0));
  for (const train::Sampling& s : kSettings) {
    (void)train::sample(l, s);  // allocations the next draw reuses
    const int64_t before = cuda::host_synchronizations();
    (void)train::sample(l, s);
    EXPECT_EQ(cuda::host_synchronizations() - before, 1) << name(s);
    expect_draws_follow(l, s, 600);
  }
}

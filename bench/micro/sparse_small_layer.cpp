// What a small 2:4 layer's call costs beyond the dense layer's, where both run the same GEMM (the
// weight's cached dense copy): linear(x, w_sparse) against linear(x, w) on a 96 x 288 f32 weight,
// calls alternated in blocks of 200k, best of 5. The measurement behind docs/sparse.md's and
// docs/bench_sweep.md's small-layer paragraphs: `SINTER_NUM_THREADS=1 build/sparse_small_layer [M]`.
#include <sinter/sinter.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

using namespace sinter;

namespace {
template <class F> double us_per_call(F f, int n = 200000) {
  for (int i = 0; i < 2000; ++i) f();
  double best = 1e9;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) f();
    best = std::min(best, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / n);
  }
  return best;
}
}  // namespace

int main(int argc, char** argv) {
  NoGradGuard no_grad;
  const int64_t M = argc > 1 ? std::atoll(argv[1]) : 1;
  const Tensor w = prune_2_4(randn({288, 96}) * 0.02);
  const SemiStructuredSparse s = to_sparse_semi_structured(w);
  const Tensor x = randn({M, 96});
  const double sparse = us_per_call([&] { (void)linear(x, s); }), dense = us_per_call([&] { (void)linear(x, w); });
  std::printf("f32 M=%lld K=96 N=288: 2:4 %.3f us, dense %.3f us, dense/2:4 %.3f\n", static_cast<long long>(M), sparse, dense, dense / sparse);
}

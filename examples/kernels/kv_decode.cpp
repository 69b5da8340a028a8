// A decode step that appends to its KV caches in place with a user kernel (kv_write: the cache is
// written, Effect::writes(0)) and attends over them, compiled once for every position; its outputs
// and caches equal the eager step's bit for bit.
//   build/kv_decode [tokens]      (the tests run it: example_kv_decode)
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <sinter/sinter.h>

#include "kernels.h"

using namespace sinter;

static bool test_equal(const Tensor& a, const Tensor& b) {
  const Tensor x = a.contiguous(), y = b.contiguous();
  return x.shape() == y.shape() && x.dtype() == y.dtype() &&
         std::memcmp(x.data_ptr(), y.data_ptr(), size_t(x.numel() * x.element_size())) == 0;
}

int main(int argc, char** argv) {
  const int64_t tokens = argc > 1 ? std::atoll(argv[1]) : 24, B = 1, H = 4, D = 16, L = 32;
  const OpDef& kv_write = examples::kv_write_op(SINTER_KERNELS_DIR);
  manual_seed(5);
  const Tensor wq = randn({H * D, H * D}) * 0.1, wk = randn({H * D, H * D}) * 0.1, wv = randn({H * D, H * D}) * 0.1;
  struct Caches { Tensor k, v, pos; };
  auto fresh = [&] { return Caches{zeros({B, H, L, D}), zeros({B, H, L, D}), zeros({}, DType::i64)}; };
  Caches eager = fresh(), compiled = fresh();
  // One token x (B, 1, H D): its q, k, v; k and v into the caches at pos; attention over pos + 1 keys.
  auto step_of = [&](Caches& c) {
    return [&](const std::vector<Tensor>& in) {
      NoGradGuard ng;
      auto heads = [&](const Tensor& t) { return t.reshape({B, 1, H, D}).transpose(1, 2); };
      const Tensor q = heads(linear(in[0], wq)), k = heads(linear(in[0], wk)), v = heads(linear(in[0], wv));
      call1(kv_write, {c.k, k, c.pos});
      call1(kv_write, {c.v, v, c.pos});
      const Tensor end = c.pos + 1.0;
      const Tensor o = scaled_dot_product_attention(q, c.k, c.v, {}, 0.0, false, {}, false, SDPABackend::automatic, 0, end);
      c.pos.add_(1.0);
      return std::vector<Tensor>{o.transpose(1, 2).reshape({B, 1, H * D})};
    };
  };
  auto eager_step = step_of(eager);
  CompiledFunction compiled_step = compile(step_of(compiled), {.fullgraph = true, .name = "kv_decode_step"});
  bool same = true;
  for (int64_t t = 0; t < tokens && t < L; ++t) {
    const Tensor x = randn({B, 1, H * D});
    same = same && test_equal(eager_step({x})[0], compiled_step({x})[0]);
  }
  same = same && test_equal(eager.k, compiled.k) && test_equal(eager.v, compiled.v) && eager.pos.item<int64_t>() == compiled.pos.item<int64_t>();
  const Explanation e = compiled_step.explain({randn({B, 1, H * D})});
  std::printf("%lld tokens; compiled step: %d graph, %d program, user kernels: %s; outputs and caches %s eager's\n",
              (long long)tokens, e.graphs, e.compiles, e.user_kernels.empty() ? "none" : e.user_kernels[0].c_str(),
              same ? "equal" : "DIFFER from");
  return same && e.graphs == 1 && e.compiles == 1 ? 0 : 1;
}

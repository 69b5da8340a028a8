// Core benchmarks: linear (ours, through the op table) against raw oneDNN matmul calls made in the
// same run, and elementwise ops against a parallel memcpy of the same bytes.
//   build/bench/sinter_bench_core [--quick] [--markdown FILE]
#include <cstdio>
#include <cstring>
#include <dnnl.hpp>
#include <fstream>
#include <sinter/sinter.h>
#include <sstream>
#include <string>

#include "bench_util.h"
#include "core/parallel.h"

using namespace sinter;
using namespace sinter::bench;

namespace {

struct Row {
  std::string name;
  double ours_ms, peer_ms;
  std::string peer;
  std::string extra;
};

// Raw oneDNN: one matmul primitive created once, executed repeatedly; weights either in the plain
// layout our Linear keeps (N, K row-major, read as K x N) or reordered once into oneDNN's
// preferred blocked layout ("prepacked", the library's best case).
struct RawMatmul {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{eng};
  dnnl::matmul prim;
  dnnl::memory src, wei, dst;
  RawMatmul(const Tensor& x, const Tensor& w, const Tensor& y, bool prepack) {
    using dt = dnnl::memory::data_type;
    const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
    dnnl::memory::desc src_md({M, K}, dt::f32, dnnl::memory::format_tag::ab);
    dnnl::memory::desc plain_w({K, N}, dt::f32, dnnl::memory::format_tag::ba);
    dnnl::memory::desc dst_md({M, N}, dt::f32, dnnl::memory::format_tag::ab);
    dnnl::memory::desc w_md = prepack ? dnnl::memory::desc({K, N}, dt::f32, dnnl::memory::format_tag::any) : plain_w;
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, w_md, dst_md), eng);
    prim = dnnl::matmul(pd);
    src = dnnl::memory(src_md, eng, x.data_ptr());
    dst = dnnl::memory(dst_md, eng, y.data_ptr());
    dnnl::memory plain(plain_w, eng, w.data_ptr());
    if (prepack && pd.weights_desc() != plain_w) {
      wei = dnnl::memory(pd.weights_desc(), eng);
      dnnl::reorder(plain, wei).execute(stream, plain, wei);
      stream.wait();
    } else {
      wei = plain;
    }
  }
  void run() {
    prim.execute(stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}});
    stream.wait();
  }
};

void parallel_memcpy(void* dst, const void* src, size_t n) {
  parallel_for(0, int64_t(n), 1 << 20, [&](int64_t lo, int64_t hi) {
    std::memcpy(static_cast<char*>(dst) + lo, static_cast<const char*>(src) + lo, size_t(hi - lo));
  });
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string markdown;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--markdown") && i + 1 < argc) markdown = argv[++i];
    else { std::fprintf(stderr, "usage: %s [--quick] [--markdown FILE]\n", argv[0]); return 2; }
  }
  NoGradGuard no_grad;
  manual_seed(0);
  std::vector<Row> rows;
  std::printf("threads: %d\n\n", num_threads());
  std::printf("%-36s %12s %12s %12s %8s %8s\n", "linear f32", "ours GF/s", "plain GF/s", "packed GF/s", "x plain", "x packed");
  const std::vector<std::pair<int64_t, int64_t>> kn = {{4096, 4096}, {4096, 11008}};
  const std::vector<int64_t> ms = quick ? std::vector<int64_t>{1, 128} : std::vector<int64_t>{1, 32, 128, 512};
  for (auto [K, N] : kn) {
    Tensor w = randn({N, K}) * 0.02;
    for (int64_t M : ms) {
      Tensor x = randn({M, K});
      Tensor y = Tensor::empty({M, N});
      RawMatmul plain(x, w, y, false), packed(x, w, y, true);
      const Timing ours = time_it([&] { (void)linear(x, w); });
      const Timing tp = time_it([&] { plain.run(); });
      const Timing tk = time_it([&] { packed.run(); });
      const double flop = 2.0 * double(M) * double(K) * double(N);
      auto gf = [&](const Timing& t) { return flop / (t.best_ms * 1e-3) / 1e9; };
      char name[96];
      std::snprintf(name, sizeof name, "M=%ld K=%ld N=%ld", long(M), long(K), long(N));
      std::printf("%-36s %12.1f %12.1f %12.1f %8.2f %8.2f\n", name, gf(ours), gf(tp), gf(tk), tp.best_ms / ours.best_ms,
                  tk.best_ms / ours.best_ms);
      char extra[64];
      std::snprintf(extra, sizeof extra, "%.1f GFLOP/s", gf(ours));
      rows.push_back({std::string("linear f32 ") + name, ours.best_ms, tp.best_ms, "oneDNN matmul, plain weights", extra});
      rows.push_back({std::string("linear f32 ") + name, ours.best_ms, tk.best_ms, "oneDNN matmul, prepacked weights", extra});
    }
  }

  std::printf("\n%-36s %12s %12s %8s\n", "elementwise f32 (64 MiB/operand)", "ours GB/s", "copy GB/s", "share");
  const int64_t n = 16 << 20;
  Tensor a = randn({n}), b = randn({n}), out = Tensor::empty({n});
  const Timing copy = time_it([&] { parallel_memcpy(out.data_ptr(), a.data_ptr(), size_t(n) * 4); });
  const double copy_gbs = 2.0 * double(n) * 4 / (copy.best_ms * 1e-3) / 1e9;
  struct Ew { const char* name; double bytes; std::function<void()> f; };
  const std::vector<Ew> ew = {
      {"add", 3.0 * double(n) * 4, [&] { (void)add(a, b); }},
      {"gelu (erf)", 2.0 * double(n) * 4, [&] { (void)gelu(a); }},
      {"gelu (tanh)", 2.0 * double(n) * 4, [&] { (void)gelu(a, true); }},
      {"mul by scalar", 2.0 * double(n) * 4, [&] { (void)mul(a, 0.5); }},
  };
  for (auto& e : ew) {
    const Timing t = time_it(e.f);
    const double gbs = e.bytes / (t.best_ms * 1e-3) / 1e9;
    std::printf("%-36s %12.1f %12.1f %7.0f%%\n", e.name, gbs, copy_gbs, 100 * gbs / copy_gbs);
    char extra[64];
    std::snprintf(extra, sizeof extra, "%.1f GB/s = %.0f%% of copy", gbs, 100 * gbs / copy_gbs);
    // The peer time is the copy moving the same number of bytes.
    rows.push_back({std::string("elementwise f32 ") + e.name, t.best_ms, copy.best_ms * e.bytes / (2.0 * double(n) * 4),
                    "parallel memcpy, same bytes", extra});
  }

  if (!markdown.empty()) {
    std::ostringstream md;
    md << "| case | ours (best ms) | peer | peer (best ms) | ratio (peer/ours) | throughput |\n|---|---:|---|---:|---:|---|\n";
    for (auto& r : rows) {
      char line[512];
      std::snprintf(line, sizeof line, "| %s | %.3f | %s | %.3f | %.2f | %s |\n", r.name.c_str(), r.ours_ms, r.peer.c_str(),
                    r.peer_ms, r.peer_ms / r.ours_ms, r.extra.c_str());
      md << line;
    }
    std::ofstream(markdown) << md.str();
    std::printf("\nwrote %s\n", markdown.c_str());
  }
  return 0;
}

#include "harness.h"

#include <sinter/cuda.h>

#include <immintrin.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <unistd.h>
#include <nlohmann/json.hpp>
#include <sinter/sinter.h>
#include <sstream>

#include "tools/sinter/progress.h"  // the command line's progress line
#include "core/parallel.h"
#include "cpu/cpu.h"

#ifndef SINTER_SOURCE_DIR
#define SINTER_SOURCE_DIR "."
#endif

namespace sinter::bench {

const std::vector<SuiteInfo>& suites() {
  static const std::vector<SuiteInfo> s = {
      {"ops", "tiny-op overhead; elementwise, softmax and norms against the copy bandwidth", suite_ops},
      {"linear", "linear f32 and bf16 against raw oneDNN matmul calls; bf16 against f32", suite_linear},
      {"train", "training step of the default model (f32, and bf16 autocast)", suite_train},
      {"generate", "generation with the KV cache at batch 1 (f32 and bf16)", suite_generate},
      {"attention", "scaled-dot-product attention: flash against math", suite_attention},
      {"sparse", "2:4 sparse linear against oneDNN's dense matmul on the same weights", suite_sparse},
      {"compile", "sinter::compile against eager Sinter: a fused chain, norms, an MLP, decoding, a training step; compile times", suite_compile},
      {"cuda", "the CUDA backend against PyTorch on the same GPU: bf16 GEMMs, 1 GiB elementwise against a copy, attention, 2:4 layers, gpt2-124m training and generation",
       suite_cuda, [] { cuda::require_device(0); }},
      {"sweep", "shapes nobody tuned for against PyTorch eager and torch.compile: attention, linear, 2:4, row ops, compiled blocks", suite_sweep},
  };
  return s;
}

std::vector<std::pair<std::string, std::string>> suite_list() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const SuiteInfo& s : suites()) out.emplace_back(s.name, s.what);
  return out;
}

// ---------------------------------------------------------------------------------------------
namespace {
bool stderr_is_tty() {
  static const bool tty = isatty(fileno(stderr));
  return tty;
}
}  // namespace

void Report::expect(int cases) {
  expected_ = cases;
  t0_ = last_progress_ = std::chrono::steady_clock::now();
}

void Report::new_case(const std::string& case_name) {
  if (!ours_.count(case_name)) case_order_.push_back(case_name);
  if (expected_ > 0 && stderr_is_tty()) std::fprintf(stderr, "\r\033[K");  // the progress line gives way to the row
}

// Rows vary in cost (a 2048-row GEMM against a GEMV), so the ETA assumes the cases left take the
// average so far: a rough figure, which settles as the run goes.
void Report::progress() {
  if (expected_ <= 0) return;
  const auto now = std::chrono::steady_clock::now();
  const int done = int(case_order_.size());
  const double elapsed = std::chrono::duration<double>(now - t0_).count();
  const bool tty = stderr_is_tty(), last = done >= expected_;
  if (!tty && !last && std::chrono::duration<double>(now - last_progress_).count() < 30) return;
  last_progress_ = now;
  const double per_case = elapsed / std::max(done, 1);
  std::fprintf(stderr, "%s[bench] %d/%d cases  %.1f cases/min  elapsed %s  ETA %s%s", tty ? "\r" : "", done, expected_,
               60.0 / std::max(per_case, 1e-9), cli::format_duration(elapsed).c_str(), cli::format_duration(per_case * (expected_ - done)).c_str(),
               tty && !last ? "" : "\n");
  std::fflush(stderr);
}

void Report::add(const std::string& case_name, Timing ours, const std::string& peer, Timing peer_time, std::string note) {
  new_case(case_name);
  ours_[case_name] = {ours, note};
  rows_.push_back({case_name, ours, peer, peer_time, std::move(note)});
  print_row(rows_.back());
  progress();
}

void Report::ours_only(const std::string& case_name, Timing ours, std::string note) {
  new_case(case_name);
  ours_[case_name] = {ours, note};
  rows_.push_back({case_name, ours, "", {}, std::move(note)});  // a placeholder until a peer merges in
  print_row(rows_.back());
  progress();
}

int Report::merge_peer(const std::string& peer, const std::map<std::string, Timing>& timings) {
  int matched = 0;
  for (const std::string& c : case_order_) {
    auto it = timings.find(c);
    if (it == timings.end()) continue;
    const auto& [ours, note] = ours_.at(c);
    auto placeholder = std::find_if(rows_.begin(), rows_.end(), [&](const Row& r) { return r.case_name == c && r.peer.empty(); });
    if (placeholder != rows_.end()) *placeholder = {c, ours, peer, it->second, note};
    else rows_.push_back({c, ours, peer, it->second, note});
    ++matched;
  }
  // Keep each case's rows together, in the order the cases ran.
  std::stable_sort(rows_.begin(), rows_.end(), [&](const Row& a, const Row& b) {
    auto pos = [&](const std::string& c) { return std::find(case_order_.begin(), case_order_.end(), c) - case_order_.begin(); };
    return pos(a.case_name) < pos(b.case_name);
  });
  return matched;
}

void Report::print_worst(size_t n) const {
  std::vector<const Row*> timed;
  for (const Row& r : rows_)
    if (!r.peer.empty()) timed.push_back(&r);
  if (timed.size() <= n) return;
  std::sort(timed.begin(), timed.end(), [](const Row* a, const Row* b) { return a->ratio() < b->ratio(); });
  std::printf("\nthe %zu lowest ratios:\n", n);
  for (size_t i = 0; i < n; ++i) print_row(*timed[i]);
}

void Report::line(const std::string& text) {
  lines_.push_back(text);
  std::printf("%s\n", text.c_str());
}

void Report::print_row(const Row& r) const {
  if (r.peer.empty())
    std::printf("%-44s %10.4f %10.4f   %-34s %10s %8s  %s\n", r.case_name.c_str(), r.ours.best_ms, r.ours.median_ms, "-", "-",
                "-", r.note.c_str());
  else
    std::printf("%-44s %10.4f %10.4f   %-34s %10.4f %7.2fx  %s\n", r.case_name.c_str(), r.ours.best_ms, r.ours.median_ms,
                r.peer.c_str(), r.peer_time.best_ms, r.ratio(), r.note.c_str());
  std::fflush(stdout);
}

void Report::print_table() const {
  std::printf("\n%-44s %10s %10s   %-34s %10s %8s  %s\n", "case", "ours best", "median", "peer", "peer best", "ratio", "note");
  for (const Row& r : rows_) print_row(r);
}

std::string Report::markdown_table() const {
  std::ostringstream md;
  md << "| case | ours best (ms) | ours median (ms) | peer | peer best (ms) | ratio (peer/ours) | note |\n"
     << "|---|---:|---:|---|---:|---:|---|\n";
  char buf[1024];
  for (const Row& r : rows_) {
    if (r.peer.empty())
      std::snprintf(buf, sizeof buf, "| %s | %.4g | %.4g | - | - | - | %s |\n", r.case_name.c_str(), r.ours.best_ms,
                    r.ours.median_ms, r.note.c_str());
    else
      std::snprintf(buf, sizeof buf, "| %s | %.4g | %.4g | %s | %.4g | **%.2f** | %s |\n", r.case_name.c_str(), r.ours.best_ms,
                    r.ours.median_ms, r.peer.c_str(), r.peer_time.best_ms, r.ratio(), r.note.c_str());
    md << buf;
  }
  for (const std::string& l : lines_)
    if (!l.empty()) md << "\n" << l << "\n";  // (blank lines space the terminal's table only)
  return md.str();
}

std::string Report::json() const {
  nlohmann::json rows = nlohmann::json::array();
  for (const Row& r : rows_) {
    nlohmann::json j = {{"case", r.case_name}, {"ours_ms", r.ours.best_ms}, {"ours_median_ms", r.ours.median_ms}, {"note", r.note}};
    if (r.peer.empty()) {
      j["peer"] = nullptr, j["peer_ms"] = nullptr, j["ratio"] = nullptr;
    } else {
      j["peer"] = r.peer, j["peer_ms"] = r.peer_time.best_ms, j["peer_median_ms"] = r.peer_time.median_ms, j["ratio"] = r.ratio();
    }
    rows.push_back(j);
  }
  return rows.dump(1) + "\n";
}

std::string Report::svg_chart(const std::string& title) const {
  // One bar per row, length log2(ratio) from the 1.0 line: right of it Sinter is faster.
  std::vector<Row> rows_;
  for (const Row& r : this->rows_)
    if (!r.peer.empty()) rows_.push_back(r);
  const int row_h = 18, label_w = 470, plot_w = 360, top = 40;
  const int h = top + row_h * int(rows_.size()) + 40;
  double span = 1;  // log2 range shown each side
  for (const Row& r : rows_) span = std::max(span, std::ceil(std::fabs(std::log2(std::max(r.ratio(), 1e-3)))));
  auto x_of = [&](double ratio) { return label_w + plot_w / 2.0 + std::log2(ratio) / span * (plot_w / 2.0); };
  std::ostringstream s;
  s << "<svg xmlns='http://www.w3.org/2000/svg' width='" << label_w + plot_w + 90 << "' height='" << h
    << "' font-family='sans-serif' font-size='11'>\n<rect width='100%' height='100%' fill='white'/>\n"
    << "<text x='10' y='20' font-size='14'>" << title << " — ratio peer/ours (log scale; right of 1x: Sinter faster)</text>\n";
  for (int k = -int(span); k <= int(span); ++k) {
    const double x = x_of(std::pow(2.0, k));
    s << "<line x1='" << x << "' y1='" << top - 5 << "' x2='" << x << "' y2='" << h - 30 << "' stroke='"
      << (k == 0 ? "#000" : "#ddd") << "'/>\n<text x='" << x - 10 << "' y='" << h - 15 << "'>" << std::pow(2.0, k) << "x</text>\n";
  }
  for (size_t i = 0; i < rows_.size(); ++i) {
    const Row& r = rows_[i];
    const double y = top + row_h * double(i), x0 = x_of(1), x1 = x_of(std::max(r.ratio(), 1e-3));
    char label[512];
    std::snprintf(label, sizeof label, "%s vs %s", r.case_name.c_str(), r.peer.c_str());
    s << "<text x='" << label_w - 6 << "' y='" << y + 12 << "' text-anchor='end'>" << label << "</text>\n"
      << "<rect x='" << std::min(x0, x1) << "' y='" << y + 3 << "' width='" << std::max(std::fabs(x1 - x0), 1.0)
      << "' height='" << row_h - 6 << "' fill='" << (r.ratio() >= 1 ? "#2a7" : "#d54") << "'/>\n"
      << "<text x='" << std::max(x0, x1) + 4 << "' y='" << y + 12 << "'>" << std::round(r.ratio() * 100) / 100 << "x</text>\n";
  }
  s << "</svg>\n";
  return s.str();
}

// ---------------------------------------------------------------------------------------------
double copy_bandwidth_gbs(Timing* copy_of_64mib) {
  const size_t n = size_t(64) << 20;
  Tensor a = full({int64_t(n / 4)}, 1.0), b = Tensor::empty({int64_t(n / 4)});
  const Timing t = time_it([&] {
    parallel_for(0, int64_t(n), 1 << 20, [&](int64_t lo, int64_t hi) {
      std::memcpy(static_cast<char*>(b.data_ptr()) + lo, static_cast<const char*>(a.data_ptr()) + lo, size_t(hi - lo));
    });
  });
  if (copy_of_64mib) *copy_of_64mib = t;
  return 2.0 * double(n) / (t.best_ms * 1e-3) / 1e9;
}

double fma_peak_gflops() {
  // Twelve independent chains of register-wide FMAs per thread: enough to hide the FMA latency.
  // The chains start from different values (identical chains would be merged by the compiler into
  // one, latency-bound chain: an earlier version of this function reported 1.6x the real peak)
  // and use the FMA instruction itself, which is what the kernels' inner loops issue.
#ifdef __AVX512F__
  constexpr int bytes = 64;
  typedef float vec __attribute__((vector_size(bytes)));
  auto fma = [](vec x, vec a, vec b) { return (vec)_mm512_fmadd_ps((__m512)x, (__m512)a, (__m512)b); };
#elif defined(__FMA__)
  constexpr int bytes = 32;
  typedef float vec __attribute__((vector_size(bytes)));
  auto fma = [](vec x, vec a, vec b) { return (vec)_mm256_fmadd_ps((__m256)x, (__m256)a, (__m256)b); };
#else
  constexpr int bytes = 32;
  typedef float vec __attribute__((vector_size(bytes)));
  auto fma = [](vec x, vec a, vec b) { return x * a + b; };
#endif
  constexpr int lanes = bytes / 4, chains = 12;
  const int64_t iters = 4'000'000;
  auto kernel = [&] {
    parallel_for(0, num_threads(), 1, [&](int64_t lo, int64_t hi) {
      for (int64_t t = lo; t < hi; ++t) {
        vec a, b;
        for (int i = 0; i < lanes; ++i) a[i] = 1.0f - 1e-7f * float(i), b[i] = 1e-7f;
        vec c[chains];
        for (int k = 0; k < chains; ++k) c[k] = b * float(k + 1 + t);
        vec c0 = c[0], c1 = c[1], c2 = c[2], c3 = c[3], c4 = c[4], c5 = c[5], c6 = c[6], c7 = c[7], c8 = c[8], c9 = c[9],
            c10 = c[10], c11 = c[11];
        for (int64_t i = 0; i < iters; ++i) {
          c0 = fma(c0, a, b), c1 = fma(c1, a, b), c2 = fma(c2, a, b), c3 = fma(c3, a, b), c4 = fma(c4, a, b), c5 = fma(c5, a, b);
          c6 = fma(c6, a, b), c7 = fma(c7, a, b), c8 = fma(c8, a, b), c9 = fma(c9, a, b), c10 = fma(c10, a, b), c11 = fma(c11, a, b);
        }
        const vec sum = c0 + c1 + c2 + c3 + c4 + c5 + c6 + c7 + c8 + c9 + c10 + c11;
        float sink = sum[0];
        asm volatile("" : : "x"(sink));
      }
    });
  };
  const Timing t = time_it(kernel, 1, 3, 0);
  return 2.0 * lanes * chains * double(iters) * num_threads() / (t.best_ms * 1e-3) / 1e9;
}

// ---------------------------------------------------------------------------------------------
namespace {

std::string today() {
  char buf[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&now));
  return buf;
}

// Runs bench/torch_peer.py; returns the peer's name ("PyTorch 2.x") or why it could not run.
// The PyTorch side's timings by peer: the script's "peer" for its rows, or a row's own (the sweep's
// compiled rows are torch.compile's, its other rows PyTorch eager's).
using PeerTimings = std::map<std::string, std::map<std::string, Timing>>;

bool run_torch(const Options& o, PeerTimings& timings, std::string& why) {
  if (o.no_torch) {
    why = "PyTorch peer skipped (--no-torch)";
    return false;
  }
  const std::string script = o.torch_script.empty() ? std::string(SINTER_SOURCE_DIR) + "/bench/torch_peer.py" : o.torch_script;
  if (std::system((o.python + " -c 'import torch' >/dev/null 2>&1").c_str()) != 0) {
    why = "PyTorch is not installed for '" + o.python + "' (--python picks another interpreter): no PyTorch column";
    return false;
  }
  const std::string out = std::filesystem::temp_directory_path() / ("sinter_torch_" + std::to_string(::getpid()) + ".json");
  std::string cmd = o.python + " '" + script + "' " + o.suite + " --threads " + std::to_string(num_threads()) + " --json '" + out + "'";
  if (o.quick) cmd += " --quick";
  std::printf("\nPyTorch side: %s\n", cmd.c_str());
  std::fflush(stdout);
  if (std::system(cmd.c_str()) != 0) {
    why = "the PyTorch peer script failed (" + cmd + ")";
    return false;
  }
  try {
    std::ifstream f(out);
    nlohmann::json j = nlohmann::json::parse(f);
    const std::string peer = j.at("peer").get<std::string>();
    for (auto& r : j.at("rows"))
      timings[r.value("peer", peer)][r.at("case").get<std::string>()] = {r.at("best_ms").get<double>(), r.at("median_ms").get<double>()};
  } catch (const std::exception& e) {
    why = std::string("could not read the PyTorch peer's output ") + out + ": " + e.what();
    return false;
  }
  std::filesystem::remove(out);
  return true;
}

}  // namespace

void update_markdown_section(const std::string& path, const std::string& suite, const std::string& body) {
  std::string text;
  if (std::ifstream f(path); f) {
    std::stringstream ss;
    ss << f.rdbuf();
    text = ss.str();
  }
  const std::string open = "<!-- sinter bench " + suite + " -->", close = "<!-- /sinter bench " + suite + " -->";
  const std::string section = open + "\n" + body + close;
  const size_t a = text.find(open), b = text.find(close);
  if (a != std::string::npos && b != std::string::npos && b > a)
    text.replace(a, b + close.size() - a, section);
  else
    text += "\n" + section + "\n";
  io::atomic_write(path, text);
}

std::string machine_line() {
  std::ifstream f("/proc/cpuinfo");
  std::string line, model = "unknown CPU", flags;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0 && model == "unknown CPU") model = line.substr(line.find(':') + 2);
    if (line.rfind("flags", 0) == 0 && flags.empty()) flags = line + " ";
  }
  auto has = [&](const char* fl) { return flags.find(std::string(" ") + fl + " ") != std::string::npos; };
  return "CPU: " + model + ", " + std::to_string(num_threads()) + " threads; AVX2 " + (has("avx2") ? "yes" : "no") +
         ", AVX-512 " + (has("avx512f") ? "yes" : "no") + ", AVX512-BF16 " + (has("avx512_bf16") ? "yes" : "no") +
         " (bf16 matmul: " + (cpu::dnnl_has_bf16() ? "oneDNN native" : "widened to f32 — no bf16 hardware") + ")";
}

int run(const Options& o) {
  auto it = std::find_if(suites().begin(), suites().end(), [&](const SuiteInfo& s) { return s.name == o.suite; });
  SINTER_CHECK(it != suites().end(), "[bench] unknown suite '", o.suite, "'");
  if (it->ready) it->ready();
  Report report;
  const std::string machine = machine_line();
  std::printf("sinter bench %s: %s\n%s%s\n\n", o.suite.c_str(), it->what.c_str(), machine.c_str(), o.quick ? ", quick" : "");
  std::printf("%-44s %10s %10s   %-34s %10s %8s  %s\n", "case", "ours best", "median", "peer", "peer best", "ratio", "note");
  it->run(o, report);

  std::string why;
  PeerTimings timings;
  std::string torch_line;
  if (run_torch(o, timings, why)) {
    for (const auto& [peer, rows] : timings) {
      const int n = report.merge_peer(peer, rows);
      torch_line += (torch_line.empty() ? "" : " ") + peer + " (same threads, shapes and dtypes) timed " + std::to_string(n) +
                    " of the cases in the same run.";
    }
  } else {
    torch_line = why + ".";
  }
  report.line("");
  report.line(torch_line);
  report.print_table();
  report.print_worst(5);

  if (!o.json.empty()) io::atomic_write(o.json, report.json());
  if (!o.svg.empty()) io::atomic_write(o.svg, report.svg_chart("sinter bench " + o.suite));
  if (!o.update.empty()) {
    std::ostringstream body;
    body << "`" << o.command_line << "` — " << today() << ". " << machine << ".\n\n" << report.markdown_table();
    if (!o.svg.empty()) body << "\n![ratios](" << o.svg << ")\n";
    update_markdown_section(o.update, o.suite, body.str());
    std::printf("\nupdated the '%s' section of %s\n", o.suite.c_str(), o.update.c_str());
  }
  return 0;
}

}  // namespace sinter::bench

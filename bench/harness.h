#pragma once
// `sinter bench SUITE`: each suite times Sinter on a list of cases and, in the same run, a peer for
// each case (a raw library call, a memory copy of the same bytes, the naive kernel); PyTorch's
// timings of the same cases are merged in when PyTorch is installed (bench/torch_peer.py).
// A row is one (case, peer) pair; ratio = peer / ours, so > 1 means Sinter is faster.
#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <utility>
#include <string>
#include <vector>

#include "sinter/bench.h"

namespace sinter::bench {

struct Timing {
  double best_ms = 0, median_ms = 0;
};

// Warm up, then repeat until both `reps` runs and `min_total_s` seconds are done.
template <class F> Timing time_it(F&& f, int warmup = 3, int reps = 15, double min_total_s = 0.3) {
  for (int i = 0; i < warmup; ++i) f();
  std::vector<double> ms;
  double total = 0;
  while (int(ms.size()) < reps || (total < min_total_s && ms.size() < 2000)) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ms.push_back(s * 1e3);
    total += s;
  }
  std::sort(ms.begin(), ms.end());
  return {ms.front(), ms[ms.size() / 2]};
}

// Ours and a peer timed alternately (one run of each per round), so a noisy neighbour slows both
// alike instead of whichever happened to run during the disturbance.
template <class F, class G> std::pair<Timing, Timing> time_pair(F&& ours, G&& peer, int warmup = 2, int reps = 15,
                                                                double min_total_s = 0.6) {
  for (int i = 0; i < warmup; ++i) ours(), peer();
  std::vector<double> a, b;
  double total = 0;
  auto once = [](auto& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  while (int(a.size()) < reps || (total < min_total_s && a.size() < 2000)) {
    const double x = once(ours), y = once(peer);
    a.push_back(x * 1e3), b.push_back(y * 1e3);
    total += x + y;
  }
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  return {{a.front(), a[a.size() / 2]}, {b.front(), b[b.size() / 2]}};
}

// For sub-microsecond work: each timing covers `n` calls and is reported per call.
template <class F> Timing time_per_call(F&& f, int n) {
  Timing t = time_it([&] { for (int i = 0; i < n; ++i) f(); }, 2, 9, 0.2);
  return {t.best_ms / n, t.median_ms / n};
}

struct Row {
  std::string case_name;
  Timing ours;
  std::string peer;
  Timing peer_time;
  std::string note;  // throughput, share of peak or of copy bandwidth, a fallback taken
  double ratio() const { return peer_time.best_ms / ours.best_ms; }
};

class Report {
 public:
  // A case timed for Sinter; `peer` may be empty when only PyTorch (if present) compares.
  void add(const std::string& case_name, Timing ours, const std::string& peer, Timing peer_time, std::string note = "");
  void ours_only(const std::string& case_name, Timing ours, std::string note = "");
  // Adds a peer row for every case Sinter timed that the peer timed too; returns how many matched.
  int merge_peer(const std::string& peer, const std::map<std::string, Timing>& timings);
  void line(const std::string& text);  // free text printed with the table (and kept for markdown)
  // How many cases the suite will time: from then on each new case is followed by a progress
  // line on stderr (cases done, rate, elapsed, ETA), rewritten in place on a terminal and
  // printed every 30 seconds or so otherwise.
  void expect(int cases);

  const std::vector<Row>& rows() const { return rows_; }
  void print_table() const;
  void print_worst(size_t n) const;  // the n rows with the lowest ratios (suites with more rows than that)
  std::string markdown_table() const;
  std::string json() const;
  std::string svg_chart(const std::string& title) const;  // horizontal bars of the ratios, log scale

 private:
  std::vector<Row> rows_;
  std::map<std::string, std::pair<Timing, std::string>> ours_;  // every case Sinter timed
  std::vector<std::string> case_order_;
  std::vector<std::string> lines_;
  int expected_ = 0;
  std::chrono::steady_clock::time_point t0_, last_progress_;
  void print_row(const Row& r) const;
  void new_case(const std::string& case_name);  // registers a case not seen before; clears the progress line
  void progress();
};

struct SuiteInfo {
  std::string name, what;
  std::function<void(const Options&, Report&)> run;
  std::function<void()> ready = {};  // throws, naming why, where the suite cannot run (before any output)
};
const std::vector<SuiteInfo>& suites();

// Replaces the text between "<!-- sinter bench SUITE -->" and "<!-- /sinter bench SUITE -->" in a
// markdown file (appending the section when the markers are missing); written atomically.
void update_markdown_section(const std::string& path, const std::string& suite, const std::string& body);


// The suites (bench/suite_*.cpp).
void suite_ops(const Options& o, Report& r);
void suite_linear(const Options& o, Report& r);
void suite_train(const Options& o, Report& r);
void suite_generate(const Options& o, Report& r);
void suite_attention(const Options& o, Report& r);
void suite_sparse(const Options& o, Report& r);
void suite_sweep(const Options& o, Report& r);
void suite_compile(const Options& o, Report& r);
void suite_cuda(const Options& o, Report& r);

// Shared measurement helpers.
double copy_bandwidth_gbs(Timing* copy_of_64mib = nullptr);  // 2-thread parallel memcpy, bytes read+written
double fma_peak_gflops();                                     // fp32 FMA peak of all threads, measured now

}  // namespace sinter::bench

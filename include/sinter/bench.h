#pragma once
// `sinter bench SUITE`: each suite times Sinter on a list of cases and, in the same run, a peer for
// each case (a raw library call, a memory copy of the same bytes, the naive kernel); PyTorch's
// timings of the same cases are merged in when PyTorch is installed (bench/torch_peer.py). The
// suites live in the sinter_bench library (bench/), which the CLI links.
#include <string>
#include <utility>
#include <vector>

namespace sinter::bench {

struct Options {
  std::string suite;
  bool quick = false;
  std::string json;            // --json FILE: the rows as JSON
  std::string update;          // --update FILE: rewrite this suite's section of BENCHMARKS.md
  std::string svg;             // --svg FILE: the ratio chart
  std::string python = "python3";
  std::string torch_script;    // default: bench/torch_peer.py of the source tree
  bool no_torch = false;
  std::string checkpoint;      // generate: a trained checkpoint instead of a fresh tiny model
  std::string command_line;    // what to print as "produced by"
};

// The suites: name and what each times.
std::vector<std::pair<std::string, std::string>> suite_list();

// Runs one suite (plus PyTorch's side), prints the table and writes what the options ask for.
int run(const Options& opts);

}  // namespace sinter::bench

#pragma once
// Progress lines of the command line (train, sparsify, bench): on a terminal one line rewritten in
// place, elsewhere a line per report; with the rate, the time elapsed and the ETA.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <string>

namespace sinter::cli {

// "42s", "3m07s", "1h05m".
inline std::string format_duration(double s) {
  char b[32];
  if (s >= 3600) std::snprintf(b, sizeof b, "%dh%02dm", int(s / 3600), int(std::fmod(s, 3600) / 60));
  else if (s >= 60) std::snprintf(b, sizeof b, "%dm%02ds", int(s / 60), int(std::fmod(s, 60)));
  else std::snprintf(b, sizeof b, "%.0fs", s);
  return b;
}

inline bool stdout_is_terminal() { return isatty(fileno(stdout)) != 0; }

}  // namespace sinter::cli

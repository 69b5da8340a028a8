// A job that loses a rank on purpose, for the fault tests (DistFaults in dist_fault_test.cpp):
//   mpirun -np 2 sinter_dist_fault kill    rank 1 dies by SIGKILL before its third all_reduce
//   mpirun -np N sinter_dist_fault stall   rank 1 sleeps for an hour before its third all_reduce
// The job must end on its own, non-zero, with messages naming the ranks and the collective.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>

#include "sinter/dist.h"
#include "sinter/ops.h"

using namespace sinter;

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "kill" && mode != "stall") {
    std::fprintf(stderr, "usage: sinter_dist_fault kill|stall\n");
    return 2;
  }
  auto w = dist::world();
  for (int step = 0; step < 5; ++step) {
    if (step == 2 && w->rank() == 1) {
      if (mode == "kill") std::raise(SIGKILL);
      std::this_thread::sleep_for(std::chrono::hours(1));
    }
    Tensor x = dist::all_reduce(ones({4}), *w);
    if (w->rank() == 0) std::printf("step %d: %g\n", step, x.data<float>()[0]), std::fflush(stdout);
  }
  return 0;
}

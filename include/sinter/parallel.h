#pragma once
// CPU threads: every kernel runs on one OpenMP pool (the one oneDNN uses). SINTER_NUM_THREADS
// sets the count at start-up, default all cores.
namespace sinter {

int num_threads();
void set_num_threads(int n);

}  // namespace sinter

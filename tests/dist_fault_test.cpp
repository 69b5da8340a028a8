// A lost rank ends the whole job, non-zero, within a bounded time, with messages that name the
// ranks and the collective: mpirun runs tests/dist_fault.cpp with a rank that dies or stalls.
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <string>
#include <sys/wait.h>

namespace {

struct JobRun {
  int status = -1;
  double seconds = 0;
  std::string output;
};

JobRun run_job(const std::string& mode, int timeout_s, int ranks = 2) {
  // Root and more ranks than cores are fine here; shared memory keeps the traffic local.
  const std::string cmd = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 "
                          "OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none SINTER_DIST_TIMEOUT=" + std::to_string(timeout_s) +
                          " timeout -s KILL 120 mpirun -np " + std::to_string(ranks) + " " SINTER_DIST_FAULT " " + mode + " 2>&1";
  JobRun r;
  const auto t0 = std::chrono::steady_clock::now();
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  while (fgets(buf.data(), int(buf.size()), p)) r.output += buf.data();
  r.status = pclose(p);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace

TEST(DistFaults, ARankKilledMidJobEndsTheJobNamingTheCollective) {
  const JobRun r = run_job("kill", 30);
  ASSERT_NE(r.status, -1) << "could not start mpirun";
  EXPECT_TRUE(WIFEXITED(r.status) && WEXITSTATUS(r.status) != 0) << r.output;
  EXPECT_LT(r.seconds, 60.0) << r.output;
  EXPECT_NE(r.output.find("rank 1"), std::string::npos) << r.output;       // mpirun: rank 1 exited on signal 9
  EXPECT_NE(r.output.find("all_reduce"), std::string::npos) << r.output;   // rank 0 was waiting in it
  EXPECT_NE(r.output.find("step 1"), std::string::npos) << "the job never got going:\n" << r.output;
}

TEST(DistFaults, ARankStalledInACollectiveEndsTheJobAtTheDeadline) {
  const JobRun r = run_job("stall", 5);
  ASSERT_NE(r.status, -1) << "could not start mpirun";
  EXPECT_TRUE(WIFEXITED(r.status) && WEXITSTATUS(r.status) != 0) << r.output;
  EXPECT_LT(r.seconds, 60.0) << r.output;
  EXPECT_GT(r.seconds, 4.0) << "ended before the deadline:\n" << r.output;
  EXPECT_NE(r.output.find("rank 0: all_reduce on group 'world'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("missed its deadline"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Not arrived: rank 1 ("), std::string::npos) << r.output;  // the waiting rank names it
  EXPECT_NE(r.output.find("rank 1: terminated outside any collective"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step 1"), std::string::npos) << r.output;
}

// Three ranks: the two that arrived name the one that did not, and each other as waiting with them.
TEST(DistFaults, ARankStalledAmongThreeIsNamedByTheRanksThatWaited) {
  const JobRun r = run_job("stall", 5, 3);
  ASSERT_NE(r.status, -1) << "could not start mpirun";
  EXPECT_TRUE(WIFEXITED(r.status) && WEXITSTATUS(r.status) != 0) << r.output;
  EXPECT_LT(r.seconds, 60.0) << r.output;
  EXPECT_NE(r.output.find("Not arrived: rank 1 ("), std::string::npos) << r.output;
  const bool named_peer = r.output.find("Waiting with this rank: rank 2.") != std::string::npos ||
                          r.output.find("Waiting with this rank: rank 0.") != std::string::npos;
  EXPECT_TRUE(named_peer) << r.output;
  EXPECT_EQ(r.output.find("Not arrived: rank 2"), std::string::npos) << r.output;
}

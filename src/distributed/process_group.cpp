// Work handles with deadlines, the single-process group, and the runtime that picks a backend.
#include <csignal>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <unistd.h>

#include "core/format.h"
#include "core/parallel.h"
#include "distributed/backend.h"
#include "sinter/dist.h"

namespace sinter::dist {

namespace {
std::mutex g_mu;
std::vector<ProcessGroup*> g_groups;  // by id; null once destroyed
std::shared_ptr<ProcessGroup> g_world;
bool g_mpi = false;

// What this rank is waiting on, or last finished, for the message when the launcher ends it:
// a rank killed while waiting names the collective; one killed outside any says how long it had
// been away (the stalled rank, when a peer's deadline ended the job).
char g_waiting[256] = "";
char g_last[256] = "";
timespec g_last_time{};
int g_rank = 0;

// A message built in a fixed buffer with async-signal-safe steps only (the SIGTERM handler's).
struct SignalText {
  char buf[700];
  size_t n = 0;
  SignalText& operator<<(const char* s) {
    while (*s && n < sizeof buf) buf[n++] = *s++;
    return *this;
  }
  SignalText& operator<<(int64_t v) {
    char d[24];
    int k = 0;
    if (v < 0) *this << "-", v = -v;
    do d[k++] = char('0' + v % 10), v /= 10; while (v > 0 && k < 24);
    while (k > 0 && n < sizeof buf) buf[n++] = d[--k];
    return *this;
  }
};

// The job's end, as a rank the launcher terminates reports it (stderr: the process is ending).
void on_sigterm(int) {
  SignalText m;
  m << "[dist] rank " << int64_t(g_rank) << ": terminated ";
  if (g_waiting[0]) {
    m << "while waiting in " << g_waiting << " (another rank died or aborted)\n";
  } else if (g_last[0]) {
    timespec now{};
    clock_gettime(CLOCK_MONOTONIC, &now);
    const int64_t tenths = (int64_t(now.tv_sec - g_last_time.tv_sec) * 1000000000 + (now.tv_nsec - g_last_time.tv_nsec)) / 100000000;
    m << "outside any collective, " << tenths / 10 << "." << tenths % 10 << " s after its last one (" << g_last << ")\n";
  } else {
    m << "before its first collective\n";
  }
  (void)!write(2, m.buf, m.n);
  _exit(143);
}

std::chrono::milliseconds default_timeout() {
  if (const char* s = std::getenv("SINTER_DIST_TIMEOUT")) {
    char* end = nullptr;
    const double v = std::strtod(s, &end);
    if (end != s && v > 0) return std::chrono::milliseconds(int64_t(v * 1000));
  }
  return std::chrono::seconds(60);
}

// Nothing to exchange: every collective is a copy (or nothing) and completes at once.
class SingleGroup final : public ProcessGroup {
 public:
  explicit SingleGroup(std::string name) : ProcessGroup(0, 1, std::move(name)) {}
  Work all_reduce(Tensor&, ReduceOp) override { return {}; }
  Work all_gather(const Tensor& in, Tensor& out, const std::vector<int64_t>&) override { return copy(in, out); }
  Work reduce_scatter(const Tensor& in, Tensor& out, const std::vector<int64_t>&, ReduceOp) override { return copy(in, out); }
  Work broadcast(Tensor&, int) override { return {}; }
  Work all_to_all(const Tensor& in, Tensor& out) override { return copy(in, out); }
  Work barrier() override { return {}; }
  std::shared_ptr<ProcessGroup> split(int, int, const std::string& name) override { return std::make_shared<SingleGroup>(name); }

 private:
  static Work copy(const Tensor& in, Tensor& out) {
    if (!in.same(out) && in.numel() > 0) std::memcpy(out.data_ptr(), in.data_ptr(), size_t(in.numel() * in.element_size()));
    return {};
  }
};
}  // namespace

namespace detail {
void (*serve_peer_queries)(const char* waiting) = nullptr;
}

Work::Work(std::function<bool()> test, std::function<void()> finish, std::string what, int rank,
           std::chrono::steady_clock::time_point deadline, std::function<std::string()> blame)
    : test_(std::move(test)), finish_(std::move(finish)), what_(std::move(what)), rank_(rank), deadline_(deadline),
      blame_(std::move(blame)) {}

void Work::wait() {
  if (!test_) return;
  const size_t len = std::min(what_.size(), sizeof g_waiting - 1);
  std::memcpy(g_waiting, what_.data(), len);
  g_waiting[len] = '\0';
  const auto start = std::chrono::steady_clock::now();
  // Spin briefly (fast collectives), then yield, then sleep: ranks may outnumber cores.
  for (int64_t polls = 0; !test_(); ++polls) {
    if (polls < 200) continue;
    const auto now = std::chrono::steady_clock::now();
    if (now > deadline_) {
      const double waited = std::chrono::duration<double>(now - start).count();
      const std::string msg = "[dist] rank " + std::to_string(rank_) + ": " + what_ + " missed its deadline (waited " + fixed(waited, 1) + " s). ";
      const std::string blame = blame_ ? blame_() : std::string();
      abort_job(msg + (blame.empty() ? std::string("A peer rank is stalled or gone.") : blame) + " Ending the job.", 2);
    }
    if (polls < 2000) {
      std::this_thread::yield();
    } else {
      if (detail::serve_peer_queries) detail::serve_peer_queries(g_waiting);
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  std::memcpy(g_last, g_waiting, sizeof g_last);
  clock_gettime(CLOCK_MONOTONIC, &g_last_time);
  g_waiting[0] = 0;
  test_ = nullptr;
  if (finish_) finish_(), finish_ = nullptr;
}

ProcessGroup::ProcessGroup(int rank, int size, std::string name)
    : rank_(rank), size_(size), name_(std::move(name)), timeout_(default_timeout()) {
  std::lock_guard<std::mutex> lock(g_mu);
  id_ = int64_t(g_groups.size());
  g_groups.push_back(this);
}

ProcessGroup::~ProcessGroup() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_groups[size_t(id_)] = nullptr;
}

ProcessGroup& group_by_id(int64_t id) {
  std::lock_guard<std::mutex> lock(g_mu);
  SINTER_CHECK_T(DistError, id >= 0 && id < int64_t(g_groups.size()) && g_groups[size_t(id)], "[dist] process group ", id,
                 " does not exist (destroyed, or from another process)");
  return *g_groups[size_t(id)];
}

Traffic total_traffic() {
  std::lock_guard<std::mutex> lock(g_mu);
  Traffic t;
  for (ProcessGroup* g : g_groups)
    if (g) t.bytes += g->traffic().bytes, t.calls += g->traffic().calls;
  return t;
}

void init() {
  if (g_world) return;
  if (std::getenv("OMPI_COMM_WORLD_SIZE")) {
    g_world = detail::make_mpi_world();
    g_mpi = true;
    g_rank = g_world->rank();
    std::signal(SIGTERM, on_sigterm);
    // Ranks share the machine: split its cores between them unless the user chose.
    if (!std::getenv("OMP_NUM_THREADS")) {
      const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
      const int per_node = local ? std::max(1, std::atoi(local)) : 1;
      set_num_threads(std::max(1, int(std::thread::hardware_concurrency()) / per_node));
    }
  } else {
    g_world = std::make_shared<SingleGroup>("world");
  }
}

bool is_mpi() { return init(), g_mpi; }
std::shared_ptr<ProcessGroup> world() { return init(), g_world; }
int rank() { return world()->rank(); }
int world_size() { return world()->size(); }

void abort_job(const std::string& message, int code) {
  const std::string line = message + "\n";  // the job is ending: stderr is where its reason can go
  (void)!write(2, line.data(), line.size());
  if (g_mpi) detail::mpi_abort(code);
  std::_Exit(code);
}

}  // namespace sinter::dist

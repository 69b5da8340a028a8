// The OpenMPI backend: every collective is a non-blocking MPI call whose request the Work handle
// polls against its deadline. Only the calling thread talks to MPI (MPI_THREAD_FUNNELED).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <thread>

#include "distributed/backend.h"

#define SINTER_MPI_CHECK(expr)                                                                        \
  do {                                                                                                \
    const int rc_ = (expr);                                                                           \
    if (rc_ != MPI_SUCCESS) {                                                                         \
      char err_[MPI_MAX_ERROR_STRING];                                                                \
      int len_ = 0;                                                                                   \
      MPI_Error_string(rc_, err_, &len_);                                                             \
      SINTER_THROW(DistError, "[dist] ", #expr, " failed: ", std::string(err_, size_t(len_)), " (", __FILE__, ":", \
                   __LINE__, ")");                                                                    \
    }                                                                                                 \
  } while (0)

namespace sinter::dist {
namespace {

MPI_Datatype mpi_type(DType t, const char* op) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i64: return MPI_INT64_T;
    case DType::i32: return MPI_INT32_T;
    default: SINTER_THROW(DTypeError, "[", op, "] reductions take f32, f64, i32 or i64 tensors, got ", dtype_name(t));
  }
}

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::max ? MPI_MAX : MPI_SUM; }

int as_int(int64_t n, const char* op) {
  SINTER_CHECK_T(DistError, n <= INT_MAX, "[", op, "] ", n, " elements exceed MPI's int count; split the tensor");
  return int(n);
}

void check_contiguous(const Tensor& t, const char* op) {
  SINTER_CHECK_T(DistError, t.numel() == 0 || (t.is_contiguous() && !t.is_symbolic()), "[", op,
                 "] needs a contiguous CPU tensor, got ", t.shape());
}

// An empty piece still takes part in the collective; MPI only needs a valid address for it.
void* ptr(const Tensor& t) {
  static char empty[64];
  return t.numel() == 0 ? empty : t.data_ptr();
}

// Divides by n in place after an avg reduction (MPI has no average).
void divide(Tensor& t, int n) {
  if (t.numel() == 0) return;
  if (t.dtype() == DType::f32) for (float* p = t.data<float>(), *e = p + t.numel(); p != e; ++p) *p /= float(n);
  else if (t.dtype() == DType::f64) for (double* p = t.data<double>(), *e = p + t.numel(); p != e; ++p) *p /= double(n);
  else SINTER_THROW(DTypeError, "[all_reduce] avg needs a floating tensor, got ", dtype_name(t.dtype()));
}

// Where-are-you questions between ranks, on a communicator of their own so they never match a
// collective's messages. A rank answers while it polls a collective (Work::wait), with the
// collective it waits in; a rank busy elsewhere, stalled or dead does not answer.
MPI_Comm g_diag = MPI_COMM_NULL;
constexpr int kQueryTag = 1, kReplyTag = 2;

void serve_queries(const char* waiting) {
  static std::deque<std::string> replies;  // send buffers must outlive their requests
  for (;;) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kQueryTag, g_diag, &flag, &st) != MPI_SUCCESS || !flag) return;
    char q = 0;
    MPI_Recv(&q, 1, MPI_CHAR, st.MPI_SOURCE, kQueryTag, g_diag, MPI_STATUS_IGNORE);
    replies.emplace_back(waiting);
    MPI_Request req;
    if (MPI_Isend(replies.back().data(), int(replies.back().size()), MPI_CHAR, st.MPI_SOURCE, kReplyTag, g_diag, &req) ==
        MPI_SUCCESS)
      MPI_Request_free(&req);
  }
}

// Asks every other member of a group (world ranks) where it is, for up to two seconds, and says
// which ones had not arrived at `what`.
std::string ask_peers(const std::vector<int>& members, const std::string& what) {
  int self = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &self);
  static const char q = '?';
  for (int m : members) {
    MPI_Request req;
    if (m != self && MPI_Isend(&q, 1, MPI_CHAR, m, kQueryTag, g_diag, &req) == MPI_SUCCESS) MPI_Request_free(&req);
  }
  std::map<int, std::string> answers;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (answers.size() + 1 < members.size() && std::chrono::steady_clock::now() < until) {
    serve_queries(what.c_str());  // the other waiting ranks ask too
    int flag = 0, n = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kReplyTag, g_diag, &flag, &st) == MPI_SUCCESS && flag) {
      MPI_Get_count(&st, MPI_CHAR, &n);
      std::string text(size_t(std::max(n, 0)), '\0');
      MPI_Recv(text.data(), n, MPI_CHAR, st.MPI_SOURCE, kReplyTag, g_diag, MPI_STATUS_IGNORE);
      answers[st.MPI_SOURCE] = std::move(text);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  std::string missing, elsewhere, arrived;
  for (int m : members) {
    if (m == self) continue;
    const auto it = answers.find(m);
    if (it == answers.end()) missing += (missing.empty() ? "" : ", ") + std::to_string(m);
    else if (it->second == what) arrived += (arrived.empty() ? "" : ", ") + std::to_string(m);
    else elsewhere += " Rank " + std::to_string(m) + " waits in a different collective: " + it->second + ".";
  }
  std::string out;
  if (!missing.empty())
    out += "Not arrived: rank " + missing + " (no answer within 2 s: busy or stalled outside any collective, or gone).";
  out += elsewhere;
  if (!arrived.empty()) out += " Waiting with this rank: rank " + arrived + ".";
  return out;
}

struct Finalizer {
  ~Finalizer() {
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (init && !fin) {
      if (g_diag != MPI_COMM_NULL) MPI_Comm_free(&g_diag);
      MPI_Finalize();
    }
  }
};

class MPIGroup final : public ProcessGroup {
 public:
  MPIGroup(MPI_Comm comm, std::string name, bool owned)
      : ProcessGroup(comm_rank(comm), comm_size(comm), std::move(name)), comm_(comm), owned_(owned),
        members_(world_ranks(comm)) {}
  ~MPIGroup() override {
    int fin = 0;
    MPI_Finalized(&fin);
    if (owned_ && !fin) MPI_Comm_free(&comm_);
  }

  Work all_reduce(Tensor& t, ReduceOp op) override {
    check_contiguous(t, "all_reduce");
    auto req = std::make_shared<MPI_Request>();
    SINTER_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, ptr(t), as_int(t.numel(), "all_reduce"),
                                    mpi_type(t.dtype(), "all_reduce"), mpi_op(op), comm_, req.get()));
    count(2 * (size_ - 1) * t.numel() * t.element_size() / size_);
    Tensor keep = t;
    const int n = size_;
    return make_work(req, "all_reduce", keep.numel() * keep.element_size(), [keep, op, n]() mutable {
      if (op == ReduceOp::avg) divide(keep, n);
    });
  }

  Work all_gather(const Tensor& in, Tensor& out, const std::vector<int64_t>& counts) override {
    check_contiguous(in, "all_gather");
    check_contiguous(out, "all_gather");
    auto v = displacements(counts, in.element_size(), "all_gather");
    SINTER_CHECK_T(DistError, in.numel() == counts[size_t(rank_)] && out.numel() == v->total / in.element_size(),
                   "[all_gather] rank ", rank_, " sends ", in.numel(), " elements and receives ", out.numel(),
                   " but the counts say ", counts[size_t(rank_)], " and ", v->total / in.element_size());
    auto req = std::make_shared<MPI_Request>();
    SINTER_MPI_CHECK(MPI_Iallgatherv(ptr(in), v->counts[size_t(rank_)], MPI_BYTE, ptr(out), v->counts.data(),
                                     v->displs.data(), MPI_BYTE, comm_, req.get()));
    count(v->total * (size_ - 1) / size_);
    return make_work(req, "all_gather", v->total, [v, in, out] {});
  }

  Work reduce_scatter(const Tensor& in, Tensor& out, const std::vector<int64_t>& counts, ReduceOp op) override {
    check_contiguous(in, "reduce_scatter");
    check_contiguous(out, "reduce_scatter");
    std::vector<int> c(counts.size());
    int64_t total = 0;
    for (size_t i = 0; i < counts.size(); ++i) c[i] = as_int(counts[i], "reduce_scatter"), total += counts[i];
    SINTER_CHECK_T(DistError, int64_t(counts.size()) == size_ && in.numel() == total && out.numel() == counts[size_t(rank_)],
                   "[reduce_scatter] rank ", rank_, " has ", in.numel(), " elements in and ", out.numel(),
                   " out, but the counts sum to ", total, " with ", counts[size_t(rank_)], " here");
    auto cs = std::make_shared<std::vector<int>>(std::move(c));
    auto req = std::make_shared<MPI_Request>();
    SINTER_MPI_CHECK(MPI_Ireduce_scatter(ptr(in), ptr(out), cs->data(), mpi_type(in.dtype(), "reduce_scatter"),
                                         mpi_op(op), comm_, req.get()));
    count((size_ - 1) * total * in.element_size() / size_);
    const int n = size_;
    Tensor keep = out;
    return make_work(req, "reduce_scatter", total * in.element_size(), [cs, in, keep, op, n]() mutable {
      if (op == ReduceOp::avg) divide(keep, n);
    });
  }

  Work broadcast(Tensor& t, int root) override {
    check_contiguous(t, "broadcast");
    auto req = std::make_shared<MPI_Request>();
    SINTER_MPI_CHECK(MPI_Ibcast(ptr(t), as_int(t.numel() * t.element_size(), "broadcast"), MPI_BYTE, root, comm_,
                                req.get()));
    if (rank_ == root) count(t.numel() * t.element_size());
    return make_work(req, "broadcast", t.numel() * t.element_size(), [t] {});
  }

  Work all_to_all(const Tensor& in, Tensor& out) override {
    check_contiguous(in, "all_to_all");
    check_contiguous(out, "all_to_all");
    const int64_t bytes = in.numel() * in.element_size();
    SINTER_CHECK_T(DistError, in.numel() % size_ == 0 && out.numel() == in.numel(), "[all_to_all] ", in.numel(),
                   " elements in, ", out.numel(), " out: both must be the same multiple of the group size ", size_);
    auto req = std::make_shared<MPI_Request>();
    SINTER_MPI_CHECK(MPI_Ialltoall(ptr(in), as_int(bytes / size_, "all_to_all"), MPI_BYTE, ptr(out),
                                   int(bytes / size_), MPI_BYTE, comm_, req.get()));
    count((size_ - 1) * bytes / size_);
    return make_work(req, "all_to_all", bytes, [in, out] {});
  }

  Work barrier() override {
    auto req = std::make_shared<MPI_Request>();
    SINTER_MPI_CHECK(MPI_Ibarrier(comm_, req.get()));
    return make_work(req, "barrier", 0, [] {});
  }

  std::shared_ptr<ProcessGroup> split(int color, int key, const std::string& name) override {
    MPI_Comm sub;
    SINTER_MPI_CHECK(MPI_Comm_split(comm_, color, key, &sub));
    return std::make_shared<MPIGroup>(sub, name, true);
  }

 private:
  struct Displs {
    std::vector<int> counts, displs;
    int64_t total = 0;
  };
  std::shared_ptr<Displs> displacements(const std::vector<int64_t>& counts, int64_t esize, const char* op) const {
    SINTER_CHECK_T(DistError, int64_t(counts.size()) == size_, "[", op, "] ", counts.size(), " counts for a group of ", size_);
    auto d = std::make_shared<Displs>();
    for (int64_t c : counts) {
      d->counts.push_back(as_int(c * esize, op));
      d->displs.push_back(as_int(d->total, op));
      d->total += c * esize;
    }
    return d;
  }

  Work make_work(std::shared_ptr<MPI_Request> req, const char* op, int64_t bytes, std::function<void()> finish) {
    auto test = [req] {
      int flag = 0;
      SINTER_MPI_CHECK(MPI_Test(req.get(), &flag, MPI_STATUS_IGNORE));
      return flag != 0;
    };
    std::string what = std::string(op) + " on group '" + name_ + "' (" + std::to_string(size_) + " ranks, " +
                       std::to_string(bytes) + " bytes, call " + std::to_string(++calls_) + ")";
    auto blame = [members = members_, what] { return ask_peers(members, what); };
    return Work(std::move(test), std::move(finish), std::move(what), rank_, deadline(), std::move(blame));
  }

  static int comm_rank(MPI_Comm c) { int r = 0; MPI_Comm_rank(c, &r); return r; }
  static int comm_size(MPI_Comm c) { int s = 0; MPI_Comm_size(c, &s); return s; }
  static std::vector<int> world_ranks(MPI_Comm c) {
    MPI_Group g, w;
    MPI_Comm_group(c, &g);
    MPI_Comm_group(MPI_COMM_WORLD, &w);
    std::vector<int> mine(size_t(comm_size(c))), world(mine.size());
    for (size_t i = 0; i < mine.size(); ++i) mine[i] = int(i);
    MPI_Group_translate_ranks(g, int(mine.size()), mine.data(), w, world.data());
    MPI_Group_free(&g);
    MPI_Group_free(&w);
    return world;
  }

  MPI_Comm comm_;
  bool owned_;
  std::vector<int> members_;  // world rank of each group rank
  int64_t calls_ = 0;         // collectives issued, in the same order on every member
};

}  // namespace

namespace detail {

std::shared_ptr<ProcessGroup> make_mpi_world() {
  static Finalizer finalizer;  // destroyed after every group made later (function-local statics die in reverse)
  int init = 0;
  MPI_Initialized(&init);
  if (!init) {
    int provided = 0;
    SINTER_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided));
  }
  // Errors come back as codes (and become exceptions), not as MPI's own abort.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  SINTER_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &g_diag));
  serve_peer_queries = serve_queries;
  return std::make_shared<MPIGroup>(MPI_COMM_WORLD, "world", false);
}

void mpi_abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

}  // namespace detail
}  // namespace sinter::dist

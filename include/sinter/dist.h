#pragma once
// Distributed: process groups (OpenMPI on the CPU, or one process alone), a device mesh with named
// dimensions, DTensor (a local shard plus its placements), and the collectives as ops with backward.
// The same binary runs alone or under `mpirun`: dist::init() picks the backend from the environment.
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sinter/nn.h"
#include "sinter/tensor.h"

namespace sinter::dist {

enum class ReduceOp { sum, avg, max };

// Bytes this rank put on the wire for each collective, counted as a ring algorithm moves them (the
// convention of nccl-tests' "bus bandwidth"): with n ranks and a payload of S bytes, all_reduce
// 2 (n-1)/n S, all_gather (n-1)/n S of the output, reduce_scatter (n-1)/n S of the input,
// all_to_all (n-1)/n S, broadcast S (root only). The library's actual algorithm may differ; this
// is the volume a cost model reasons with.
struct Traffic {
  int64_t bytes = 0;
  int64_t calls = 0;
};

// A pending collective. wait() returns when it is done, or ends the job when its deadline passes:
// the message names the rank, the collective, the group, how long it waited and, from `blame`, which
// peers had not arrived; then MPI_Abort takes every rank down (a rank that stalls or dies cannot hang
// the others).
class Work {
 public:
  Work() = default;  // already complete
  Work(std::function<bool()> test, std::function<void()> finish, std::string what, int rank,
       std::chrono::steady_clock::time_point deadline, std::function<std::string()> blame = {});
  void wait();
  bool done() const { return !test_; }

 private:
  std::function<bool()> test_;
  std::function<void()> finish_;
  std::string what_;
  int rank_ = 0;
  std::chrono::steady_clock::time_point deadline_;
  std::function<std::string()> blame_;
};

// Collectives on contiguous CPU tensors, flattened; the result is valid after wait(). An NCCL
// backend implements the same interface on device tensors.
class ProcessGroup {
 public:
  virtual ~ProcessGroup();
  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  int64_t id() const { return id_; }  // how ops name this group in their attributes

  virtual Work all_reduce(Tensor& t, ReduceOp op) = 0;                       // in place
  // out = the inputs of every rank concatenated in rank order; counts[r] elements from rank r.
  virtual Work all_gather(const Tensor& in, Tensor& out, const std::vector<int64_t>& counts) = 0;
  // out = this rank's block (counts[rank] elements) of the reduction of every rank's `in`.
  virtual Work reduce_scatter(const Tensor& in, Tensor& out, const std::vector<int64_t>& counts, ReduceOp op) = 0;
  virtual Work broadcast(Tensor& t, int root) = 0;
  // in and out hold size() equal blocks; block j of `in` goes to rank j, block r of `out` came from rank r.
  virtual Work all_to_all(const Tensor& in, Tensor& out) = 0;
  virtual Work barrier() = 0;
  // A new group of the ranks that pass the same color, ordered by key (collective over this group).
  virtual std::shared_ptr<ProcessGroup> split(int color, int key, const std::string& name) = 0;

  const Traffic& traffic() const { return traffic_; }
  void reset_traffic() { traffic_ = {}; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }

 protected:
  ProcessGroup(int rank, int size, std::string name);
  void count(int64_t bytes) { traffic_.bytes += bytes, traffic_.calls += 1; }
  std::chrono::steady_clock::time_point deadline() const { return std::chrono::steady_clock::now() + timeout_; }
  int rank_, size_;
  std::string name_;
  int64_t id_;
  Traffic traffic_;
  std::chrono::milliseconds timeout_;
};

// Starts the distributed runtime once per process: OpenMPI when launched by mpirun (the
// OMPI_COMM_WORLD_SIZE variable), else a single-process group. Collective timeout: the
// SINTER_DIST_TIMEOUT variable in seconds (default 60). Safe to call more than once.
void init();
bool is_mpi();                                   // running under mpirun
std::shared_ptr<ProcessGroup> world();           // init()s on first use
int rank();                                      // of the world
int world_size();
ProcessGroup& group_by_id(int64_t id);           // what collective ops use to find their group
Traffic total_traffic();                          // this rank's traffic summed over every live group
// Ends the whole job (every rank) with `message` on stderr: MPI_Abort under mpirun, exit otherwise.
[[noreturn]] void abort_job(const std::string& message, int code = 1);

// A mesh of ranks with named dimensions, laid out row-major over the world's ranks
// ({"dp": 2, "tp": 2}: ranks 0,1 share dp index 0; tp groups are {0,1} and {2,3}). Creating one is
// collective: every rank must build the same mesh in the same order.
class DeviceMesh {
 public:
  DeviceMesh() = default;
  explicit DeviceMesh(const std::vector<std::pair<std::string, int64_t>>& dims);
  int64_t ndim() const { return int64_t(names_.size()); }
  int64_t size(int64_t d) const { return sizes_.at(size_t(d)); }
  int64_t size() const;                            // ranks in the mesh
  int64_t index(const std::string& name) const;    // dimension by name; error lists the names
  const std::string& name(int64_t d) const { return names_.at(size_t(d)); }
  int64_t coordinate(int64_t d) const { return coords_.at(size_t(d)); }  // this rank's place along d
  ProcessGroup& group(int64_t d) const { return *groups_.at(size_t(d)); }
  // The 1-D mesh along one named dimension (sharing its communicator).
  DeviceMesh operator[](const std::string& name) const;
  // This mesh's dimensions followed by `inner`'s (dimensions of one larger mesh, names distinct):
  // mesh["tp"].join(mesh["dp"]) describes a tensor split by tp first and each piece by dp (FSDP
  // over TP).
  DeviceMesh join(const DeviceMesh& inner) const;
  std::string to_string() const;                   // "DeviceMesh(dp=2, tp=2)"

 private:
  std::vector<std::string> names_;
  std::vector<int64_t> sizes_, coords_;
  std::vector<std::shared_ptr<ProcessGroup>> groups_;
};

// How a DTensor is laid out along one mesh dimension.
struct Placement {
  enum class Kind { shard, replicate, partial } kind = Kind::replicate;
  int64_t dim = 0;  // the tensor dimension, for shard
  static Placement Shard(int64_t d) { return {Kind::shard, d}; }
  static Placement Replicate() { return {Kind::replicate, 0}; }
  static Placement Partial() { return {Kind::partial, 0}; }  // a sum over the mesh dimension
  bool is_shard() const { return kind == Kind::shard; }
  bool is_partial() const { return kind == Kind::partial; }
  bool is_replicate() const { return kind == Kind::replicate; }
  bool operator==(const Placement&) const = default;
  std::string to_string() const;                   // "Shard(0)", "Replicate()", "Partial(sum)"
};
using Placements = std::vector<Placement>;

// Where a shard of a dimension of `length` split over `parts` ranks starts and how long it is:
// torch.chunk's rule (blocks of ceil(length / parts); the last ones may be short or empty).
std::pair<int64_t, int64_t> shard_range(int64_t length, int64_t parts, int64_t index);

// A tensor distributed over a mesh: this rank's local piece, one placement per mesh dimension,
// and the global shape. Shards may be uneven (torch.chunk's rule) or empty. Redistribution runs
// collective ops with backward, so gradients flow through it like any other op.
class DTensor {
 public:
  DTensor() = default;
  DTensor(Tensor local, DeviceMesh mesh, Placements placements, Shape global_shape);
  // Wraps a local piece; the global shape is computed from the shards' sizes (collective).
  static DTensor from_local(Tensor local, DeviceMesh mesh, Placements placements);

  const Tensor& to_local() const { return local_; }
  const DeviceMesh& mesh() const { return mesh_; }
  const Placements& placements() const { return placements_; }
  const Shape& shape() const { return shape_; }
  // To other placements. `grad_placements` says how the gradient of the result will be laid out
  // (default: like the result); a replicated result consumed by rank-specific computation has a
  // Partial gradient, which the backward then sums.
  DTensor redistribute(const Placements& target, const Placements& grad_placements = {}) const;
  Tensor full_tensor() const;  // every rank gets the whole tensor
  std::string to_string() const;

 private:
  Tensor local_;
  DeviceMesh mesh_;
  Placements placements_;
  Shape shape_;
};

// Every rank passes the same full tensor; each keeps its piece (Partial: the value on coordinate 0,
// zeros elsewhere).
DTensor distribute_tensor(const Tensor& full, const DeviceMesh& mesh, const Placements& placements);

// The collectives as ops (eager, autograd). `grad_partial`: the gradient of the output differs
// across the group's ranks (each rank's own loss term), so the backward reduces it; otherwise it is
// the same on every rank and the backward only keeps this rank's part.
Tensor all_reduce(const Tensor& x, ProcessGroup& g, ReduceOp op = ReduceOp::sum, bool grad_partial = false);
Tensor all_gather(const Tensor& x, ProcessGroup& g, int64_t dim, const std::vector<int64_t>& sizes,
                  bool grad_partial = false, ReduceOp grad_op = ReduceOp::sum);
Tensor reduce_scatter(const Tensor& x, ProcessGroup& g, int64_t dim, const std::vector<int64_t>& sizes,
                      ReduceOp op = ReduceOp::sum);
Tensor all_to_all(const Tensor& x, ProcessGroup& g, int64_t split_dim, int64_t concat_dim);
Tensor broadcast(const Tensor& x, ProcessGroup& g, int root);
// Identity forward, all_reduce(sum) of the gradient: a replicated input entering computation that
// each rank does differently (Megatron's "f").
Tensor copy_to_group(const Tensor& x, ProcessGroup& g);
// This rank's shard along `dim` (torch.chunk's rule); the backward all-gathers the gradient.
Tensor shard(const Tensor& x, ProcessGroup& g, int64_t dim);

// Sizes of every rank's shard along a dimension of `length` split over `parts`.
std::vector<int64_t> shard_sizes(int64_t length, int64_t parts);

// ---- Tensor parallelism and FSDP over nn modules ----

// Megatron-style layer splits. Colwise: a Linear's output features split (input replicated,
// output sharded on its last dim); Rowwise: its input features split (partial sums completed by
// an all_reduce, bias added once). On an Embedding, Rowwise splits the vocabulary (an all_reduce
// sums the rows), Colwise the embedding dim. SequenceParallel (norms): each rank normalizes its
// slice of the sequence; with it, colwise layers all-gather their input and rowwise layers
// reduce-scatter their output (activations between blocks 1/tp). docs/distributed.md has more.
enum class TPStyle { colwise, rowwise, sequence_parallel };
// Module names (dotted, '*' matches one part: "blocks.*.attn.q_proj") and their styles.
using ParallelizePlan = std::vector<std::pair<std::string, TPStyle>>;
// Shards the matched layers' parameters over `tp` (a 1-D mesh) and installs their styles. Every
// rank must hold the same full parameters when this runs (the same seed or checkpoint).
void parallelize_module(nn::Module& root, const DeviceMesh& tp, const ParallelizePlan& plan, bool sequence_parallel = false);
// PrepareModuleInput / PrepareModuleOutput: a layer's input is redistributed over the tp mesh
// before its forward and its output after (e.g. a batch-split input gathered to Replicate, or a
// replicated output split again). Layouts describe the local tensors (the global shape is
// found from every rank's piece); empty lists leave that side alone. Applies to Linear, Embedding and norm layers, over any style they have.
struct PrepareModuleIO {
  Placements input_layouts, desired_input_layouts, output_layouts, desired_output_layouts;
};
void prepare_module_io(nn::Module& root, const DeviceMesh& tp, const std::string& pattern, const PrepareModuleIO& io);

// The plan for Sinter's GPT/LLaMA models: q/k/v and fc/gate/up colwise, o_proj and proj/down
// rowwise, the token embedding vocabulary-parallel with the head's logits left sharded and the
// loss computed by loss_parallel (never the full logits). Heads must divide by tp. With
// sequence_parallel the norms take SequenceParallel and the first block's input is split along
// the sequence (PrepareModuleInput), which must divide by tp.
void parallelize_gpt(nn::GPT& model, const DeviceMesh& tp, bool sequence_parallel = false);

// Cross-entropy of logits sharded over the vocabulary (B..., V/tp on each rank, rank r holding
// [vocab_start, vocab_start + V_local)): max, sum of exponentials and the target's logit are
// all-reduced; the full logits never exist on one rank. Mean over targets, like cross_entropy.
Tensor loss_parallel(const Tensor& local_logits, const Tensor& targets, ProcessGroup& tp, int64_t vocab_start);

// FSDP: the module's parameters (those not already in a sub-unit) become shards along dim 0 over
// `dp`; its forward all-gathers them first and the backward reduce-scatters the gradients
// (averaged over dp: each rank's loss is the mean over its slice of the batch). With
// reshard_after_forward the gathered copies are freed when the unit's forward ends and gathered
// again when the backward needs them (one unit's weights alive at a time, three collectives per
// parameter per step); without, autograd keeps them until the backward (two). The optimizer,
// built after this, sees and keeps state only for the shards.
void fully_shard(nn::Module& module, const DeviceMesh& dp, bool reshard_after_forward = true);
// Every transformer block a unit, then the rest of the model as the root unit.
void fully_shard_gpt(nn::GPT& model, const DeviceMesh& dp, bool reshard_after_forward = true);
// Bytes of gathered (whole) FSDP parameters alive right now on this rank.
int64_t fsdp_gathered_bytes();
// Parameter gathers on this rank since the start: for forwards (of which `prefetched` were started
// by the previous unit) and again for backwards.
struct FSDPStats {
  int64_t forward = 0, prefetched = 0, backward = 0;
};
FSDPStats fsdp_stats();

// How a parameter of a parallelised model is laid out, to gather it (checkpoints) or to count it
// once (gradient norms). Null for a parameter no parallelism touched (replicated everywhere).
std::optional<DTensor> parameter_layout(const Tensor& param);
// The whole parameter on every rank (collective over its layout's mesh); `param` itself if plain.
Tensor full_parameter(const Tensor& param);
// Gradient clipping over a parallelised model: the global norm (returned, 0-d f64) counts every
// element once.
Tensor clip_grad_norm(const std::vector<Tensor>& params, double max_norm);

// ---- Sharded checkpoints ----
// <dir>/<stem>-GEN.shard-RRRRR-of-WWWWW.safetensors per rank (the pieces it owns: one copy of each
// replicated piece) and <dir>/<stem>.index.json (global shape, dtype, and where every piece lives),
// written by rank 0 last and atomically: an interrupted save leaves the previous checkpoint whole.
// `replicated`: plain tensors, the same on every rank (rank 0 writes them). Collective.
void save_sharded(const std::string& dir, const std::string& stem, const std::map<std::string, DTensor>& tensors,
                  const std::map<std::string, Tensor>& replicated = {});
bool has_sharded(const std::string& dir, const std::string& stem);
// Whole tensors, from however many ranks wrote them (no communication: one process can read it).
std::map<std::string, Tensor> load_sharded(const std::string& dir, const std::string& stem);
// This rank's pieces only, for any layout (resharding): each target's local tensor is filled in
// place from the overlapping saved pieces; `whole` tensors are filled entirely.
void load_sharded_into(const std::string& dir, const std::string& stem, const std::map<std::string, DTensor>& targets,
                       const std::map<std::string, Tensor>& whole = {});

}  // namespace sinter::dist

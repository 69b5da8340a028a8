#pragma once
// Training (Trainer: start or resume, step, evaluate, save), 2:4 sparsification and generation,
// and checkpoints (model.safetensors + config.json + optimizer.safetensors + train_state.json,
// each written atomically). The library prints nothing: long work reports through a Progress
// callback, which the sinter command line turns into its progress line.
#include <array>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sinter/aot.h"
#include "sinter/compile.h"
#include "sinter/data.h"
#include "sinter/nn.h"
#include "sinter/optim.h"

namespace sinter::train {

struct Options {
  std::string preset = "tiny";
  std::string config_path;   // a config.json instead of a preset
  std::string init_dir;      // start from this checkpoint's weights (Sinter's or Hugging Face's), fresh optimizer
  std::string data_path;     // empty: the fortunes corpus
  std::string out_dir = "out/tiny";
  int64_t steps = 1200;
  int64_t batch = 16;
  // Each step's batch runs as grad_accum micro-batches of batch / grad_accum sequences (per dp
  // rank): their gradients add up to the whole batch's, with one micro-batch's activations held.
  int64_t grad_accum = 1;
  // Each transformer block's activations are recomputed in the backward instead of kept
  // (nn::GPT::checkpoint_activations): less memory, about one more forward per step.
  bool checkpoint_activations = false;
  int64_t seq_len = 128;
  double lr = 4e-3, min_lr = 4e-4, weight_decay = 0.1, grad_clip = 1.0;
  int64_t warmup = 60;
  uint64_t seed = 1337;
  int64_t val_every = 200, val_batches = 8, log_every = 10, save_every = 500;
  // An --out folder that holds a checkpoint is continued (resume), replaced (overwrite) or refused.
  // Resume checks that the data, batch, sequence length and model match the checkpoint's
  // (allow_changes: continue on other data or shapes, as fine-tuning does).
  bool resume = false, overwrite = false, allow_changes = false;
  int keep = 2;              // checkpoint steps kept in out_dir (the last committed and those before it)
  int64_t stop_after = 0;    // stop (with a checkpoint) after this step, as an interruption would
  bool quiet = false;        // no Progress reports
  std::string dtype = "f32";  // "bf16": linear layers compute in bf16 (autocast), master weights stay f32
  // Where the model, optimizer and batches live: "cpu", "cuda" or "cuda:N" (one process, eager
  // steps). Checkpoints hold host bytes either way, so a run resumes on either device.
  std::string device = "cpu";
  // 2-D parallel training under mpirun (tp x dp ranks): tensor parallel over tp, FSDP over dp, the
  // batch split over dp. 1 x 1: one process. Rank 0 prints and writes the (gathered) checkpoint.
  int64_t tp = 1, dp = 1;
  bool sequence_parallel = false;  // with tp > 1: norms and the residual stream split along the sequence
  // One process: each step (forward, backward, clipping, AdamW) runs as one compiled graph
  // (sinter::compile), traced at the first step.
  bool compile = false;
  // A step whose loss or gradient norm is NaN or infinite: "stop" ends the run with an error (the
  // folder keeps its last checkpoint); "skip" drops that step's update (weights and optimizer state
  // stay as they were), logs it and goes on, stopping after max_skips such steps in a row.
  std::string on_nan = "stop";
  int64_t max_skips = 10;
  // Testing: these steps (1-based) read as having a NaN loss and gradient norm, as an overflow would.
  std::vector<int64_t> inject_nan_steps = {};
  std::string to_json() const;
};

// What a run reports as it goes: each logged step (every log_every steps and each validation), a
// skipped update, the first compiled step, a pruned model. The callback runs on the training thread.
struct Progress {
  enum class Event { step, skipped, compiled, pruned };
  Event event = Event::step;
  int64_t step = 0, steps = 0;     // the step just taken (1-based) and the run's last
  double loss = NAN, grad_norm = NAN;
  double val_loss = NAN;           // measured at this step, else NaN
  double rate = 0;                 // tokens/s (training) or steps/s (fine-tuning), since the last report
  double elapsed_s = 0, eta_s = 0;
  int64_t skips_in_a_row = 0;      // skipped
  const Explanation* compiled = nullptr;  // compiled: the step's program (valid during the call)
  int64_t layers = 0;              // pruned: Linear layers pruned to 2:4; loss and val_loss before and after
};
using ProgressFn = std::function<void(const Progress&)>;

struct Result {
  int64_t step = 0;
  double train_loss = 0, val_loss = 0, tokens_per_s = 0;
  std::vector<double> losses;       // the training loss of every step this run took
  std::vector<int64_t> step_bytes;  // parallel runs: bytes this rank sent in each step (validation excluded)
  std::vector<int64_t> skipped;     // on_nan "skip": the steps whose update was dropped
};

// One training step, as `sinter train` takes it: the next-token loss of x against y (linear layers
// in `compute`: bf16 is autocast), backward, gradient clipping, the optimizer's update. Returns the
// loss. A model with parallel parameters (TP, FSDP) clips by the global norm across ranks
// (dist::clip_grad_norm). In one process it traces and compiles as one graph (sinter::compile).
Tensor step(nn::GPT& model, optim::Optimizer& opt, const Tensor& x, const Tensor& y, double grad_clip = 1.0,
            DType compute = DType::f32, int64_t micro_batches = 1);
// step() without the update: {loss, the gradients' global norm before clipping}, the clipped
// gradients left on the parameters. `--on-nan skip` checks both before calling opt.step().
// micro_batches > 1 splits x and y into that many parts along the batch: each part's forward
// and backward (its loss scaled by its share of the rows) run one after the other, adding up the
// gradients; the loss returned is the whole batch's mean.
std::array<Tensor, 2> loss_and_gradients(nn::GPT& model, optim::Optimizer& opt, const Tensor& x, const Tensor& y,
                                         double grad_clip = 1.0, DType compute = DType::f32, int64_t micro_batches = 1);

// What a run is, once started (what the command line says before its progress line).
struct RunInfo {
  std::string model_type, data_name, mesh;  // mesh: empty in one process
  int64_t parameters = 0, train_bytes = 0, val_bytes = 0;
  int64_t resumed_at = -1;         // the checkpoint's step when resuming, else -1
  int removed_temporaries = 0;     // files an interrupted save left in out_dir, removed
};

// A training run: the constructor starts one or resumes the one in opts.out_dir (as resume and
// overwrite say; a folder holding a checkpoint is never overwritten silently), builds or loads the
// model and optimizer and splits them over the ranks. step() takes one optimizer step and what is
// due at it: a log row, validation, a checkpoint. Errors name the Options field concerned.
class Trainer {
 public:
  explicit Trainer(const Options& opts, ProgressFn progress = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;
  bool done() const;               // opts.steps (or stop_after) reached
  void step();
  double evaluate();               // the validation loss now (val_batches batches)
  void save();                     // a checkpoint of the step reached
  Result run();                    // step() until done()
  const RunInfo& info() const;
  const Result& result() const;
  nn::GPT& model();

  struct State;
 private:
  std::unique_ptr<State> s_;
};

// Trainer(opts, progress).run(): trains up to opts.steps; writes checkpoint, log.csv and loss.svg.
Result run(const Options& opts, const ProgressFn& progress = {});

// Prune -> fine-tune -> save: every Linear of the transformer blocks of a trained checkpoint is
// pruned to 2:4, optionally fine-tuned with the pattern held (only the kept values train), and
// saved as a sparse checkpoint (model.safetensors + config.json with "sparsity": "2:4").
struct SparsifyOptions {
  std::string checkpoint = "out/tiny";
  std::string out_dir = "out/tiny-2x4";
  std::string data_path;          // empty: the fortunes corpus (what the default model trained on)
  int64_t finetune_steps = 200;   // 0: prune only
  int64_t batch = 16, seq_len = 128, val_batches = 8;
  double lr = 1e-3;
  std::string values = "f32";     // f32, bf16 or i8 (quantised after fine-tuning, per-row scales)
  uint64_t seed = 1337;
  bool quiet = false;             // no Progress reports
};
struct SparsifyResult {
  double dense_val = 0, pruned_val = 0, finetuned_val = 0, saved_val = 0;  // validation loss, nats/byte
  int64_t dense_bytes = 0, sparse_bytes = 0;  // the blocks' Linear weights, as stored
};
// Reports Event::pruned, then every 10th fine-tuning step (rate in steps/s).
SparsifyResult sparsify(const SparsifyOptions& opts, const ProgressFn& progress = {});

// Checkpoints
// A whole-step commit: the step's files (named with train_state_json's "step"), then
// train_state.json naming them; the plain names (model.safetensors, config.json, ...) are then
// linked to them, and the last `keep` steps stay.
void save_checkpoint(const std::string& dir, nn::GPT& model, const std::map<std::string, Tensor>& optimizer_state,
                     const std::string& train_state_json, int keep = 2);
std::unique_ptr<nn::GPT> load_model(const std::string& dir);  // clear errors for missing/corrupt/mismatched files

// Exports a checkpoint for the runtime (sinter/aot.h, libsinter_rt): its graphs are
//   forward (tokens (1, seq)) -> logits (1, seq, V)          no cache
//   prefill (tokens (1, seq)) -> logits (1, seq, V)          fills the KV cache from position 0
//   decode  (tokens (1, 1))   -> logits (1, 1, V)            appends one token to the cache
// The cache (one per layer, max_position_embeddings long) and its position are the session's state.
struct ExportOptions {
  std::string checkpoint, out_dir;
  std::vector<std::string> graphs = {"prefill", "decode", "forward"};
  std::string dynamic;  // "seq=MIN..MAX" (default: 1..max_position_embeddings)
  DType dtype = DType::f32;
  std::string isa = "x86-64-v3";
  std::function<void(const std::string&, int64_t, int64_t)> progress;
};
aot::Exported export_model(const ExportOptions& o);
// The same for a model in memory (o.checkpoint and o.dtype unused: the model as it is).
aot::Exported export_model(nn::GPT& model, const ExportOptions& o);

struct Sampling {
  double temperature = 0.8;  // 0: greedy
  int64_t top_k = 0;         // 0: off
  double top_p = 1.0;        // 1: off
  uint64_t seed = 0;
};
// The next token id from a 1-D row of logits (the model's last position), sampled as `s` says
// (s.seed aside: the draw takes the global generator, which generate seeds with it). The draw runs
// where the logits are; the id comes back in one read (one wait on a GPU).
int64_t sample(const Tensor& logits, const Sampling& s);
// Appends max_new tokens to `prompt` (int64 ids), where the model is (GPT::to(Device)): the KV
// caches and token ids go there too. The model sees at most max_position_embeddings tokens; when
// the window fills it slides forward by half. use_cache=false recomputes the window each step (the
// cache's reference). Reports tokens/s through `rate`. `compiled`: the one-token decode step runs
// as one compiled graph (sinter::compile); `report` sees it at the end. On a GPU with the cache,
// the decode step is a CUDA graph (cuda::Graph) after its first eager run (SINTER_CUDA_GRAPHS=0:
// eager steps; eager where the capture is refused); `decode` says which ran ("eager", "compiled",
// "CUDA graph", "eager (CUDA graph refused: why)").
Tensor generate(nn::GPT& model, const Tensor& prompt, int64_t max_new, const Sampling& s, bool use_cache = true,
                double* rate = nullptr, const std::function<void(int64_t)>& on_token = {}, bool compiled = false,
                const std::function<void(CompiledFunction&)>& report = {}, std::string* decode = nullptr);

double evaluate(nn::GPT& model, const data::ByteDataset& data, int64_t batch, int64_t seq_len, int64_t batches,
                uint64_t seed);

// A line chart (train and validation loss against step) as a standalone SVG.
void write_loss_svg(const std::string& path, const std::vector<std::array<double, 3>>& rows);

}  // namespace sinter::train

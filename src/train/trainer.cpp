// Trainer: AdamW on the byte-level corpus, warmup + cosine, gradient clipping, validation, log rows
// and checkpoints (checkpoint.cpp); alone or under mpirun. Progress goes to the caller's callback.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "io/atomic_file.h"
#include "sinter/autograd.h"
#include "sinter/cuda.h"
#include "sinter/dist.h"
#include "sinter/io.h"
#include "sinter/random.h"
#include "train/internal.h"

namespace sinter::train {

using json = nlohmann::json;
namespace fs = std::filesystem;
using namespace detail;
using Clock = std::chrono::steady_clock;

struct Trainer::State {
  Options o;
  ProgressFn progress;
  data::ByteDataset data;
  bool parallel = false, main_rank = true, resuming = false, sharded_resume = false;
  std::unique_ptr<nn::GPT> model;
  std::optional<dist::DeviceMesh> mesh;
  std::unique_ptr<optim::AdamW> opt;
  Device device;
  DType compute = DType::f32;
  int64_t start = 0, next = 0, last_saved = 0, skips_in_a_row = 0;
  bool stopped = false;  // a step reached Options::stop_after
  LogRows rows;
  Result res;
  RunInfo info;
  std::string fingerprint;
  std::vector<Tensor> params;
  std::optional<CompiledFunction> compiled;
  Clock::time_point t0, t_window;
  int64_t window_tokens = 0;
  double tok_s = 0;

  explicit State(const Options& opts)
      : o(opts), data(opts.data_path.empty() ? data::ByteDataset::fortunes() : data::ByteDataset::from_file(opts.data_path)) {}
  bool reporting() const { return progress && !o.quiet && main_rank; }
  void report(const Progress& p) const {
    if (reporting()) progress(p);
  }
};

namespace {

// A device other than the CPU: one process, eager steps, a device that is there.
void check_device(const Options& o) {
  Device d;
  try {
    d = Device::parse(o.device);
  } catch (const ValueError&) {
    SINTER_THROW(ValueError, "[train] Options::device '", o.device, "' is not a device: cpu, cuda or cuda:N");
  }
  if (d.type == DeviceType::cpu) return;
  SINTER_CHECK(o.tp * o.dp <= 1, "[train] tensor parallel and FSDP training run on CPU processes under mpirun; Options::device ",
               o.device, " trains in one process");
  SINTER_CHECK(!o.compile, "[train] Options::compile generates CPU code; with Options::device ", o.device, " each step runs eagerly");
  cuda::require_device(d.index);
}

void check_options(const Options& o) {
  SINTER_CHECK(o.steps > 0 && o.batch > 0 && o.seq_len > 1, "[train] Options::steps, Options::batch and Options::seq_len must be positive (Options::seq_len > 1)");
  const int64_t rank_batch = o.batch / std::max<int64_t>(o.dp, 1);
  SINTER_CHECK(o.grad_accum >= 1 && rank_batch > 0 && rank_batch % o.grad_accum == 0, "[train] Options::grad_accum ", o.grad_accum,
               " does not divide the ", rank_batch, " sequences of a step", o.dp > 1 ? " per dp rank" : "");
  SINTER_CHECK(o.lr > 0 && o.min_lr >= 0 && o.warmup >= 0 && o.grad_clip > 0 && o.val_every > 0 && o.val_batches > 0,
               "[train] Options::lr, Options::min_lr, Options::warmup, Options::grad_clip, Options::val_every and "
               "Options::val_batches must be positive");
  SINTER_CHECK(!o.out_dir.empty(), "[train] an output folder is needed (Options::out_dir)");
  SINTER_CHECK(!(o.resume && o.overwrite), "[train] Options::resume and Options::overwrite exclude each other");
  SINTER_CHECK(!(o.checkpoint_activations && o.compile), "[train] Options::checkpoint_activations recomputes eager steps; a compiled "
               "step (Options::compile) chooses what its backward recomputes");
  SINTER_CHECK(o.dtype == "f32" || o.dtype == "bf16", "[train] Options::dtype must be f32 or bf16, got '", o.dtype, "'");
  SINTER_CHECK(o.on_nan == "stop" || o.on_nan == "skip", "[train] Options::on_nan must be stop or skip, got '", o.on_nan, "'");
  check_device(o);
  if (o.tp * o.dp > 1) {
    SINTER_CHECK(o.tp >= 1 && o.dp >= 1, "[train] Options::tp and Options::dp must be >= 1, got ", o.tp, " and ", o.dp);
    SINTER_CHECK_T(DistError, o.tp * o.dp == dist::world_size(), "[train] Options::tp ", o.tp, " x Options::dp ", o.dp, " needs ", o.tp * o.dp,
                   " ranks, but the job has ", dist::world_size());
    SINTER_CHECK(o.batch % o.dp == 0, "[train] Options::batch ", o.batch, " does not split over Options::dp ", o.dp);
  }
}

// What a resumed run must share with its checkpoint: the data (by fingerprint), the batch, the
// sequence length and the model it was started with. Refused with every difference named.
void check_resume_matches(const TrainState& st, const Options& o, const data::ByteDataset& data, const std::string& state_path) {
  if (!st.options.is_object()) return;  // a checkpoint from before these were recorded
  const json& was = st.options;
  const json now = json::parse(o.to_json());
  std::string diff;
  for (const char* key : {"data", "batch", "seq_len", "preset", "config", "dtype"})
    if (was.contains(key) && was[key] != now[key]) diff += std::string("\n  ") + key + ": checkpoint " + was[key].dump() + ", now " + now[key].dump();
  if (!st.data_fingerprint.empty() && st.data_fingerprint != data.fingerprint())
    diff += "\n  data contents: checkpoint \"" + st.data_fingerprint + "\", now \"" + data.fingerprint() + "\" (size:hash of the first 64 KiB)";
  SINTER_CHECK(diff.empty(), "[train] Options::resume: this run differs from the checkpoint in ", state_path, ":", diff,
               "\n(Options::allow_changes continues anyway, as fine-tuning on new data does)");
}

// A folder that holds a checkpoint is continued (resume), replaced (overwrite) or refused.
void check_out_dir(const Options& o) {
  const std::string state_path = o.out_dir + "/train_state.json";
  std::error_code ec;
  const bool has_state = fs::exists(state_path, ec);
  const bool has_weights = has_state || fs::exists(o.out_dir + "/model.safetensors", ec) || fs::exists(o.out_dir + "/model.index.json", ec);
  if (o.resume)
    SINTER_CHECK_T(IOError, has_state, "[train] Options::resume: ", o.out_dir, " holds no complete checkpoint (", state_path, " is missing",
                   has_weights ? "; weights without a training state are what an interrupted first save leaves: Options::overwrite starts over" : "", ")");
  else
    SINTER_CHECK_T(IOError, !has_weights || o.overwrite, "[train] ", o.out_dir, " already holds a checkpoint",
                   has_state ? " (" + state_path + ")" : std::string(), ": Options::resume continues it, Options::overwrite replaces it");
}

// The model to train: the checkpoint's (resume), another checkpoint's weights (init_dir), or new.
void load_or_build_model(Trainer::State& s) {
  const Options& o = s.o;
  const std::string state_path = o.out_dir + "/train_state.json";
  if (s.sharded_resume) {  // read piece by piece once the model is split (distribute)
    const std::string cfg_path = committed_path(o.out_dir, "config.json");
    s.model = std::make_unique<nn::GPT>(nn::ModelConfig::from_json(read_file(cfg_path), cfg_path));
  } else if (s.resuming) {
    s.model = load_model(o.out_dir);
  }
  if (s.resuming) {
    const TrainState st = parse_train_state(read_file(state_path), state_path);
    s.start = st.step;
    SINTER_CHECK(s.start < o.steps, "[train] the checkpoint in ", o.out_dir, " is at step ", s.start, "; Options::steps ", o.steps,
                 " leaves nothing to train (raise Options::steps to continue it)");
    if (!o.allow_changes) check_resume_matches(st, o, s.data, state_path);
    s.rows = read_log(o.out_dir, s.start);
  } else if (!o.init_dir.empty()) {
    SINTER_CHECK(o.config_path.empty(), "[train] Options::init_dir takes the model from ", o.init_dir, "; drop Options::config_path");
    check_trains_on_bytes(o.init_dir, "train");
    s.model = load_model(o.init_dir);
  } else {
    nn::ModelConfig cfg = o.config_path.empty() ? nn::ModelConfig::preset(o.preset)
                                                : nn::ModelConfig::from_json(read_file(o.config_path), o.config_path);
    s.model = std::make_unique<nn::GPT>(cfg);
    s.model->init_weights(o.seed);
  }
  const nn::ModelConfig& cfg = s.model->config();
  SINTER_CHECK(cfg.vocab_size >= 256, "[train] byte-level data needs vocab_size >= 256, got ", cfg.vocab_size);
  SINTER_CHECK(o.seq_len <= cfg.max_position_embeddings, "[train] Options::seq_len ", o.seq_len, " exceeds the model's ",
               cfg.max_position_embeddings, " positions");
  s.model->train();
  s.model->checkpoint_activations = o.checkpoint_activations;
  s.model->to(s.device);  // before the optimizer makes its state beside the parameters
}

// Every rank built the same full model from the same seed; now each keeps its pieces.
void distribute(Trainer::State& s) {
  const Options& o = s.o;
  s.info.parameters = s.model->num_parameters();
  if (s.parallel) {
    s.mesh = dist::DeviceMesh({{"dp", o.dp}, {"tp", o.tp}});
    if (o.tp > 1) dist::parallelize_gpt(*s.model, (*s.mesh)["tp"], o.sequence_parallel);
    if (o.dp > 1) dist::fully_shard_gpt(*s.model, (*s.mesh)["dp"]);
    s.info.mesh = s.mesh->to_string();
  }
  if (s.sharded_resume) dist::load_sharded_into(o.out_dir, sharded_stem(o.out_dir, "model"), parameter_pieces(*s.model));
  s.opt = std::make_unique<optim::AdamW>(s.model->named_parameters(), o.lr, 0.9, 0.95, 1e-8, o.weight_decay);
  if (s.resuming) s.opt->load_state_dict(load_optimizer_state(o.out_dir, *s.model));
  s.params = s.model->parameters();
}

// What a run that stops on non-finite numbers leaves behind.
std::string kept(const Trainer::State& s) {
  return "stopping without saving (" + s.o.out_dir + " keeps its last checkpoint" +
         (s.last_saved > 0 ? ", from step " + std::to_string(s.last_saved) : std::string()) +
         "); a lower Options::lr or Options::grad_clip usually helps";
}

// One step: forward (bf16 autocast: linear layers in bf16, weights and optimizer in f32),
// backward, clipping, AdamW. The learning rate is set outside it (a tensor the update reads).
// With on_nan "skip" the update is taken apart from the rest, after the loss and the gradient
// norm are seen to be finite; a compiled call hands the gradients back as outputs.
std::vector<Tensor> train_step(Trainer::State& s, const Tensor& x, const Tensor& y) {
  const Options& o = s.o;
  if (o.on_nan != "skip") return {step(*s.model, *s.opt, x, y, o.grad_clip, s.compute, o.grad_accum)};
  auto [loss, norm] = loss_and_gradients(*s.model, *s.opt, x, y, o.grad_clip, s.compute, o.grad_accum);
  std::vector<Tensor> out{loss, norm};
  for (const Tensor& p : s.params) out.push_back(p.grad());
  return out;
}

}  // namespace

Trainer::Trainer(const Options& opts, ProgressFn progress) : s_(std::make_unique<State>(opts)) {
  State& s = *s_;
  const Options& o = s.o;
  s.progress = std::move(progress);
  check_options(o);
  s.data.check_window(o.seq_len);
  s.parallel = o.tp * o.dp > 1;
  s.main_rank = !s.parallel || dist::rank() == 0;  // reports and writes files
  check_out_dir(o);
  s.resuming = o.resume;
  s.sharded_resume = s.resuming && s.parallel && sharded_checkpoint(o.out_dir);
  s.device = Device::parse(o.device);
  load_or_build_model(s);
  s.compute = o.dtype == "bf16" ? DType::bf16 : DType::f32;
  distribute(s);
  if (s.main_rank) {
    make_dirs(o.out_dir);
    remove_uncommitted_steps(o.out_dir, o.keep);  // a killed save's files
    s.info.removed_temporaries = io::remove_stale_temporaries(o.out_dir);
  }
  s.info.model_type = s.model->config().model_type;
  s.info.data_name = s.data.name(), s.info.train_bytes = s.data.train_bytes(), s.info.val_bytes = s.data.val_bytes();
  s.info.resumed_at = s.resuming ? s.start : -1;
  s.res.step = s.next = s.start;
  s.last_saved = s.resuming ? s.start : 0;
  s.fingerprint = s.data.fingerprint();
  if (o.compile) {
    SINTER_CHECK(!s.parallel, "[train] a compiled step (Options::compile) runs in one process (tensor parallel and FSDP steps run eagerly)");
    s.compiled.emplace(compile([&s](const std::vector<Tensor>& in) { return train_step(s, in[0], in[1]); }, {.name = "train_step"}));
  }
  s.t0 = s.t_window = Clock::now();
}

Trainer::~Trainer() = default;

bool Trainer::done() const { return s_->next >= s_->o.steps || s_->stopped; }
const RunInfo& Trainer::info() const { return s_->info; }
const Result& Trainer::result() const { return s_->res; }
nn::GPT& Trainer::model() { return *s_->model; }

double Trainer::evaluate() {
  AutocastGuard autocast(s_->compute);
  return train::evaluate(*s_->model, s_->data, s_->o.batch, s_->o.seq_len, s_->o.val_batches, s_->o.seed);
}

void Trainer::save() {
  State& s = *s_;
  const int64_t step = s.res.step;
  // Never a checkpoint of non-finite weights (a finite loss can precede NaN gradients).
  for (auto& [name, p] : s.model->named_parameters()) {
    NoGradGuard no_grad;
    const double total = sum(abs(p->detach())).item_double();
    SINTER_CHECK(std::isfinite(total), "[train] after step ", step, " parameter ", name, " holds NaN or infinity; ", kept(s));
  }
  s.last_saved = step;
  json st{{"step", step}, {"options", json::parse(s.o.to_json())}, {"data_fingerprint", s.fingerprint}};
  if (s.parallel) {  // every rank writes its pieces; rank 0 the indexes, config and state (last)
    save_sharded_checkpoint(s.o.out_dir, *s.model, *s.opt, st.dump(), s.main_rank, s.o.keep);
  } else {
    save_checkpoint(s.o.out_dir, *s.model, s.opt->state_dict(), st.dump(), s.o.keep);
  }
  if (s.main_rank) write_log(s.o.out_dir, s.rows);
}

namespace {

// This rank's batch of a step: the global batch (a function of seed and step), its dp rows.
std::array<Tensor, 2> rank_batch(const Trainer::State& s, int64_t step) {
  const Options& o = s.o;
  auto [x, y] = s.data.batch(true, o.batch, o.seq_len, o.seed, uint64_t(step));
  if (o.dp > 1) {
    const int64_t b = o.batch / o.dp;
    x = x.narrow(0, s.mesh->coordinate(0) * b, b).contiguous(), y = y.narrow(0, s.mesh->coordinate(0) * b, b).contiguous();
  }
  return {x.to(s.device), y.to(s.device)};
}

// The step's loss (averaged over dp), and on_nan: a skipped update, or a stop on a non-finite loss.
void account_loss(Trainer::State& s, const std::vector<Tensor>& out, int64_t step) {
  const Options& o = s.o;
  const bool skip_mode = o.on_nan == "skip";
  s.res.train_loss = out[0].item_double();
  if (o.dp > 1) s.res.train_loss = dist::all_reduce(full({1}, s.res.train_loss, DType::f64), s.mesh->group(0), dist::ReduceOp::avg).item<double>();
  double norm = skip_mode ? out[1].item_double() : 0.0;  // global across ranks: every rank decides alike
  if (std::find(o.inject_nan_steps.begin(), o.inject_nan_steps.end(), step + 1) != o.inject_nan_steps.end()) s.res.train_loss = norm = NAN;
  if (skip_mode && !(std::isfinite(s.res.train_loss) && std::isfinite(norm))) {
    s.res.skipped.push_back(step + 1);
    SINTER_CHECK(++s.skips_in_a_row <= o.max_skips, "[train] step ", step + 1, ": ", s.skips_in_a_row,
                 " steps in a row had a non-finite loss or gradient norm; ", kept(s));
    s.report({.event = Progress::Event::skipped, .step = step + 1, .steps = o.steps, .loss = s.res.train_loss, .grad_norm = norm,
              .skips_in_a_row = s.skips_in_a_row});
    s.res.train_loss = NAN;  // logged as an empty cell
    return;
  }
  if (skip_mode) s.opt->step(), s.skips_in_a_row = 0;
  // A non-finite loss stops the run before anything is saved: the folder keeps its last good
  // checkpoint (a NaN step has already written NaN into the weights in memory).
  SINTER_CHECK(std::isfinite(s.res.train_loss), "[train] step ", step + 1, ": the loss is ", s.res.train_loss, "; ", kept(s));
  s.res.losses.push_back(s.res.train_loss);
}

}  // namespace

void Trainer::step() {
  State& s = *s_;
  const Options& o = s.o;
  const int64_t step = s.next;
  s.opt->set_lr(optim::warmup_cosine(step, o.warmup, o.steps, o.lr, o.min_lr));
  const int64_t bytes0 = s.parallel ? dist::total_traffic().bytes : 0;
  auto [x, y] = rank_batch(s, step);
  manual_seed(o.seed ^ (0x9E3779B97F4A7C15ull * uint64_t(step + 1)));  // dropout masks: a function of the step
  const std::vector<Tensor> out = s.compiled ? (*s.compiled)({x, y}) : train_step(s, x, y);
  if (s.compiled && step == s.start && s.reporting()) {
    const Explanation e = s.compiled->explain({x, y});
    s.report({.event = Progress::Event::compiled, .step = step + 1, .steps = o.steps,
              .elapsed_s = std::chrono::duration<double>(Clock::now() - s.t_window).count(), .compiled = &e});
  }
  if (s.compiled && o.on_nan == "skip")
    for (size_t i = 0; i < s.params.size(); ++i) s.params[i].set_grad(out[2 + i]);
  account_loss(s, out, step);
  if (s.parallel) s.res.step_bytes.push_back(dist::total_traffic().bytes - bytes0);
  s.window_tokens += o.batch * o.seq_len;
  const int64_t done = step + 1;
  const bool val_now = done % o.val_every == 0 || done == o.steps;
  if (done % o.log_every == 0 || val_now) {
    const auto now = Clock::now();
    s.tok_s = double(s.window_tokens) / std::chrono::duration<double>(now - s.t_window).count();
    s.t_window = now, s.window_tokens = 0;
    const double val = val_now ? (s.res.val_loss = evaluate()) : NAN;
    s.rows.push_back({double(done), s.res.train_loss, val, s.tok_s});
    s.report({.event = Progress::Event::step, .step = done, .steps = o.steps, .loss = s.res.train_loss, .val_loss = val, .rate = s.tok_s,
              .elapsed_s = std::chrono::duration<double>(now - s.t0).count(),
              .eta_s = double(o.steps - done) * double(o.batch * o.seq_len) / std::max(s.tok_s, 1e-9)});
    if (val_now && s.main_rank) write_log(o.out_dir, s.rows);
  }
  s.res.step = s.next = done;
  s.res.tokens_per_s = s.tok_s;
  if (done % o.save_every == 0 || done == o.steps || done == o.stop_after) save();
  s.stopped = done == o.stop_after;
}

Result Trainer::run() {
  while (!done()) step();
  return s_->res;
}

Result run(const Options& opts, const ProgressFn& progress) { return Trainer(opts, progress).run(); }

}  // namespace sinter::train

// The training loop behind `sinter train`: AdamW on the byte-level corpus, warmup + cosine, gradient
// clipping, validation, a progress line, checkpoints (checkpoint.cpp); alone or under mpirun.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/format.h"
#include "sinter/autograd.h"
#include "sinter/compile.h"
#include "sinter/dist.h"
#include "sinter/io.h"
#include "sinter/optim.h"
#include "sinter/random.h"
#include "sinter/sparse.h"
#include "io/atomic_file.h"
#include "train/internal.h"

namespace sinter::train {

using json = nlohmann::json;
namespace fs = std::filesystem;
using namespace detail;

std::string Options::to_json() const {
  json j{{"preset", preset}, {"config", config_path}, {"data", data_path}, {"steps", steps}, {"batch", batch}, {"grad_accum", grad_accum}, {"checkpoint_activations", checkpoint_activations},
         {"seq_len", seq_len}, {"lr", lr}, {"min_lr", min_lr}, {"weight_decay", weight_decay},
         {"grad_clip", grad_clip}, {"warmup", warmup}, {"seed", seed}, {"dtype", dtype}, {"tp", tp}, {"dp", dp}, {"sequence_parallel", sequence_parallel},
         {"compile", compile}, {"on_nan", on_nan}, {"init", init_dir}};
  return j.dump();
}


Tensor detail::lm_loss(nn::GPT& model, const Tensor& x, const Tensor& y) {
  Tensor logits = model.forward(x);
  if (model.parallel_loss) return model.parallel_loss(logits, y);  // logits sharded over the vocabulary
  return cross_entropy(logits.reshape({-1, logits.size(-1)}), y.reshape({-1}));
}

double evaluate(nn::GPT& model, const data::ByteDataset& data, int64_t batch, int64_t seq_len, int64_t batches,
                uint64_t seed) {
  NoGradGuard g;
  const bool was_training = model.is_training();
  model.eval();
  double total = 0;
  for (int64_t i = 0; i < batches; ++i) {
    auto [x, y] = data.batch(false, batch, seq_len, seed, uint64_t(i));
    total += lm_loss(model, x, y).item_double();
  }
  model.train(was_training);
  return total / double(batches);
}

std::array<Tensor, 2> loss_and_gradients(nn::GPT& model, optim::Optimizer& opt, const Tensor& x, const Tensor& y,
                                         double grad_clip, DType compute, int64_t micro_batches) {
  const int64_t B = x.size(0);
  SINTER_CHECK(micro_batches >= 1 && B % micro_batches == 0, "[train] a batch of ", B, " sequences does not split into ",
               micro_batches, " micro-batches");
  opt.zero_grad();
  Tensor loss;
  for (int64_t i = 0, rows = B / micro_batches; i < micro_batches; ++i) {
    Tensor part;
    {
      AutocastGuard autocast(compute);
      part = micro_batches == 1 ? lm_loss(model, x, y)
                                : lm_loss(model, x.narrow(0, i * rows, rows), y.narrow(0, i * rows, rows)) * (1.0 / double(micro_batches));
    }
    part.backward();  // the leaves' gradients add up over the micro-batches
    loss = micro_batches == 1 ? part : loss.defined() ? loss + part.detach() : part.detach();
  }
  const std::vector<Tensor> params = model.parameters();
  const bool parallel = std::any_of(params.begin(), params.end(), [](const Tensor& p) { return dist::parameter_layout(p).has_value(); });
  Tensor norm = parallel ? dist::clip_grad_norm(params, grad_clip) : optim::clip_grad_norm(params, grad_clip);
  return {loss, norm};
}

Tensor step(nn::GPT& model, optim::Optimizer& opt, const Tensor& x, const Tensor& y, double grad_clip, DType compute,
            int64_t micro_batches) {
  Tensor loss = loss_and_gradients(model, opt, x, y, grad_clip, compute, micro_batches)[0];
  opt.step();
  return loss;
}

namespace {
// Fault injection for the tests of --on-nan: SINTER_FAULT_NAN_STEPS="3,7-9" makes those steps'
// loss and gradient norm read as NaN, as a step that overflowed would.
std::set<int64_t> fault_nan_steps() {
  std::set<int64_t> steps;
  const char* e = std::getenv("SINTER_FAULT_NAN_STEPS");
  for (std::stringstream ss(e ? e : ""); ss.good();) {
    std::string item;
    std::getline(ss, item, ',');
    if (item.empty()) continue;
    const size_t dash = item.find('-');
    const int64_t a = std::stoll(item.substr(0, dash)), b = dash == std::string::npos ? a : std::stoll(item.substr(dash + 1));
    for (int64_t i = a; i <= b; ++i) steps.insert(i);
  }
  return steps;
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
  SINTER_CHECK(diff.empty(), "[train] --resume: this run differs from the checkpoint in ", state_path, ":", diff,
               "\n(--allow-changes continues anyway, as fine-tuning on new data does)");
}
}  // namespace

Result run(const Options& o) {
  SINTER_CHECK(o.steps > 0 && o.batch > 0 && o.seq_len > 1, "[train] steps, batch and seq_len must be positive (seq_len > 1)");
  const int64_t rank_batch = o.batch / std::max<int64_t>(o.dp, 1);
  SINTER_CHECK(o.grad_accum >= 1 && rank_batch > 0 && rank_batch % o.grad_accum == 0, "[train] grad_accum ", o.grad_accum,
               " does not divide the ", rank_batch, " sequences of a step", o.dp > 1 ? " per dp rank" : "");
  SINTER_CHECK(o.lr > 0 && o.min_lr >= 0 && o.warmup >= 0 && o.grad_clip > 0 && o.val_every > 0 && o.val_batches > 0,
               "[train] learning rates, warmup, grad_clip, val_every and val_batches must be positive");
  const data::ByteDataset data = o.data_path.empty() ? data::ByteDataset::fortunes() : data::ByteDataset::from_file(o.data_path);
  data.check_window(o.seq_len);
  const bool parallel = o.tp * o.dp > 1;
  if (parallel) {
    SINTER_CHECK(o.tp >= 1 && o.dp >= 1, "[train] tp and dp must be >= 1, got ", o.tp, " and ", o.dp);
    SINTER_CHECK_T(DistError, o.tp * o.dp == dist::world_size(), "[train] tp=", o.tp, " x dp=", o.dp, " needs ", o.tp * o.dp,
                   " ranks, but the job has ", dist::world_size());
    SINTER_CHECK(o.batch % o.dp == 0, "[train] batch ", o.batch, " does not split over dp=", o.dp);
  }
  const bool main_rank = !parallel || dist::rank() == 0;  // prints and writes files
  const bool quiet = o.quiet || !main_rank;

  std::unique_ptr<nn::GPT> model;
  int64_t start = 0;
  LogRows rows;
  const std::string state_path = o.out_dir + "/train_state.json";
  std::error_code ec;
  SINTER_CHECK(!o.out_dir.empty(), "[train] an output folder is needed");
  SINTER_CHECK(!(o.resume && o.overwrite), "[train] --resume and --overwrite exclude each other");
  const bool has_state = fs::exists(state_path, ec);
  const bool has_weights = has_state || fs::exists(o.out_dir + "/model.safetensors", ec) || fs::exists(o.out_dir + "/model.index.json", ec);
  if (o.resume)
    SINTER_CHECK_T(IOError, has_state, "[train] --resume: ", o.out_dir, " holds no complete checkpoint (", state_path, " is missing",
                   has_weights ? "; weights without a training state are what an interrupted first save leaves: --overwrite starts over" : "", ")");
  else
    SINTER_CHECK_T(IOError, !has_weights || o.overwrite, "[train] ", o.out_dir, " already holds a checkpoint",
                   has_state ? " (" + state_path + ")" : std::string(), ": --resume continues it, --overwrite replaces it");
  const bool resuming = o.resume;
  // A sharded checkpoint resumed in parallel is read piece by piece after the model is split (below).
  const bool sharded_resume = resuming && parallel && sharded_checkpoint(o.out_dir);
  if (sharded_resume) {
    const std::string cfg_path = committed_path(o.out_dir, "config.json");
    model = std::make_unique<nn::GPT>(nn::ModelConfig::from_json(read_file(cfg_path), cfg_path));
  } else if (resuming) {
    model = load_model(o.out_dir);
  }
  if (resuming) {
    const TrainState st = parse_train_state(read_file(state_path), state_path);
    start = st.step;
    SINTER_CHECK(start < o.steps, "[train] the checkpoint in ", o.out_dir, " is at step ", start, "; --steps ", o.steps,
                 " leaves nothing to train (raise --steps to continue it)");
    if (!o.allow_changes) check_resume_matches(st, o, data, state_path);
    rows = read_log(o.out_dir, start);
  } else if (!o.init_dir.empty()) {
    SINTER_CHECK(o.config_path.empty(), "[train] --init takes the model from ", o.init_dir, "; drop --config");
    check_trains_on_bytes(o.init_dir, "train");
    model = load_model(o.init_dir);
  } else {
    nn::ModelConfig cfg = o.config_path.empty() ? nn::ModelConfig::preset(o.preset)
                                                : nn::ModelConfig::from_json(read_file(o.config_path), o.config_path);
    model = std::make_unique<nn::GPT>(cfg);
    model->init_weights(o.seed);
  }
  const nn::ModelConfig& cfg = model->config();
  SINTER_CHECK(cfg.vocab_size >= 256, "[train] byte-level data needs vocab_size >= 256, got ", cfg.vocab_size);
  SINTER_CHECK(o.seq_len <= cfg.max_position_embeddings, "[train] seq_len ", o.seq_len, " exceeds the model's ",
               cfg.max_position_embeddings, " positions");
  model->train();
  SINTER_CHECK(!(o.checkpoint_activations && o.compile), "[train] --checkpoint-activations recomputes eager steps; a compiled step "
               "(--compile) chooses what its backward recomputes");
  model->checkpoint_activations = o.checkpoint_activations;
  SINTER_CHECK(o.dtype == "f32" || o.dtype == "bf16", "[train] dtype must be f32 or bf16, got '", o.dtype, "'");
  const DType compute = o.dtype == "bf16" ? DType::bf16 : DType::f32;

  // Every rank built the same full model from the same seed; now each keeps its pieces.
  std::optional<dist::DeviceMesh> mesh;
  const int64_t n_params = model->num_parameters();
  if (parallel) {
    mesh = dist::DeviceMesh({{"dp", o.dp}, {"tp", o.tp}});
    if (o.tp > 1) dist::parallelize_gpt(*model, (*mesh)["tp"], o.sequence_parallel);
    if (o.dp > 1) dist::fully_shard_gpt(*model, (*mesh)["dp"]);
  }
  if (sharded_resume) dist::load_sharded_into(o.out_dir, sharded_stem(o.out_dir, "model"), parameter_pieces(*model));
  optim::AdamW opt(model->named_parameters(), o.lr, 0.9, 0.95, 1e-8, o.weight_decay);
  if (resuming) opt.load_state_dict(load_optimizer_state(o.out_dir, *model));

  if (main_rank) {
    make_dirs(o.out_dir);
    remove_uncommitted_steps(o.out_dir, o.keep);  // a killed save's files
    if (const int n = io::remove_stale_temporaries(o.out_dir); n > 0 && !quiet)
      std::printf("train: removed %d temporary file%s left in %s by an interrupted save\n", n, n == 1 ? "" : "s", o.out_dir.c_str());
  }
  if (!quiet && parallel)
    std::printf("train: %lld ranks as %s: tensor parallel over tp%s, FSDP over dp, %lld sequences per dp rank\n",
                (long long)(o.tp * o.dp), mesh->to_string().c_str(), o.sequence_parallel ? " (sequence parallel)" : "",
                (long long)(o.batch / o.dp));
  if (!quiet)
    std::printf("train: %s model, %.2fM parameters, %s, data %s (%lld train / %lld val bytes), %lld steps of %lldx%lld tokens%s%s\n",
                cfg.model_type.c_str(), double(n_params) / 1e6,
                o.dtype == "bf16" ? "bf16 autocast (f32 master weights)" : "f32", data.name().c_str(),
                (long long)data.train_bytes(), (long long)data.val_bytes(), (long long)o.steps, (long long)o.batch,
                (long long)o.seq_len,
                (o.grad_accum > 1 ? " in " + std::to_string(o.grad_accum) + " micro-batches" : std::string()).c_str(),
                resuming ? (" (resuming at step " + std::to_string(start) + ")").c_str() : "");
  const bool tty = isatty(fileno(stdout));
  Result res;
  res.step = start;
  auto t0 = std::chrono::steady_clock::now();
  auto t_window = t0;
  int64_t window_tokens = 0;
  double tok_s = 0;
  int64_t last_saved = resuming ? start : 0;
  const std::string fingerprint = data.fingerprint();
  SINTER_CHECK(o.on_nan == "stop" || o.on_nan == "skip", "[train] on_nan must be stop or skip, got '", o.on_nan, "'");
  auto kept = [&] {  // what a run that stops on non-finite numbers leaves behind
    return "stopping without saving (" + o.out_dir + " keeps its last checkpoint" +
           (last_saved > 0 ? ", from step " + std::to_string(last_saved) : std::string()) + "); a lower --lr or --grad-clip usually helps";
  };
  auto checkpoint = [&](int64_t step) {
    // Never a checkpoint of non-finite weights (a finite loss can precede NaN gradients).
    for (auto& [name, p] : model->named_parameters()) {
      NoGradGuard no_grad;
      const double total = sum(abs(p->detach())).item_double();
      SINTER_CHECK(std::isfinite(total), "[train] after step ", step, " parameter ", name, " holds NaN or infinity; ", kept());
    }
    last_saved = step;
    json st{{"step", step}, {"options", json::parse(o.to_json())}, {"data_fingerprint", fingerprint}};
    if (parallel) {  // every rank writes its pieces; rank 0 the indexes, config and state (last)
      save_sharded_checkpoint(o.out_dir, *model, opt, st.dump(), main_rank, o.keep);
    } else {
      save_checkpoint(o.out_dir, *model, opt.state_dict(), st.dump(), o.keep);
    }
    if (main_rank) write_log(o.out_dir, rows);
  };
  // One step: forward (bf16 autocast: linear layers in bf16, weights and optimizer in f32),
  // backward, clipping, AdamW. The learning rate is set outside it (a tensor the update reads).
  // With --on-nan skip the update is taken apart from the rest, after the loss and the gradient
  // norm are seen to be finite.
  const bool skip_mode = o.on_nan == "skip";
  std::vector<Tensor> params = model->parameters();
  auto train_step = [&](const Tensor& x, const Tensor& y) {
    if (!skip_mode) return std::vector<Tensor>{step(*model, opt, x, y, o.grad_clip, compute, o.grad_accum)};
    auto [loss, norm] = loss_and_gradients(*model, opt, x, y, o.grad_clip, compute, o.grad_accum);
    std::vector<Tensor> out{loss, norm};
    for (const Tensor& p : params) out.push_back(p.grad());  // a compiled call hands them back as outputs
    return out;
  };
  std::optional<CompiledFunction> compiled;
  if (o.compile) {
    SINTER_CHECK(!parallel, "[train] a compiled step runs in one process (tensor parallel and FSDP steps run eagerly)");
    compiled.emplace(compile([&](const std::vector<Tensor>& in) { return train_step(in[0], in[1]); }, {.name = "train_step"}));
  }
  const std::set<int64_t> poisoned = fault_nan_steps();
  int64_t skips_in_a_row = 0;
  for (int64_t step = start; step < o.steps; ++step) {
    opt.set_lr(optim::warmup_cosine(step, o.warmup, o.steps, o.lr, o.min_lr));
    const int64_t bytes0 = parallel ? dist::total_traffic().bytes : 0;
    auto [x, y] = data.batch(true, o.batch, o.seq_len, o.seed, uint64_t(step));
    if (o.dp > 1) {  // this dp rank's rows of the global batch
      const int64_t b = o.batch / o.dp;
      x = x.narrow(0, mesh->coordinate(0) * b, b).contiguous(), y = y.narrow(0, mesh->coordinate(0) * b, b).contiguous();
    }
    manual_seed(o.seed ^ (0x9E3779B97F4A7C15ull * uint64_t(step + 1)));  // dropout masks: a function of the step
    const std::vector<Tensor> out = compiled ? (*compiled)({x, y}) : train_step(x, y);
    if (compiled && step == start && !quiet) {
      const Explanation e = compiled->explain({x, y});
      std::printf("compile: the step is %d fused kernels + %d library calls%s (first step %.2f s)\n", e.fused_kernels, e.library_calls,
                  e.breaks ? (", graph break: " + e.break_reasons[0] + "; the step runs in compiled pieces").c_str() : "",
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t_window).count());
    }
    if (compiled && skip_mode)
      for (size_t i = 0; i < params.size(); ++i) params[i].set_grad(out[2 + i]);
    res.train_loss = out[0].item_double();
    if (o.dp > 1) res.train_loss = dist::all_reduce(full({1}, res.train_loss, DType::f64), mesh->group(0), dist::ReduceOp::avg).item<double>();
    double norm = skip_mode ? out[1].item_double() : 0.0;  // global across ranks: every rank decides alike
    if (poisoned.count(step + 1)) res.train_loss = norm = NAN;
    if (skip_mode && !(std::isfinite(res.train_loss) && std::isfinite(norm))) {
      res.skipped.push_back(step + 1);
      SINTER_CHECK(++skips_in_a_row <= o.max_skips, "[train] step ", step + 1, ": ", skips_in_a_row,
                   " steps in a row had a non-finite loss or gradient norm; ", kept());
      if (!quiet)
        std::printf("%sstep %5lld/%lld  loss %g  gradient norm %g: update skipped (--on-nan skip; %lld in a row)\n",
                    tty ? "\r" : "", (long long)(step + 1), (long long)o.steps, res.train_loss, norm, (long long)skips_in_a_row);
      res.train_loss = NAN;  // logged as an empty cell
    } else {
      if (skip_mode) opt.step(), skips_in_a_row = 0;
      // A non-finite loss stops the run before anything is saved: the folder keeps its last good
      // checkpoint (a NaN step has already written NaN into the weights in memory).
      SINTER_CHECK(std::isfinite(res.train_loss), "[train] step ", step + 1, ": the loss is ", res.train_loss, "; ", kept());
      res.losses.push_back(res.train_loss);
    }
    if (parallel) res.step_bytes.push_back(dist::total_traffic().bytes - bytes0);
    window_tokens += o.batch * o.seq_len;
    const int64_t done = step + 1;
    const bool val_now = done % o.val_every == 0 || done == o.steps;
    if (done % o.log_every == 0 || val_now) {
      const auto now = std::chrono::steady_clock::now();
      tok_s = double(window_tokens) / std::chrono::duration<double>(now - t_window).count();
      t_window = now;
      window_tokens = 0;
      double val = NAN;
      if (val_now) {
        AutocastGuard autocast(compute);
        val = res.val_loss = evaluate(*model, data, o.batch, o.seq_len, o.val_batches, o.seed);
      }
      rows.push_back({double(done), res.train_loss, val, tok_s});
      if (!quiet) {
        const double eta = double(o.steps - done) * double(o.batch * o.seq_len) / std::max(tok_s, 1e-9);
        std::printf("%sstep %5lld/%lld  loss %.4f  %s%.0f tok/s  elapsed %s  ETA %s%s", tty ? "\r" : "",
                    (long long)done, (long long)o.steps, res.train_loss,
                    std::isnan(val) ? "" : ("val " + std::to_string(val).substr(0, 6) + "  ").c_str(), tok_s,
                    format_duration(std::chrono::duration<double>(now - t0).count()).c_str(), format_duration(eta).c_str(),
                    (tty && !val_now) ? "   " : "\n");
        std::fflush(stdout);
      }
      if (val_now && main_rank) write_log(o.out_dir, rows);
    }
    res.step = done;
    res.tokens_per_s = tok_s;
    if (done % o.save_every == 0 || done == o.steps || done == o.stop_after) checkpoint(done);
    if (done == o.stop_after) break;
  }
  return res;
}

}  // namespace sinter::train

// Training loop, checkpoints, evaluation and generation (with a KV cache).
#include "sinter/train.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "sinter/autograd.h"
#include "sinter/dist.h"
#include "sinter/io.h"
#include "sinter/optim.h"
#include "sinter/random.h"
#include "sinter/sparse.h"
#include "core/format.h"

namespace sinter::train {

using json = nlohmann::json;
namespace fs = std::filesystem;

std::string Options::to_json() const {
  json j{{"preset", preset}, {"config", config_path}, {"data", data_path}, {"steps", steps}, {"batch", batch},
         {"seq_len", seq_len}, {"lr", lr}, {"min_lr", min_lr}, {"weight_decay", weight_decay},
         {"grad_clip", grad_clip}, {"warmup", warmup}, {"seed", seed}, {"dtype", dtype}, {"tp", tp}, {"dp", dp}, {"sequence_parallel", sequence_parallel}};
  return j.dump();
}

namespace {

std::string read_file(const std::string& path) {
  std::error_code ec;
  SINTER_CHECK_T(IOError, fs::is_regular_file(path, ec), "[", path, "] not found");
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

Tensor lm_loss(nn::GPT& model, const Tensor& x, const Tensor& y) {
  Tensor logits = model.forward(x);
  if (model.parallel_loss) return model.parallel_loss(logits, y);  // logits sharded over the vocabulary
  return cross_entropy(logits.reshape({-1, logits.size(-1)}), y.reshape({-1}));
}

// A parallel run's parameters as DTensors (their layouts).
std::map<std::string, dist::DTensor> parameter_pieces(nn::GPT& model) {
  std::map<std::string, dist::DTensor> out;
  for (auto& [name, p] : model.named_parameters())
    if (auto l = dist::parameter_layout(*p)) out.emplace(name, *l);
  return out;
}
// The layout of an optimizer state entry ("exp_avg.<param name>") is its parameter's; null for
// entries that belong to no laid-out parameter ("step").
const dist::DTensor* state_layout(const std::map<std::string, dist::DTensor>& params, const std::string& key) {
  const size_t dot = key.find('.');
  auto it = dot == std::string::npos ? params.end() : params.find(key.substr(dot + 1));
  return it == params.end() ? nullptr : &it->second;
}
void split_state(const std::map<std::string, dist::DTensor>& params, const std::map<std::string, Tensor>& state,
                 std::map<std::string, dist::DTensor>& pieces, std::map<std::string, Tensor>& plain) {
  for (auto& [key, t] : state) {
    if (const dist::DTensor* l = state_layout(params, key)) pieces.emplace(key, dist::DTensor(t, l->mesh(), l->placements(), l->shape()));
    else plain[key] = t;
  }
}

bool sharded_checkpoint(const std::string& dir) {
  std::error_code ec;
  return dist::has_sharded(dir, "model") && !fs::exists(dir + "/model.safetensors", ec);
}

// The optimizer state of a checkpoint in either format, as this run's pieces.
std::map<std::string, Tensor> load_optimizer_state(const std::string& dir, nn::GPT& model) {
  const std::map<std::string, dist::DTensor> params = parameter_pieces(model);
  std::error_code ec;
  if (!fs::exists(dir + "/optimizer.safetensors", ec) && dist::has_sharded(dir, "optimizer")) {
    // Targets shaped like this run's pieces: exp_avg / exp_avg_sq of every parameter, and the step.
    std::map<std::string, Tensor> state;
    for (auto& [name, p] : model.named_parameters())
      state["exp_avg." + name] = zeros_like(p->detach()), state["exp_avg_sq." + name] = zeros_like(p->detach());
    state["step"] = zeros({}, DType::i64);
    std::map<std::string, dist::DTensor> pieces;
    std::map<std::string, Tensor> plain;
    split_state(params, state, pieces, plain);
    dist::load_sharded_into(dir, "optimizer", pieces, plain);
    return state;
  }
  std::map<std::string, Tensor> full = io::load_safetensors(dir + "/optimizer.safetensors").tensors;
  for (auto& [key, t] : full)  // whole tensors: keep this run's piece of each
    if (const dist::DTensor* l = state_layout(params, key)) t = dist::distribute_tensor(t, l->mesh(), l->placements()).to_local();
  return full;
}

// Rows: step, train_loss, val_loss (NaN when not measured), tokens/s.
using LogRows = std::vector<std::array<double, 4>>;

void write_log(const std::string& dir, const LogRows& rows) {
  std::ostringstream os;
  os << "step,train_loss,val_loss,tokens_per_s\n";
  for (auto& r : rows) {
    char line[160];
    if (std::isnan(r[2])) std::snprintf(line, sizeof line, "%lld,%.6f,,%.1f\n", (long long)r[0], r[1], r[3]);
    else std::snprintf(line, sizeof line, "%lld,%.6f,%.6f,%.1f\n", (long long)r[0], r[1], r[2], r[3]);
    os << line;
  }
  io::atomic_write(dir + "/log.csv", os.str());
  std::vector<std::array<double, 3>> pts;
  for (auto& r : rows) pts.push_back({r[0], r[1], r[2]});
  write_loss_svg(dir + "/loss.svg", pts);
}

LogRows read_log(const std::string& dir, int64_t up_to_step) {
  LogRows rows;
  std::ifstream f(dir + "/log.csv");
  std::string line;
  std::getline(f, line);
  while (std::getline(f, line)) {
    std::array<double, 4> r{};
    std::stringstream ss(line);
    std::string cell;
    for (int i = 0; i < 4 && std::getline(ss, cell, ','); ++i) r[size_t(i)] = cell.empty() ? NAN : std::stod(cell);
    if (r[0] <= double(up_to_step)) rows.push_back(r);
  }
  return rows;
}

}  // namespace

static void make_dirs(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  SINTER_CHECK_T(IOError, !ec, "[", dir, "] cannot create the folder: ", ec.message());
}

// After the weights and optimizer state (either format): the other format's entry points, now
// stale, go; then config.json, and train_state.json last, which marks the checkpoint complete.
static void finish_checkpoint(const std::string& dir, const nn::ModelConfig& cfg, const std::string& train_state_json,
                              const std::vector<std::string>& stale) {
  std::error_code ec;
  for (const std::string& f : stale) fs::remove(dir + "/" + f, ec);
  io::atomic_write(dir + "/config.json", cfg.to_json());
  io::atomic_write(dir + "/train_state.json", train_state_json + "\n");
}

void save_checkpoint(const std::string& dir, nn::GPT& model, const std::map<std::string, Tensor>& optimizer_state,
                     const std::string& train_state_json) {
  make_dirs(dir);
  io::save_safetensors(dir + "/model.safetensors", model.state_dict(), {{"format", "sinter"}});
  io::save_safetensors(dir + "/optimizer.safetensors", optimizer_state);
  finish_checkpoint(dir, model.config(), train_state_json, {"model.index.json", "optimizer.index.json"});
}

static void save_sharded_checkpoint(const std::string& dir, nn::GPT& model, const optim::Optimizer& opt,
                                    const std::string& train_state_json, bool main_rank) {
  std::map<std::string, dist::DTensor> params = parameter_pieces(model), states;
  std::map<std::string, Tensor> plain_params, plain_states;
  for (auto& [name, p] : model.named_parameters())
    if (!params.count(name)) plain_params[name] = *p;
  for (auto& [name, b] : model.named_buffers()) plain_params[name] = *b;
  split_state(params, opt.state_dict(), states, plain_states);
  dist::save_sharded(dir, "model", params, plain_params);
  dist::save_sharded(dir, "optimizer", states, plain_states);
  if (main_rank) finish_checkpoint(dir, model.config(), train_state_json, {"model.safetensors", "optimizer.safetensors"});
}

std::unique_ptr<nn::GPT> load_model(const std::string& dir) {
  std::error_code ec;
  SINTER_CHECK_T(IOError, fs::is_directory(dir, ec), "[", dir, "] checkpoint folder not found");
  const std::string cfg_path = dir + "/config.json";
  auto cfg = nn::ModelConfig::from_json(read_file(cfg_path), cfg_path);
  auto model = std::make_unique<nn::GPT>(cfg);
  const bool sharded = sharded_checkpoint(dir);
  const std::string weights = dir + (sharded ? "/model.index.json" : "/model.safetensors");
  std::map<std::string, Tensor> sd = sharded ? dist::load_sharded(dir, "model") : io::load_safetensors(weights).tensors;
  try {
    model->load_state_dict(sd);
  } catch (const Error& e) {
    SINTER_THROW(IOError, "[", weights, "] ", e.what());
  }
  return model;
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

Result run(const Options& o) {
  SINTER_CHECK(o.steps > 0 && o.batch > 0 && o.seq_len > 1, "[train] steps, batch and seq_len must be positive (seq_len > 1)");
  SINTER_CHECK(o.lr > 0 && o.min_lr >= 0 && o.warmup >= 0 && o.grad_clip > 0 && o.val_every > 0 && o.val_batches > 0,
               "[train] learning rates, warmup, grad_clip, val_every and val_batches must be positive");
  const data::ByteDataset data = o.data_path.empty() ? data::ByteDataset::fortunes() : data::ByteDataset::from_file(o.data_path);
  data.check_window(o.seq_len);
  const bool parallel = o.tp * o.dp > 1;
  if (parallel) {
    SINTER_CHECK(o.tp >= 1 && o.dp >= 1, "[train] tp and dp must be >= 1, got ", o.tp, " and ", o.dp);
    SINTER_CHECK_T(DistError, o.tp * o.dp == dist::world_size(), "[train] tp=", o.tp, " x dp=", o.dp, " needs ", o.tp * o.dp,
                   " ranks, but the job has ", dist::world_size(), " (run: mpirun -np ", o.tp * o.dp, " sinter train --tp ", o.tp,
                   " --dp ", o.dp, ")");
    SINTER_CHECK(o.batch % o.dp == 0, "[train] batch ", o.batch, " does not split over dp=", o.dp);
  }
  const bool main_rank = !parallel || dist::rank() == 0;  // prints and writes files
  const bool quiet = o.quiet || !main_rank;

  std::unique_ptr<nn::GPT> model;
  int64_t start = 0;
  LogRows rows;
  const std::string state_path = o.out_dir + "/train_state.json";
  std::error_code ec;
  const bool resuming = o.resume && fs::exists(state_path, ec);
  // A sharded checkpoint resumed in parallel is read piece by piece after the model is split (below).
  const bool sharded_resume = resuming && parallel && sharded_checkpoint(o.out_dir);
  if (sharded_resume) {
    const std::string cfg_path = o.out_dir + "/config.json";
    model = std::make_unique<nn::GPT>(nn::ModelConfig::from_json(read_file(cfg_path), cfg_path));
  } else if (resuming) {
    model = load_model(o.out_dir);
  }
  if (resuming) {
    json st;
    try {
      st = json::parse(read_file(state_path));
      start = st.at("step").get<int64_t>();
    } catch (const json::exception& e) {
      SINTER_THROW(IOError, "[", state_path, "] corrupt training state: ", e.what());
    }
    rows = read_log(o.out_dir, start);
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
  if (sharded_resume) dist::load_sharded_into(o.out_dir, "model", parameter_pieces(*model));
  optim::AdamW opt(model->named_parameters(), o.lr, 0.9, 0.95, 1e-8, o.weight_decay);
  if (resuming) opt.load_state_dict(load_optimizer_state(o.out_dir, *model));

  SINTER_CHECK(!o.out_dir.empty(), "[train] an output folder is needed");
  if (main_rank) make_dirs(o.out_dir);
  if (!quiet && parallel)
    std::printf("train: %lld ranks as %s: tensor parallel over tp%s, FSDP over dp, %lld sequences per dp rank\n",
                (long long)(o.tp * o.dp), mesh->to_string().c_str(), o.sequence_parallel ? " (sequence parallel)" : "",
                (long long)(o.batch / o.dp));
  if (!quiet)
    std::printf("train: %s model, %.2fM parameters, %s, data %s (%lld train / %lld val bytes), %lld steps of %lldx%lld tokens%s\n",
                cfg.model_type.c_str(), double(n_params) / 1e6,
                o.dtype == "bf16" ? "bf16 autocast (f32 master weights)" : "f32", data.name().c_str(),
                (long long)data.train_bytes(), (long long)data.val_bytes(), (long long)o.steps, (long long)o.batch,
                (long long)o.seq_len, resuming ? (" (resuming at step " + std::to_string(start) + ")").c_str() : "");
  const bool tty = isatty(fileno(stdout));
  Result res;
  res.step = start;
  auto t0 = std::chrono::steady_clock::now();
  auto t_window = t0;
  int64_t window_tokens = 0;
  double tok_s = 0;
  auto checkpoint = [&](int64_t step) {
    json st{{"step", step}, {"options", json::parse(o.to_json())}};
    if (parallel) {  // every rank writes its pieces; rank 0 the indexes, config and state (last)
      save_sharded_checkpoint(o.out_dir, *model, opt, st.dump(), main_rank);
    } else {
      save_checkpoint(o.out_dir, *model, opt.state_dict(), st.dump());
    }
    if (main_rank) write_log(o.out_dir, rows);
  };
  for (int64_t step = start; step < o.steps; ++step) {
    opt.lr = optim::warmup_cosine(step, o.warmup, o.steps, o.lr, o.min_lr);
    const int64_t bytes0 = parallel ? dist::total_traffic().bytes : 0;
    auto [x, y] = data.batch(true, o.batch, o.seq_len, o.seed, uint64_t(step));
    if (o.dp > 1) {  // this dp rank's rows of the global batch
      const int64_t b = o.batch / o.dp;
      x = x.narrow(0, mesh->coordinate(0) * b, b).contiguous(), y = y.narrow(0, mesh->coordinate(0) * b, b).contiguous();
    }
    manual_seed(o.seed ^ (0x9E3779B97F4A7C15ull * uint64_t(step + 1)));  // dropout masks: a function of the step
    Tensor loss;
    {
      AutocastGuard autocast(compute);  // bf16: linear layers in bf16, weights and optimizer in f32
      loss = lm_loss(*model, x, y);
    }
    opt.zero_grad();
    loss.backward();
    if (parallel) dist::clip_grad_norm(model->parameters(), o.grad_clip);
    else optim::clip_grad_norm(model->parameters(), o.grad_clip);
    opt.step();
    res.train_loss = loss.item_double();
    if (o.dp > 1) res.train_loss = dist::all_reduce(full({1}, res.train_loss, DType::f64), mesh->group(0), dist::ReduceOp::avg).item<double>();
    res.losses.push_back(res.train_loss);
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

SparsifyResult sparsify(const SparsifyOptions& o) {
  SINTER_CHECK(o.finetune_steps >= 0 && o.batch > 0 && o.seq_len > 1 && o.val_batches > 0 && o.lr > 0,
               "[sparsify] finetune steps >= 0; batch, seq_len (> 1), val batches and lr positive");
  SINTER_CHECK(o.values == "f32" || o.values == "bf16" || o.values == "i8", "[sparsify] values must be f32, bf16 or i8, got '",
               o.values, "'");
  const data::ByteDataset data = o.data_path.empty() ? data::ByteDataset::fortunes() : data::ByteDataset::from_file(o.data_path);
  data.check_window(o.seq_len);
  auto model = load_model(o.checkpoint);
  SINTER_CHECK(model->config().sparsity.empty(), "[sparsify] ", o.checkpoint, " is already 2:4 sparse");
  SINTER_CHECK(o.seq_len <= model->config().max_position_embeddings, "[sparsify] seq_len ", o.seq_len, " exceeds the model's ",
               model->config().max_position_embeddings, " positions");
  SparsifyResult r;
  auto val = [&] { return evaluate(*model, data, o.batch, o.seq_len, o.val_batches, o.seed); };
  for (auto& l : model->block_linears()) r.dense_bytes += l->weight.numel() * l->weight.element_size();
  r.dense_val = val();
  model->sparsify(DType::f32);  // fine-tuning trains f32 values; bf16 / int8 come after
  r.pruned_val = val();
  if (!o.quiet)
    std::printf("sparsify: %s, %zu Linear layers pruned to 2:4; validation %.4f -> %.4f nats/byte\n", o.checkpoint.c_str(),
                model->block_linears().size(), r.dense_val, r.pruned_val);
  r.finetuned_val = r.pruned_val;
  if (o.finetune_steps > 0) {
    model->train();
    optim::AdamW opt(model->named_parameters(), o.lr, 0.9, 0.95, 1e-8, 0.0);
    const bool tty = isatty(fileno(stdout));
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t step = 0; step < o.finetune_steps; ++step) {
      opt.lr = optim::warmup_cosine(step, 0, o.finetune_steps, o.lr, o.lr * 0.1);
      auto [x, y] = data.batch(true, o.batch, o.seq_len, o.seed ^ 0x2f4, uint64_t(step));
      manual_seed(o.seed ^ (0x9E3779B97F4A7C15ull * uint64_t(step + 1)));
      Tensor loss = lm_loss(*model, x, y);
      opt.zero_grad();
      loss.backward();
      optim::clip_grad_norm(model->parameters(), 1.0);
      opt.step();
      const int64_t done = step + 1;
      if (!o.quiet && (done % 10 == 0 || done == o.finetune_steps)) {
        const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const double rate = double(done) / std::max(el, 1e-9);
        std::printf("%sfine-tune %5lld/%lld  loss %.4f  %.1f steps/s  elapsed %s  ETA %s%s", tty ? "\r" : "", (long long)done,
                    (long long)o.finetune_steps, loss.item_double(), rate, format_duration(el).c_str(),
                    format_duration(double(o.finetune_steps - done) / std::max(rate, 1e-9)).c_str(),
                    (tty && done != o.finetune_steps) ? "   " : "\n");
        std::fflush(stdout);
      }
    }
    model->eval();
    r.finetuned_val = val();
  }
  if (o.values != "f32") {  // re-pack the fine-tuned weights with values in the storage dtype
    NoGradGuard g;
    for (auto& l : model->block_linears()) {
      SemiStructuredSparse s = to_sparse_semi_structured(l->sparse.to_dense(), dtype_from_name(o.values));
      l->sparse.values = s.values, l->sparse.meta = s.meta, l->sparse.scales = s.scales;  // the slots the state dict reads
    }
  }
  nn::ModelConfig cfg = model->config();  // the model was fine-tuned with f32 values
  cfg.sparse_values = o.values;
  make_dirs(o.out_dir);
  io::save_safetensors(o.out_dir + "/model.safetensors", model->state_dict(), {{"format", "sinter"}, {"sparsity", "2:4"}});
  io::atomic_write(o.out_dir + "/config.json", cfg.to_json());
  for (auto& l : model->block_linears()) r.sparse_bytes += l->sparse.nbytes();
  r.saved_val = o.values == "f32" ? r.finetuned_val : val();
  return r;
}

namespace {
int64_t sample(const Tensor& logits_row, const Sampling& s) {
  Tensor l = logits_row.to(DType::f32).reshape({-1});
  if (s.temperature <= 0) return argmax(l, 0).item<int64_t>();
  l = l / s.temperature;
  const int64_t V = l.size(0);
  if ((s.top_k > 0 && s.top_k < V) || s.top_p < 1.0) {
    auto sorted = topk(l, V, 0, true);
    std::vector<float> vals = sorted.values.to_vector<float>();
    std::vector<int64_t> idx = sorted.indices.to_vector<int64_t>();
    int64_t keep = s.top_k > 0 ? std::min(s.top_k, V) : V;
    if (s.top_p < 1.0) {
      std::vector<double> p(static_cast<size_t>(keep));
      double z = 0;
      for (int64_t i = 0; i < keep; ++i) z += p[size_t(i)] = std::exp(double(vals[size_t(i)] - vals[0]));
      double acc = 0;
      int64_t n = 0;
      while (n < keep && acc < s.top_p * z) acc += p[size_t(n++)];
      keep = std::max<int64_t>(n, 1);
    }
    std::vector<float> masked(size_t(V), -INFINITY);
    for (int64_t i = 0; i < keep; ++i) masked[size_t(idx[size_t(i)])] = vals[size_t(i)];
    l = tensor<float>(masked);
  }
  return multinomial(softmax(l, 0), 1, true).item<int64_t>();
}
}  // namespace

Tensor generate(nn::GPT& model, const Tensor& prompt, int64_t max_new, const Sampling& s, bool use_cache, double* rate,
                const std::function<void(int64_t)>& on_token) {
  SINTER_CHECK_SHAPE(prompt.dim() == 1 && prompt.numel() > 0, "[generate] the prompt must be a non-empty 1-D token tensor, got ",
                     prompt.shape());
  SINTER_CHECK(max_new >= 0, "[generate] max_new_tokens must be >= 0");
  SINTER_CHECK(s.temperature >= 0 && s.top_k >= 0 && s.top_p > 0 && s.top_p <= 1,
               "[generate] need temperature >= 0, top_k >= 0, 0 < top_p <= 1");
  const int64_t limit = model.config().max_position_embeddings;
  NoGradGuard g;
  const bool was_training = model.is_training();
  model.eval();
  manual_seed(s.seed);
  std::vector<int64_t> ids = prompt.to(DType::i64).to_vector<int64_t>();
  // The model sees a window of at most `limit` tokens; when it fills, it slides forward by half
  // (with the cache: the cache is refilled from the kept half), the same with or without cache.
  int64_t start = std::max<int64_t>(0, int64_t(ids.size()) - limit);
  std::vector<nn::KVCache> caches;
  if (use_cache) caches = model.make_caches(1, limit);
  auto window = [&] { return tensor<int64_t>(std::vector<int64_t>(ids.begin() + start, ids.end())).reshape({1, -1}); };
  const auto t0 = std::chrono::steady_clock::now();
  Tensor logits = model.forward(window(), use_cache ? &caches : nullptr);
  for (int64_t i = 0; i < max_new; ++i) {
    const int64_t next = sample(logits.select(0, 0).select(0, logits.size(1) - 1), s);
    ids.push_back(next);
    if (on_token) on_token(next);
    if (i + 1 == max_new) break;
    if (int64_t(ids.size()) - start > limit) {
      start = int64_t(ids.size()) - limit / 2;
      for (auto& c : caches) c.length = 0;
      logits = model.forward(window(), use_cache ? &caches : nullptr);
    } else if (use_cache) {
      logits = model.forward(tensor<int64_t>({next}).reshape({1, 1}), &caches);
    } else {
      logits = model.forward(window());
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (rate) *rate = double(max_new) / std::max(secs, 1e-9);
  model.train(was_training);
  return tensor<int64_t>(ids);
}

void write_loss_svg(const std::string& path, const std::vector<std::array<double, 3>>& rows) {
  const double W = 640, H = 400, L = 60, R = 20, T = 30, B = 50;
  double x1 = 1, ymin = 1e30, ymax = -1e30;
  for (auto& r : rows) {
    x1 = std::max(x1, r[0]);
    for (int k = 1; k < 3; ++k)
      if (std::isfinite(r[size_t(k)])) { ymin = std::min(ymin, r[size_t(k)]); ymax = std::max(ymax, r[size_t(k)]); }
  }
  if (ymin > ymax) { ymin = 0; ymax = 1; }
  if (ymax - ymin < 1e-6) ymax = ymin + 1;
  auto px = [&](double x) { return L + (W - L - R) * x / x1; };
  auto py = [&](double y) { return T + (H - T - B) * (1 - (y - ymin) / (ymax - ymin)); };
  std::ostringstream os;
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
     << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
     << "<text x=\"" << W / 2 << "\" y=\"18\" text-anchor=\"middle\" font-size=\"14\">loss (nats per byte)</text>\n"
     << "<line x1=\"" << L << "\" y1=\"" << H - B << "\" x2=\"" << W - R << "\" y2=\"" << H - B << "\" stroke=\"black\"/>\n"
     << "<line x1=\"" << L << "\" y1=\"" << T << "\" x2=\"" << L << "\" y2=\"" << H - B << "\" stroke=\"black\"/>\n";
  for (int i = 0; i <= 4; ++i) {
    const double y = ymin + (ymax - ymin) * i / 4, x = x1 * i / 4;
    os << "<text x=\"" << L - 6 << "\" y=\"" << py(y) + 4 << "\" text-anchor=\"end\">" << std::to_string(y).substr(0, 4) << "</text>\n"
       << "<line x1=\"" << L << "\" y1=\"" << py(y) << "\" x2=\"" << W - R << "\" y2=\"" << py(y) << "\" stroke=\"#ddd\"/>\n"
       << "<text x=\"" << px(x) << "\" y=\"" << H - B + 18 << "\" text-anchor=\"middle\">" << int64_t(x) << "</text>\n";
  }
  os << "<text x=\"" << (L + W - R) / 2 << "\" y=\"" << H - 10 << "\" text-anchor=\"middle\">step</text>\n";
  const char* colors[3] = {"", "#1f77b4", "#ff7f0e"};
  const char* names[3] = {"", "train", "validation"};
  for (int k = 1; k < 3; ++k) {
    os << "<polyline fill=\"none\" stroke=\"" << colors[k] << "\" stroke-width=\"" << (k == 2 ? 2 : 1.2) << "\" points=\"";
    for (auto& r : rows)
      if (std::isfinite(r[size_t(k)])) os << px(r[0]) << "," << py(r[size_t(k)]) << " ";
    os << "\"/>\n<text x=\"" << W - R - 90 << "\" y=\"" << T + 16 * k << "\" fill=\"" << colors[k] << "\">" << names[k] << "</text>\n";
  }
  os << "</svg>\n";
  io::atomic_write(path, os.str());
}

}  // namespace sinter::train

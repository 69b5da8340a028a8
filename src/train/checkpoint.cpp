// Checkpoints: one file each for the model and the optimizer state (or their sharded pieces) and
// config.json, under names carrying the step, then train_state.json naming them: a whole-step
// commit (commit.cpp). log.csv and loss.svg beside them.
#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/format.h"
#include "sinter/autograd.h"
#include "sinter/dist.h"
#include "sinter/io.h"
#include "sinter/optim.h"
#include "sinter/random.h"
#include "sinter/sparse.h"
#include "train/internal.h"

namespace sinter::train {

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace detail {

std::string read_file(const std::string& path) {
  std::error_code ec;
  SINTER_CHECK_T(IOError, fs::is_regular_file(path, ec), "[", path, "] not found");
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void make_dirs(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  SINTER_CHECK_T(IOError, !ec, "[", dir, "] cannot create the folder: ", ec.message());
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
namespace {
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
}  // namespace

bool sharded_checkpoint(const std::string& dir) {
  std::error_code ec;
  return dist::has_sharded(dir, sharded_stem(dir, "model")) && !fs::exists(committed_path(dir, "model.safetensors"), ec);
}

// The optimizer state of a checkpoint in either format, as this run's pieces.
std::map<std::string, Tensor> load_optimizer_state(const std::string& dir, nn::GPT& model) {
  const std::map<std::string, dist::DTensor> params = parameter_pieces(model);
  std::error_code ec;
  const std::string single = committed_path(dir, "optimizer.safetensors"), stem = sharded_stem(dir, "optimizer");
  if (!fs::exists(single, ec) && dist::has_sharded(dir, stem)) {
    // Targets shaped like this run's pieces: exp_avg / exp_avg_sq of every parameter, and the step.
    std::map<std::string, Tensor> state;
    for (auto& [name, p] : model.named_parameters())
      state["exp_avg." + name] = zeros_like(p->detach()), state["exp_avg_sq." + name] = zeros_like(p->detach());
    state["step"] = zeros({}, DType::i64);
    std::map<std::string, dist::DTensor> pieces;
    std::map<std::string, Tensor> plain;
    split_state(params, state, pieces, plain);
    dist::load_sharded_into(dir, stem, pieces, plain);
    return state;
  }
  std::map<std::string, Tensor> full = io::load_safetensors(single).tensors;
  for (auto& [key, t] : full)  // whole tensors: keep this run's piece of each
    if (const dist::DTensor* l = state_layout(params, key)) t = dist::distribute_tensor(t, l->mesh(), l->placements()).to_local();
  return full;
}

void write_log(const std::string& dir, const LogRows& rows) {
  std::ostringstream os;
  os << "step,train_loss,val_loss,tokens_per_s\n";
  // A step without a value (no validation, a skipped update) has an empty cell.
  auto cell = [](double v) { return std::isnan(v) ? std::string() : fixed(v, 6); };
  for (auto& r : rows) os << int64_t(r[0]) << "," << cell(r[1]) << "," << cell(r[2]) << "," << fixed(r[3], 1) << "\n";
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
  for (int lineno = 2; std::getline(f, line); ++lineno) {
    std::array<double, 4> r{};
    std::stringstream ss(line);
    std::string cell;
    for (int i = 0; i < 4 && std::getline(ss, cell, ','); ++i) {
      size_t used = 0;
      try {
        r[size_t(i)] = cell.empty() ? NAN : std::stod(cell, &used);
      } catch (const std::exception&) {
        used = std::string::npos;
      }
      SINTER_CHECK_T(IOError, cell.empty() || used == cell.size(), "[", dir, "/log.csv] line ", lineno, ": '", cell,
                     "' is not a number (the log is written by train; remove the line or the file to resume)");
    }
    if (r[0] <= double(up_to_step)) rows.push_back(r);
  }
  return rows;
}

void save_sharded_checkpoint(const std::string& dir, nn::GPT& model, const optim::Optimizer& opt,
                             const std::string& train_state_json, bool main_rank, int keep) {
  json state = json::parse(train_state_json);
  const int64_t step = state.value("step", int64_t(0));
  state["step"] = step;
  const std::string model_stem = step_name("model", step), opt_stem = step_name("optimizer", step);
  std::map<std::string, dist::DTensor> params = parameter_pieces(model), states;
  std::map<std::string, Tensor> plain_params, plain_states;
  for (auto& [name, p] : model.named_parameters())
    if (!params.count(name)) plain_params[name] = *p;
  for (auto& [name, b] : model.named_buffers()) plain_params[name] = *b;
  split_state(params, opt.state_dict(), states, plain_states);
  dist::save_sharded(dir, model_stem, params, plain_params);  // (each returns when every rank has written)
  dist::save_sharded(dir, opt_stem, states, plain_states);
  if (main_rank) {
    const std::string config = step_name("config", step) + ".json";
    io::atomic_write(dir + "/" + config, model.config().to_json());
    commit_step(dir, state,
                {{"model.index.json", model_stem + ".index.json"}, {"optimizer.index.json", opt_stem + ".index.json"}, {"config.json", config}},
                keep, {"model.safetensors", "optimizer.safetensors"});
  }
  dist::world()->barrier().wait();  // every rank returns with the step committed
}

}  // namespace detail

using namespace detail;

namespace {
// A checkpoint holds host bytes in one format whatever device trained: device tensors are copied.
std::map<std::string, Tensor> on_cpu(std::map<std::string, Tensor> sd) {
  for (auto& [name, t] : sd)
    if (t.defined() && t.device() != Device::cpu()) t = t.to(Device::cpu());
  return sd;
}
}  // namespace

void save_checkpoint(const std::string& dir, nn::GPT& model, const std::map<std::string, Tensor>& optimizer_state,
                     const std::string& train_state_json, int keep) {
  make_dirs(dir);
  json state = json::parse(train_state_json);
  const int64_t step = state.value("step", int64_t(0));
  state["step"] = step;
  const std::string weights = step_name("model", step) + ".safetensors", opt = step_name("optimizer", step) + ".safetensors",
                    config = step_name("config", step) + ".json";
  io::save_safetensors(dir + "/" + weights, on_cpu(model.state_dict()), {{"format", "sinter"}});
  io::save_safetensors(dir + "/" + opt, on_cpu(optimizer_state));
  io::atomic_write(dir + "/" + config, model.config().to_json());
  commit_step(dir, state, {{"model.safetensors", weights}, {"optimizer.safetensors", opt}, {"config.json", config}}, keep,
              {"model.index.json", "optimizer.index.json"});
}

void detail::check_trains_on_bytes(const std::string& dir, const char* op) {
  std::error_code ec;
  SINTER_CHECK(!fs::exists(dir + "/tokenizer.json", ec), "[", op, "] ", dir, " has a tokenizer.json: its model reads BPE token ids, "
               "while training reads byte-level data (id = byte), which would feed it the wrong tokens");
}

std::unique_ptr<nn::GPT> load_model(const std::string& dir) {
  std::error_code ec;
  SINTER_CHECK_T(IOError, fs::is_directory(dir, ec), "[", dir, "] checkpoint folder not found");
  if (nn::is_pretrained_dir(dir)) return nn::GPT::from_pretrained(dir);  // a Hugging Face save_pretrained folder
  const std::string cfg_path = committed_path(dir, "config.json");
  auto cfg = nn::ModelConfig::from_json(read_file(cfg_path), cfg_path);
  const bool sharded = sharded_checkpoint(dir);
  const std::string weights = sharded ? committed_path(dir, "model.index.json") : committed_path(dir, "model.safetensors");
  std::map<std::string, Tensor> sd = sharded ? dist::load_sharded(dir, sharded_stem(dir, "model")) : io::load_safetensors(weights).tensors;
  // The weights must fit the config before the model is allocated (a config naming a far larger
  // model would otherwise allocate all of it first).
  std::set<std::string> blocks;
  for (auto& [name, t] : sd)
    if (name.rfind("blocks.", 0) == 0) blocks.insert(name.substr(0, name.find('.', 7)));
  auto emb = sd.find("tok_emb.weight");
  const bool fits = emb != sd.end() && emb->second.shape() == Shape{cfg.vocab_size, cfg.hidden_size} &&
                    int64_t(blocks.size()) == cfg.num_hidden_layers;
  if (!fits) {
    std::ostringstream os;
    os << "[" << cfg_path << "] the config (vocab_size " << cfg.vocab_size << ", hidden_size " << cfg.hidden_size << ", "
       << cfg.num_hidden_layers << " layers) does not fit the weights in " << weights << ": ";
    if (emb == sd.end()) os << "they have no tok_emb.weight";
    else os << "tok_emb.weight is " << emb->second.shape() << ", " << blocks.size() << " blocks";
    SINTER_THROW(IOError, os.str());
  }
  auto model = [&] {
    nn::SkipInitGuard skip;  // every weight comes from the checkpoint next
    return std::make_unique<nn::GPT>(cfg);
  }();
  try {
    model->load_state_dict(sd);
  } catch (const Error& e) {
    SINTER_THROW(IOError, "[", weights, "] ", e.what());
  }
  return model;
}

}  // namespace sinter::train

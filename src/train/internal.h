#pragma once
// What the training-loop files (train.cpp, checkpoint.cpp, sparsify.cpp, generate.cpp) share.
#include <array>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sinter/dist.h"
#include "sinter/optim.h"
#include "sinter/train.h"

namespace sinter::train::detail {

std::string read_file(const std::string& path);
void make_dirs(const std::string& dir);
// Training reads byte-level data (token id = byte). A checkpoint folder with a tokenizer.json
// (a BPE vocabulary) would be fed the wrong ids: refused naming the folder and the command.
void check_trains_on_bytes(const std::string& dir, const char* op);
// Mean cross-entropy of the model's next-token predictions (the sharded loss under tensor parallelism).
Tensor lm_loss(nn::GPT& model, const Tensor& x, const Tensor& y);

// A parallel run's parameters as DTensors (their layouts).
std::map<std::string, dist::DTensor> parameter_pieces(nn::GPT& model);
bool sharded_checkpoint(const std::string& dir);
// The optimizer state of a checkpoint in either format, as this run's pieces.
std::map<std::string, Tensor> load_optimizer_state(const std::string& dir, nn::GPT& model);
void save_sharded_checkpoint(const std::string& dir, nn::GPT& model, const optim::Optimizer& opt,
                             const std::string& train_state_json, bool main_rank, int keep);

// train_state.json, validated: the step, the options and data fingerprint a resume checks, and the
// committed files (plain name -> the step's file, both bare file names in the checkpoint folder).
// Anything else (wrong types, a negative step, a file name with a folder in it) is an IOError
// naming `path` and the key.
struct TrainState {
  int64_t step = 0;
  nlohmann::json options;  // object, or null in checkpoints from before options were recorded
  std::string data_fingerprint;
  std::map<std::string, std::string> files;
};
TrainState parse_train_state(const std::string& text, const std::string& path);

// Whole-step commits (commit.cpp): a step's files carry the step in their names; train_state.json,
// written last, names them (the commit); the plain names are then linked to them.
std::string step_name(const std::string& stem, int64_t step);  // "model" -> "model.step-00000500"
// The file the committed checkpoint holds under a plain name ("model.safetensors", "config.json",
// "model.index.json"): the step's file train_state.json names, or the plain one (older checkpoints).
std::string committed_path(const std::string& dir, const std::string& plain);
// The committed sharded stem of "model" or "optimizer" ("model.step-00000500", or "model").
std::string sharded_stem(const std::string& dir, const std::string& stem);
// Commits `state` (with "files": plain name -> the step's file) as train_state.json, removes the
// other format's plain names (`stale`), links the plain names, and keeps the last `keep` steps.
void commit_step(const std::string& dir, nlohmann::json state, const std::map<std::string, std::string>& files, int keep,
                 const std::vector<std::string>& stale);
// Removes the files of steps other than the committed one and the (keep - 1) before it: what a
// save killed before its commit left.
void remove_uncommitted_steps(const std::string& dir, int keep);

// log.csv rows: step, train_loss, val_loss (NaN when not measured), tokens/s.
using LogRows = std::vector<std::array<double, 4>>;
void write_log(const std::string& dir, const LogRows& rows);
LogRows read_log(const std::string& dir, int64_t up_to_step);

}  // namespace sinter::train::detail

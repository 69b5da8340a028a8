#pragma once
// What the training-loop files (train.cpp, checkpoint.cpp, sparsify.cpp, generate.cpp) share.
#include <array>
#include <map>
#include <string>
#include <vector>

#include "sinter/dist.h"
#include "sinter/optim.h"
#include "sinter/train.h"

namespace sinter::train::detail {

std::string read_file(const std::string& path);
void make_dirs(const std::string& dir);
// Mean cross-entropy of the model's next-token predictions (the sharded loss under tensor parallelism).
Tensor lm_loss(nn::GPT& model, const Tensor& x, const Tensor& y);

// A parallel run's parameters as DTensors (their layouts).
std::map<std::string, dist::DTensor> parameter_pieces(nn::GPT& model);
bool sharded_checkpoint(const std::string& dir);
// The optimizer state of a checkpoint in either format, as this run's pieces.
std::map<std::string, Tensor> load_optimizer_state(const std::string& dir, nn::GPT& model);
void save_sharded_checkpoint(const std::string& dir, nn::GPT& model, const optim::Optimizer& opt,
                             const std::string& train_state_json, bool main_rank);

// log.csv rows: step, train_loss, val_loss (NaN when not measured), tokens/s.
using LogRows = std::vector<std::array<double, 4>>;
void write_log(const std::string& dir, const LogRows& rows);
LogRows read_log(const std::string& dir, int64_t up_to_step);

}  // namespace sinter::train::detail

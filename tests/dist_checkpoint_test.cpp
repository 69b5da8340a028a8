// Sharded checkpoints in one process: an interrupted save leaves the previous checkpoint whole,
// a later save clears its leftovers, and damaged files get errors that name them.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "sinter/dist.h"
#include "sinter/io.h"
#include "test_util.h"

using namespace sinter;
namespace fs = std::filesystem;

namespace {
std::string fresh_dir(const std::string& name) {
  const std::string d = (fs::temp_directory_path() / ("sinter_ckpt_" + name + "_" + std::to_string(::getpid()))).string();
  fs::remove_all(d);
  return d;
}
int count_shards(const std::string& dir) {
  int n = 0;
  for (auto& e : fs::directory_iterator(dir)) n += e.path().filename().string().find(".shard-") != std::string::npos;
  return n;
}
}  // namespace

TEST(ShardedCheckpoint, AnInterruptedSaveLeavesThePreviousOneWhole) {
  const std::string dir = fresh_dir("interrupted");
  dist::DeviceMesh mesh({{"x", 1}});
  manual_seed(3);
  Tensor a = randn({5, 4}), b = randn({3});
  dist::save_sharded(dir, "model", {{"a", dist::distribute_tensor(a, mesh, {dist::Placement::Shard(0)})}}, {{"b", b}});
  // A save that died after writing its piece, before the index: a new generation's file, no index.
  io::save_safetensors(dir + "/model-0badf00d.shard-00000-of-00001.safetensors", {{"a", zeros({5, 4})}, {"b", zeros({3})}});
  auto back = dist::load_sharded(dir, "model");
  EXPECT_TRUE(test::all_close(back["a"], a, 0.0, 0.0));
  EXPECT_TRUE(test::all_close(back["b"], b, 0.0, 0.0));
  EXPECT_EQ(count_shards(dir), 2);
  // The next complete save replaces the index and clears both older generations.
  dist::save_sharded(dir, "model", {{"a", dist::distribute_tensor(a * 2.0, mesh, {dist::Placement::Shard(0)})}}, {{"b", b}});
  EXPECT_EQ(count_shards(dir), 1);
  EXPECT_TRUE(test::all_close(dist::load_sharded(dir, "model")["a"], a * 2.0, 0.0, 0.0));
  fs::remove_all(dir);
}

TEST(ShardedCheckpoint, DamagedFilesGetErrorsNamingThem) {
  const std::string dir = fresh_dir("damaged");
  dist::DeviceMesh mesh({{"x", 1}});
  dist::save_sharded(dir, "model", {{"a", dist::distribute_tensor(ones({4, 2}), mesh, {dist::Placement::Shard(0)})}});
  auto expect_error = [&](const std::string& needle) {
    try {
      dist::load_sharded(dir, "model");
      ADD_FAILURE() << "no error; wanted one naming " << needle;
    } catch (const IOError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  std::string shard;
  for (auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".shard-") != std::string::npos) shard = e.path().filename().string();
  fs::copy_file(dir + "/" + shard, dir + "/keep", fs::copy_options::overwrite_existing);
  std::ofstream(dir + "/" + shard, std::ios::trunc) << "not a safetensors file";
  expect_error(shard);
  fs::remove(dir + "/" + shard);
  expect_error(shard);  // missing
  fs::rename(dir + "/keep", dir + "/" + shard);
  std::ofstream(dir + "/model.index.json", std::ios::trunc) << "{\"format\": \"sinter-sharded\", \"tensors\": ";
  expect_error("model.index.json");
  fs::remove(dir + "/model.index.json");
  expect_error("model.index.json");
  fs::remove_all(dir);
}

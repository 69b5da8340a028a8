#pragma once
// Byte-level tokenizer and a dataset of random windows over a text, split into train/validation.
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "sinter/tensor.h"

namespace sinter::data {

Tensor encode(const std::string& text);   // bytes -> int64 token ids (vocabulary of 256)
std::string decode(const Tensor& ids);    // int64 ids -> bytes

class ByteDataset {
 public:
  // The last `val_fraction` of the bytes is the validation split. The file is memory-mapped (a
  // corpus larger than RAM trains fine). Throws IOError naming the file when it is missing,
  // unreadable or too small for the requested windows.
  static ByteDataset from_file(const std::string& path, double val_fraction = 0.05);
  static ByteDataset from_text(std::string text, const std::string& name, double val_fraction = 0.05);
  // The fortune-cookie corpus Debian's `fortunes` package installs, concatenated in name order.
  static ByteDataset fortunes(double val_fraction = 0.05);

  // Window batch number `index` (B, T) and its next-token targets, drawn with Philox from
  // (seed, index) alone: the same batch on any run, so a resumed run continues exactly.
  std::pair<Tensor, Tensor> batch(bool train, int64_t B, int64_t T, uint64_t seed, uint64_t index) const;
  int64_t train_bytes() const { return split_; }
  int64_t val_bytes() const { return int64_t(text_.size()) - split_; }
  const std::string& name() const { return name_; }
  // A hex fingerprint of the data: its size and a hash of its first 64 KiB (what a resumed run
  // checks to know it reads the data its checkpoint was trained on).
  std::string fingerprint() const;
  void check_window(int64_t T) const;  // both splits must hold a window of T + 1 bytes

  ByteDataset(std::shared_ptr<const void> owner, std::string_view text, std::string name, int64_t split)
      : owner_(std::move(owner)), text_(text), name_(std::move(name)), split_(split) {}

 private:
  std::shared_ptr<const void> owner_;  // keeps the mapping or the string alive
  std::string_view text_;
  std::string name_;
  int64_t split_ = 0;
};

}  // namespace sinter::data

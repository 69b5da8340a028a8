#pragma once
// Text <-> token ids. Two kinds: bytes (one id per byte, Sinter's own models), and a Hugging Face
// `tokenizer.json` holding a byte-level BPE (GPT-2's kind: ByteLevel pre-tokenizer and decoder, a
// vocabulary and ranked merges, special tokens), read as transformers writes it and applied as
// the `tokenizers` library does (tests/tokenizer_test.cpp compares against it).
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sinter::text {

class Tokenizer {
 public:
  static Tokenizer bytes();
  // A tokenizer.json; an IOError names the file and what in it is wrong or not supported (other
  // models than BPE, other pre-tokenizers than ByteLevel, normalizers).
  static Tokenizer from_file(const std::string& path);

  std::vector<int64_t> encode(std::string_view text) const;
  // The bytes the ids stand for, special tokens included (possibly not valid UTF-8 when the ids
  // end inside a character); an id outside the vocabulary is a ValueError naming it.
  std::string decode(const std::vector<int64_t>& ids) const;
  const std::string& token_bytes(int64_t id) const;  // one id's bytes (for printing as tokens come)
  int64_t vocab_size() const;                        // largest id + 1
  bool is_bytes() const { return bpe_ == nullptr; }

  struct Bpe;

 private:
  static Tokenizer parse_file(const std::string& path);
  std::shared_ptr<const Bpe> bpe_;  // null: bytes
};

}  // namespace sinter::text

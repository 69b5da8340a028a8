// Byte-level BPE (sinter/tokenizer.h): the tokens of a tokenizer.json turned back into the bytes
// they stand for, so encoding works on bytes: split off special tokens, pre-tokenize with GPT-2's
// pattern, then merge each piece's bytes by rank.
#include "sinter/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "sinter/error.h"

namespace sinter::text {
namespace {

struct CodeRange {
  uint32_t lo, hi;
};
#include "text/unicode_tables.inc"

template <size_t N> bool in_ranges(const CodeRange (&r)[N], uint32_t c) {
  const CodeRange* it = std::upper_bound(r, r + N, c, [](uint32_t v, const CodeRange& x) { return v < x.lo; });
  return it != r && c <= (it - 1)->hi;
}
bool is_letter(uint32_t c) { return c < 128 ? ((c | 32) >= 'a' && (c | 32) <= 'z') : in_ranges(kLetterRanges, c); }
bool is_number(uint32_t c) { return c < 128 ? (c >= '0' && c <= '9') : in_ranges(kNumberRanges, c); }
bool is_space(uint32_t c) {  // Unicode White_Space, as the pattern's \s
  return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Code points of a byte string with their byte offsets; a byte that does not start valid UTF-8
// is a code point of its own (outside Unicode, so it is neither letter, number nor space).
struct CodePoints {
  std::vector<uint32_t> cp;
  std::vector<size_t> at;  // byte offset of cp[i]; at[size] = the end
};
CodePoints decode_utf8(std::string_view s) {
  CodePoints out;
  for (size_t i = 0; i < s.size();) {
    const auto b = uint8_t(s[i]);
    int n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    uint32_t c = n == 1 ? b : n == 2 ? (b & 0x1Fu) : n == 3 ? (b & 0x0Fu) : (b & 0x07u);
    for (int k = 1; k < n; ++k) {
      if (i + size_t(k) >= s.size() || (uint8_t(s[i + size_t(k)]) >> 6) != 2) {
        n = 0;
        break;
      }
      c = (c << 6) | (uint8_t(s[i + size_t(k)]) & 0x3Fu);
    }
    if (n == 0) n = 1, c = 0x110000u + b;  // not UTF-8
    out.cp.push_back(c);
    out.at.push_back(i);
    i += size_t(n);
  }
  out.at.push_back(s.size());
  return out;
}

// GPT-2's pre-tokenizer pattern, matched by hand: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+|
// ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ . Returns the pieces' byte ranges.
std::vector<std::pair<size_t, size_t>> pre_tokenize(std::string_view s) {
  const CodePoints t = decode_utf8(s);
  const size_t n = t.cp.size();
  const auto other = [](uint32_t c) { return !is_space(c) && !is_letter(c) && !is_number(c); };
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t i = 0; i < n;) {
    const uint32_t c = t.cp[i];
    size_t j = i;
    if (c == '\'' && i + 1 < n) {
      const uint32_t a = t.cp[i + 1], b = i + 2 < n ? t.cp[i + 2] : 0;
      if (a == 's' || a == 't' || a == 'm' || a == 'd') j = i + 2;
      else if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) j = i + 3;
    }
    if (j == i) {
      const size_t k = c == ' ' && i + 1 < n ? i + 1 : i;  // the optional leading space
      for (const auto& cls : {is_letter, is_number}) {
        if (j == i && cls(t.cp[k])) {
          j = k;
          while (j < n && cls(t.cp[j])) ++j;
        }
      }
      if (j == i && other(t.cp[k])) {
        j = k;
        while (j < n && other(t.cp[j])) ++j;
      }
    }
    if (j == i) {  // whitespace: all of it at the end, else all but the last (which joins the next piece)
      while (j < n && is_space(t.cp[j])) ++j;
      if (j < n && j - i > 1) --j;
    }
    out.emplace_back(t.at[i], t.at[j]);
    i = j;
  }
  return out;
}

// GPT-2's map from bytes to printable code points, in which tokenizer.json spells its tokens.
std::vector<uint32_t> byte_to_unicode() {
  std::vector<uint32_t> m(256);
  uint32_t extra = 256;
  for (uint32_t b = 0; b < 256; ++b)
    m[b] = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174) ? b : extra++;
  return m;
}

}  // namespace

struct Tokenizer::Bpe {
  std::string path;
  std::unordered_map<std::string, int64_t> ids;  // a token's bytes -> id
  std::vector<std::string> bytes_of;             // id -> bytes
  std::unordered_map<std::string, int> rank;     // first bytes + '\0' + second bytes -> merge rank
  std::vector<std::pair<std::string, int64_t>> special;  // added tokens, longest first
  bool ignore_merges = false, add_prefix_space = false;
  mutable std::mutex mu;
  mutable std::unordered_map<std::string, std::vector<int64_t>> cache;

  void encode_piece(std::string_view piece, std::vector<int64_t>& out) const {
    const std::string key(piece);
    {
      std::lock_guard<std::mutex> g(mu);
      if (auto it = cache.find(key); it != cache.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<int64_t> got;
    auto whole = ids.find(key);
    if (ignore_merges && whole != ids.end()) {
      got.push_back(whole->second);
    } else {
      std::vector<std::string> sym;
      for (char b : piece) sym.emplace_back(1, b);
      for (;;) {  // merge the adjacent pair of lowest rank (the leftmost among equals)
        int best = std::numeric_limits<int>::max();
        size_t at = 0;
        for (size_t i = 0; i + 1 < sym.size(); ++i) {
          auto r = rank.find(sym[i] + '\0' + sym[i + 1]);
          if (r != rank.end() && r->second < best) best = r->second, at = i;
        }
        if (best == std::numeric_limits<int>::max()) break;
        sym[at] += sym[at + 1];
        sym.erase(sym.begin() + long(at) + 1);
      }
      for (const std::string& s : sym) {
        auto it = ids.find(s);
        SINTER_CHECK_T(IOError, it != ids.end(), "[", path, "] the vocabulary has no token for the bytes of '", s,
                       "' (a byte-level BPE vocabulary holds all 256 bytes)");
        got.push_back(it->second);
      }
    }
    out.insert(out.end(), got.begin(), got.end());
    std::lock_guard<std::mutex> g(mu);
    if (cache.size() < 100000) cache.emplace(key, std::move(got));
  }

  void encode_text(std::string_view s, std::vector<int64_t>& out) const {
    for (auto [a, b] : pre_tokenize(s)) encode_piece(s.substr(a, b - a), out);
  }
};

Tokenizer Tokenizer::bytes() { return Tokenizer(); }

namespace {
constexpr int64_t kMaxVocab = int64_t(1) << 24;
}

Tokenizer Tokenizer::from_file(const std::string& path) {
  try {
    return parse_file(path);
  } catch (const nlohmann::json::exception& e) {  // a field of the wrong JSON type
    SINTER_THROW(IOError, "[", path, "] is not a tokenizer.json as transformers writes it: ", e.what());
  }
}

Tokenizer Tokenizer::parse_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  SINTER_CHECK_T(IOError, f.good(), "[", path, "] cannot open the tokenizer file");
  std::stringstream ss;
  ss << f.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ss.str());
  } catch (const std::exception& e) {
    SINTER_THROW(IOError, "[", path, "] is not JSON: ", e.what());
  }
  const auto field = [&](const nlohmann::json& o, const char* key) -> const nlohmann::json& {
    SINTER_CHECK_T(IOError, o.is_object() && o.contains(key), "[", path, "] has no '", key, "'");
    return o.at(key);
  };
  const auto type_of = [](const nlohmann::json& o) { return o.is_object() && o.contains("type") && o["type"].is_string() ? o["type"].get<std::string>() : std::string("none"); };
  const nlohmann::json& model = field(j, "model");
  SINTER_CHECK_T(IOError, type_of(model) == "BPE", "[", path, "] the tokenizer's model is ", type_of(model),
                 "; only byte-level BPE (GPT-2's kind) is read");
  const nlohmann::json pre = j.value("pre_tokenizer", nlohmann::json());
  SINTER_CHECK_T(IOError, type_of(pre) == "ByteLevel", "[", path, "] the pre_tokenizer is ", type_of(pre),
                 "; only ByteLevel (GPT-2's) is read");
  SINTER_CHECK_T(IOError, j.value("normalizer", nlohmann::json()).is_null(), "[", path, "] has a normalizer (",
                 type_of(j["normalizer"]), "), which is not supported");
  SINTER_CHECK_T(IOError, pre.value("use_regex", true), "[", path, "] a ByteLevel pre_tokenizer without its regex is not supported");
  auto bpe = std::make_shared<Bpe>();
  bpe->path = path;
  bpe->add_prefix_space = pre.value("add_prefix_space", false);
  bpe->ignore_merges = model.value("ignore_merges", false);
  // Tokens are spelled in GPT-2's printable code points: map each back to its byte.
  std::unordered_map<uint32_t, char> to_byte;
  const std::vector<uint32_t> b2u = byte_to_unicode();
  for (uint32_t b = 0; b < 256; ++b) to_byte[b2u[b]] = char(b);
  const auto raw = [&](const std::string& token) {
    const CodePoints t = decode_utf8(token);
    std::string out;
    for (uint32_t c : t.cp) {
      auto it = to_byte.find(c);
      SINTER_CHECK_T(IOError, it != to_byte.end(), "[", path, "] token '", token, "' is not spelled in byte-level code points");
      out += it->second;
    }
    return out;
  };
  const nlohmann::json& vocab = field(model, "vocab");
  SINTER_CHECK_T(IOError, vocab.is_object() && !vocab.empty(), "[", path, "] model.vocab must be a non-empty object");
  int64_t size = 0;
  for (auto& [token, id] : vocab.items()) {
    SINTER_CHECK_T(IOError, id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < kMaxVocab, "[", path, "] token '",
                   token, "' has no valid id (0 .. 2^24 - 1)");
    size = std::max(size, id.get<int64_t>() + 1);
  }
  for (const auto& a : j.value("added_tokens", nlohmann::json::array()))
    size = std::max(size, std::clamp<int64_t>(a.value("id", int64_t(0)), 0, kMaxVocab - 1) + 1);
  bpe->bytes_of.assign(size_t(size), std::string());
  for (auto& [token, id] : vocab.items()) {
    std::string r = raw(token);
    bpe->bytes_of[size_t(id.get<int64_t>())] = r;
    bpe->ids.emplace(std::move(r), id.get<int64_t>());
  }
  int r = 0;
  for (const auto& m : field(model, "merges")) {
    std::string a, b;
    if (m.is_string()) {  // "a b" (older files)
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      SINTER_CHECK_T(IOError, sp != std::string::npos, "[", path, "] merge '", s, "' is not two tokens");
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else {
      SINTER_CHECK_T(IOError, m.is_array() && m.size() == 2, "[", path, "] merge ", r, " is not a pair of tokens");
      a = m[0].get<std::string>(), b = m[1].get<std::string>();
    }
    bpe->rank.emplace(raw(a) + '\0' + raw(b), r++);
  }
  for (const auto& a : j.value("added_tokens", nlohmann::json::array())) {
    const std::string content = a.value("content", std::string());
    const int64_t id = a.value("id", int64_t(-1));
    SINTER_CHECK_T(IOError, !content.empty() && id >= 0 && id < size, "[", path, "] an added token has no content or valid id");
    bpe->special.emplace_back(content, id);
    bpe->bytes_of[size_t(id)] = content;
  }
  std::stable_sort(bpe->special.begin(), bpe->special.end(), [](const auto& x, const auto& y) { return x.first.size() > y.first.size(); });
  Tokenizer t;
  t.bpe_ = std::move(bpe);
  return t;
}

std::vector<int64_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int64_t> out;
  if (!bpe_) {
    for (char c : text) out.push_back(int64_t(uint8_t(c)));
    return out;
  }
  // Special tokens first (the earliest occurrence, the longest at a position), the text between
  // them pre-tokenized and merged.
  std::string prefixed;
  if (bpe_->add_prefix_space && !text.empty() && text[0] != ' ') {
    prefixed.reserve(text.size() + 1);
    prefixed.push_back(' ');
    prefixed.append(text);
    text = prefixed;
  }
  size_t i = 0;
  while (i < text.size()) {
    size_t best = std::string_view::npos;
    const std::pair<std::string, int64_t>* which = nullptr;
    for (const auto& sp : bpe_->special) {
      const size_t at = text.find(sp.first, i);
      if (at < best) best = at, which = &sp;
    }
    bpe_->encode_text(text.substr(i, (which ? best : text.size()) - i), out);
    if (!which) break;
    out.push_back(which->second);
    i = best + which->first.size();
  }
  return out;
}

const std::string& Tokenizer::token_bytes(int64_t id) const {
  static const std::vector<std::string> single = [] {
    std::vector<std::string> v(256);
    for (int b = 0; b < 256; ++b) v[size_t(b)] = std::string(1, char(b));
    return v;
  }();
  const std::vector<std::string>& table = bpe_ ? bpe_->bytes_of : single;
  SINTER_CHECK_T(ValueError, id >= 0 && id < int64_t(table.size()), "[tokenizer] id ", id, " is outside the vocabulary (0..",
                 int64_t(table.size()) - 1, ")");
  return table[size_t(id)];
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  for (int64_t id : ids) out += token_bytes(id);
  return out;
}

int64_t Tokenizer::vocab_size() const { return bpe_ ? int64_t(bpe_->bytes_of.size()) : 256; }

}  // namespace sinter::text

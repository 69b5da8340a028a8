#include <csetjmp>
#include <csignal>
#include <cstdio>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include "core/format.h"
#include "sinter/data.h"
#include "sinter/random.h"

namespace sinter::data {

Tensor encode(const std::string& text) {
  Tensor t = Tensor::empty({int64_t(text.size())}, DType::i64);
  int64_t* p = t.data<int64_t>();
  for (size_t i = 0; i < text.size(); ++i) p[i] = static_cast<unsigned char>(text[i]);
  return t;
}

std::string decode(const Tensor& ids) {
  std::string s;
  for (int64_t v : ids.contiguous().to(DType::i64).to_vector<int64_t>()) s.push_back(char(uint8_t(v)));
  return s;
}

namespace {
ByteDataset make(std::shared_ptr<const void> owner, std::string_view text, const std::string& name, double val_fraction);

// A mapped data file that shrinks under the reader (truncated or rewritten while training runs)
// raises SIGBUS on the first read past its new end. While batch() copies windows, SIGBUS jumps
// back to it and becomes an error naming the file; elsewhere the previous disposition applies.
thread_local sigjmp_buf* g_bus_jump = nullptr;
struct sigaction g_prev_bus;
void on_sigbus(int sig, siginfo_t* info, void* ctx) {
  if (g_bus_jump) siglongjmp(*g_bus_jump, 1);
  if ((g_prev_bus.sa_flags & SA_SIGINFO) && g_prev_bus.sa_sigaction) return g_prev_bus.sa_sigaction(sig, info, ctx);
  if (!(g_prev_bus.sa_flags & SA_SIGINFO) && g_prev_bus.sa_handler != SIG_DFL && g_prev_bus.sa_handler != SIG_IGN)
    return g_prev_bus.sa_handler(sig);
  std::signal(SIGBUS, SIG_DFL);
  std::raise(SIGBUS);
}
void install_sigbus_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, &g_prev_bus);
  });
}
}  // namespace

ByteDataset ByteDataset::from_text(std::string text, const std::string& name, double val_fraction) {
  auto owned = std::make_shared<const std::string>(std::move(text));
  return make(owned, *owned, name, val_fraction);
}

ByteDataset ByteDataset::from_file(const std::string& path, double val_fraction) {
  std::error_code ec;
  SINTER_CHECK_T(IOError, std::filesystem::is_regular_file(path, ec), "[", path, "] no such data file");
  const int fd = ::open(path.c_str(), O_RDONLY);
  SINTER_CHECK_T(IOError, fd >= 0, "[", path, "] cannot read the data file: ", std::strerror(errno));
  struct stat st;
  const bool ok = ::fstat(fd, &st) == 0;
  const size_t size = ok ? size_t(st.st_size) : 0;
  void* p = size ? ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0) : nullptr;
  const int err = errno;
  ::close(fd);
  SINTER_CHECK_T(IOError, ok && p != MAP_FAILED, "[", path, "] cannot map the data file: ", std::strerror(err));
  install_sigbus_handler();
  std::shared_ptr<const void> owner(p, [size](const void* q) {
    if (q) ::munmap(const_cast<void*>(q), size);
  });
  return make(owner, std::string_view(static_cast<const char*>(p), size), path, val_fraction);
}

namespace {
ByteDataset make(std::shared_ptr<const void> owner, std::string_view text, const std::string& name, double val_fraction) {
  SINTER_CHECK(val_fraction > 0 && val_fraction < 1, "[data] validation fraction must be in (0, 1), got ", val_fraction);
  SINTER_CHECK_T(IOError, !text.empty(), "[", name, "] data is empty");
  return ByteDataset(std::move(owner), text, name, int64_t(double(text.size()) * (1.0 - val_fraction)));
}
}  // namespace

ByteDataset ByteDataset::fortunes(double val_fraction) {
  const std::filesystem::path dir = "/usr/share/games/fortunes";
  std::error_code ec;
  SINTER_CHECK_T(IOError, std::filesystem::is_directory(dir, ec), "[", dir.string(),
                 "] not found: the default corpus is Debian's fortunes package (scripts/setup.sh installs it); or train on a file of your own");
  std::vector<std::filesystem::path> files;
  for (auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.is_symlink() || !e.is_regular_file() || e.path().extension() == ".dat") continue;
    files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  std::string text;
  for (auto& p : files) {
    std::ifstream f(p, std::ios::binary);
    std::ostringstream ss;
    ss << f.rdbuf();
    text += ss.str();
  }
  return from_text(std::move(text), dir.string(), val_fraction);
}

std::string ByteDataset::fingerprint() const {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the first 64 KiB
  const size_t n = std::min<size_t>(text_.size(), size_t(1) << 16);
  for (size_t i = 0; i < n; ++i) h = (h ^ uint8_t(text_[i])) * 1099511628211ull;
  return std::to_string(text_.size()) + ":" + hex(h, 16);
}

void ByteDataset::check_window(int64_t T) const {
  SINTER_CHECK_T(IOError, train_bytes() > T + 1 && val_bytes() > T + 1, "[", name_, "] ", text_.size(),
                 " bytes are too few for windows of ", T, " tokens in both the train and validation splits");
}

std::pair<Tensor, Tensor> ByteDataset::batch(bool train, int64_t B, int64_t T, uint64_t seed, uint64_t index) const {
  check_window(T);
  const int64_t lo = train ? 0 : split_, n = train ? split_ : int64_t(text_.size()) - split_;
  Tensor x = Tensor::empty({B, T}, DType::i64), y = Tensor::empty({B, T}, DType::i64);
  int64_t *px = x.data<int64_t>(), *py = y.data<int64_t>();
  // One Philox block per batch row; the validation stream is a different key.
  const uint64_t key = seed * 2 + (train ? 0 : 1);
  sigjmp_buf jump;
  struct Armed {
    explicit Armed(sigjmp_buf* j) { g_bus_jump = j; }
    ~Armed() { g_bus_jump = nullptr; }
  } armed(&jump);
  if (sigsetjmp(jump, 1))
    SINTER_THROW(IOError, "[", name_, "] the data file shrank while it was being read (truncated or rewritten during training); ",
                 "it held ", text_.size(), " bytes when it was opened");
  for (int64_t b = 0; b < B; ++b) {
    uint32_t r[4];
    philox(key, index * uint64_t(B) + uint64_t(b), r);
    const uint64_t u = (uint64_t(r[0]) << 32) | r[1];
    const int64_t start = lo + int64_t(u % uint64_t(n - T - 1));
    for (int64_t t = 0; t < T; ++t) {
      px[b * T + t] = static_cast<unsigned char>(text_[size_t(start + t)]);
      py[b * T + t] = static_cast<unsigned char>(text_[size_t(start + t + 1)]);
    }
  }
  return {x, y};
}

}  // namespace sinter::data

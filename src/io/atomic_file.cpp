#include "io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <signal.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "sinter/error.h"
#include "sinter/io.h"

namespace sinter::io {

namespace {
std::atomic<int64_t> g_fail_at{0}, g_ops{0};

// The crash tests' full disk (fail_file_operation_for_testing): ENOSPC at the chosen operation.
bool injected_failure() {
  const int64_t at = g_fail_at.load();
  if (at <= 0 || ++g_ops != at) return false;
  errno = ENOSPC;
  return true;
}
}  // namespace

void fail_file_operation_for_testing(int64_t n) {
  g_ops = 0;
  g_fail_at = n;
}

AtomicWriter::AtomicWriter(std::string path) : path_(std::move(path)) {
  tmp_ = path_ + ".tmp." + std::to_string(::getpid()) + ".XXXXXX";
  fd_ = ::mkstemp(tmp_.data());
  SINTER_CHECK_T(IOError, fd_ >= 0, "[", path_, "] cannot create a temporary file beside it: ", std::strerror(errno));
}

AtomicWriter::~AtomicWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!done_) ::unlink(tmp_.c_str());
}

void AtomicWriter::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = injected_failure() ? -1 : ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    SINTER_CHECK_T(IOError, w > 0, "[", path_, "] write failed: ", std::strerror(errno));
    p += w;
    n -= size_t(w);
  }
}

void AtomicWriter::commit() {
  SINTER_CHECK_T(IOError, ::fchmod(fd_, 0644) == 0, "[", path_, "] chmod failed: ", std::strerror(errno));
  SINTER_CHECK_T(IOError, ::fsync(fd_) == 0, "[", path_, "] fsync failed: ", std::strerror(errno));
  ::close(fd_);
  fd_ = -1;
  SINTER_CHECK_T(IOError, !injected_failure() && ::rename(tmp_.c_str(), path_.c_str()) == 0, "[", path_, "] rename failed: ",
                 std::strerror(errno));
  done_ = true;
  const std::filesystem::path parent = std::filesystem::path(path_).parent_path();
  const std::string dir = parent.empty() ? std::string(".") : parent.string();
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void atomic_write(const std::string& path, const std::string& bytes) {
  AtomicWriter w(path);
  w.write(bytes);
  w.commit();
}

int remove_stale_temporaries(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  int removed = 0;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const size_t at = name.rfind(".tmp.");
    if (at == std::string::npos || !entry.is_regular_file(ec)) continue;
    // <target>.tmp.<pid>.XXXXXX; a name without a pid comes from an older writer: stale too.
    const std::string rest = name.substr(at + 5);
    const size_t dot = rest.find('.');
    bool live = false;
    if (dot != std::string::npos && dot > 0 && rest.find_first_not_of("0123456789") == dot) {
      const long pid = std::stol(rest.substr(0, dot));
      live = pid == long(::getpid()) || ::kill(pid_t(pid), 0) == 0 || errno == EPERM;
    }
    if (!live && fs::remove(entry.path(), ec)) ++removed;
  }
  return removed;
}

}  // namespace sinter::io

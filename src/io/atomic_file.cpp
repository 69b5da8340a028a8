#include "io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "sinter/error.h"
#include "sinter/io.h"

namespace sinter::io {

AtomicWriter::AtomicWriter(std::string path) : path_(std::move(path)) {
  tmp_ = path_ + ".tmp.XXXXXX";
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
    const ssize_t w = ::write(fd_, p, n);
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
  SINTER_CHECK_T(IOError, ::rename(tmp_.c_str(), path_.c_str()) == 0, "[", path_, "] rename failed: ", std::strerror(errno));
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

}  // namespace sinter::io

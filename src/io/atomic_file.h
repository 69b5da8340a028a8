#pragma once
// Atomic file replacement: write to a temporary file in the target's folder, fsync it, rename it
// over the target, fsync the folder. A crash at any point leaves either the old or the new file
// (and a temporary `<target>.tmp.<pid>.XXXXXX`, which remove_stale_temporaries clears).
#include <string>
#include <string_view>

namespace sinter::io {

class AtomicWriter {
 public:
  explicit AtomicWriter(std::string path);
  ~AtomicWriter();  // removes the temporary file unless commit() succeeded
  AtomicWriter(const AtomicWriter&) = delete;
  AtomicWriter& operator=(const AtomicWriter&) = delete;
  void write(const void* data, size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  void commit();

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  bool done_ = false;
};

// Removes the temporary files in `dir` that writers which no longer run left behind (a process
// killed while saving); returns how many. Files of live writers stay.
int remove_stale_temporaries(const std::string& dir);

}  // namespace sinter::io

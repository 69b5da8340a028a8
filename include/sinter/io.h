#pragma once
// safetensors files: an 8-byte little-endian header length, a JSON header naming each tensor's
// dtype, shape and byte range, then raw little-endian data. Reads go through mmap; writes are
// atomic (temporary file in the same folder, fsync, rename).
#include <map>
#include <string>

#include "sinter/tensor.h"

namespace sinter::io {

// Tensors map views of one shared read-only mapping; they stay valid after the file is replaced.
struct SafeTensors {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

SafeTensors load_safetensors(const std::string& path);
// Parses a whole file image in memory (what load_safetensors does after mmap; also the fuzz entry).
SafeTensors parse_safetensors(const void* data, size_t size, const std::string& name);
// `align` > 8 starts every tensor's data at a multiple of it (the data offsets have no holes, so
// filler tensors named __pad<N> take up the gaps): what the runtime's mapped weights use (64).
void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {}, int64_t align = 8);

// Writes `bytes` to `path` atomically.
void atomic_write(const std::string& path, const std::string& bytes);

// Testing: the nth file operation of the atomic writes this process makes from now on (each
// write() and each final rename count) fails as a full disk would (ENOSPC); 0: none.
void fail_file_operation_for_testing(int64_t n);

}  // namespace sinter::io

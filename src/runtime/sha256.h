#pragma once
// SHA-256 (FIPS 180-4): the digests an exported model's manifest lists for its files.
#include <cstddef>
#include <string>

namespace sinter::runtime {

std::string sha256_hex(const void* data, size_t size);
// The digest of a file's bytes (mapped, not read into memory); throws IOError naming it.
std::string sha256_file(const std::string& path);

}  // namespace sinter::runtime

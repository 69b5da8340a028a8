#pragma once
// What the emulator's runtime (runtime.cpp) and grid (threads.cpp) share: the last error.
#include <string>

#include "cuda_runtime.h"

namespace sinter::cuda::emulator {

void set_error(cudaError_t e, std::string detail);  // cudaGetLastError returns the first (once)

}  // namespace sinter::cuda::emulator

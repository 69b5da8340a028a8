#pragma once
// What the CUDA tests share: NEEDS_GPU() skips a test that needs a usable GPU, with the reason
// (CTest lists it as skipped), or fails it under SINTER_REQUIRE_GPU=1, so a device run cannot
// pass by skipping.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "sinter/cuda.h"
#include "sinter/sinter.h"
#include "test_util.h"

namespace sinter::test {

inline bool gpu_required() {
  const char* v = std::getenv("SINTER_REQUIRE_GPU");
  return v && std::string(v) == "1";
}

#define NEEDS_GPU()                                                                               \
  do {                                                                                            \
    if (!::sinter::cuda::available()) {                                                           \
      if (::sinter::test::gpu_required())                                                         \
        FAIL() << "SINTER_REQUIRE_GPU=1, but no CUDA device: " << ::sinter::cuda::unavailable_reason(); \
      GTEST_SKIP() << "no CUDA device: " << ::sinter::cuda::unavailable_reason();                 \
    }                                                                                             \
  } while (0)

}  // namespace sinter::test

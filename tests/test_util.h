#pragma once
#include <gtest/gtest.h>
#include <sinter/sinter.h>

#include <cstdlib>
#include <string>

#if defined(__SANITIZE_ADDRESS__)
#define SINTER_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SINTER_TEST_ASAN 1
#endif
#endif

namespace sinter::test {

// Whether these tests run under AddressSanitizer (SINTER_SANITIZE=ON).
#if SINTER_TEST_ASAN
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif

// Sets an environment variable for a scope, restoring its value (or its absence) after.
struct ScopedEnv {
  ScopedEnv(const char* name, const std::string& value) : name(name) {
    if (const char* v = std::getenv(name)) old = v, had = true;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (had) setenv(name, old.c_str(), 1);
    else unsetenv(name);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  const char* name;
  std::string old;
  bool had = false;
};

// Relative + absolute tolerance per dtype (f32 1e-5, f64 1e-10, bf16 2e-2, f16 2e-3).
double default_rtol(DType t);

// Compares elementwise; on failure reports the worst index, both values and the shapes.
::testing::AssertionResult all_close(const Tensor& out, const Tensor& ref, double rtol = -1, double atol = -1);
::testing::AssertionResult all_close(const Tensor& out, const std::vector<double>& ref, double rtol, double atol);

#define EXPECT_CLOSE(out, ref, ...) EXPECT_TRUE(::sinter::test::all_close(out, ref, ##__VA_ARGS__))

// Same shape, dtype and bytes.
bool bitwise_equal(const Tensor& a, const Tensor& b);

// A copy of t with the same values laid out non-contiguously (every other element of a wider buffer).
Tensor noncontiguous(const Tensor& t);

// Expects `f` to throw sinter::Error whose message starts with "[op]" (and contains `also`).
template <class F> ::testing::AssertionResult throws_naming(const std::string& op, F&& f, const std::string& also = "") {
  try {
    f();
  } catch (const sinter::Error& e) {
    const std::string msg = e.what();
    if (msg.rfind("[" + op + "]", 0) != 0) return ::testing::AssertionFailure() << "error does not start with [" << op << "]: " << msg;
    if (msg.find(also) == std::string::npos) return ::testing::AssertionFailure() << "error does not say " << also << ": " << msg;
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-sinter exception: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw";
}

}  // namespace sinter::test

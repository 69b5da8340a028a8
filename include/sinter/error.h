#pragma once
// Errors carry a message that starts with the op or file in brackets and shows the values involved:
//   sinter::ShapeError: [matmul] inner dimensions differ: a(2, 3, 4) b(5, 6)
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>

namespace sinter {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};
class ShapeError : public Error { public: using Error::Error; };
class DTypeError : public Error { public: using Error::Error; };
class IndexError : public Error { public: using Error::Error; };
class ValueError : public Error { public: using Error::Error; };
class IOError : public Error { public: using Error::Error; };
class AutogradError : public Error { public: using Error::Error; };
class CompileError : public Error { public: using Error::Error; };
class DistError : public Error { public: using Error::Error; };
// A device the work asks for is missing: no CUDA backend, driver or device; out of device memory.
class DeviceError : public Error { public: using Error::Error; };

// Warnings (a compiled function running eagerly from now on, ...) go to the handler set here: the
// library never prints. The sinter command line writes them to stderr; without a handler they are
// dropped (explain() still reports the state they describe). Handlers run on the warning thread.
using WarningHandler = std::function<void(const std::string& message)>;
WarningHandler set_warning_handler(WarningHandler handler);  // returns the previous one
void warn(const std::string& message);

namespace detail {
template <class... Args>
std::string cat_message(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace sinter

#define SINTER_THROW(ErrType, ...) throw ::sinter::ErrType(::sinter::detail::cat_message(__VA_ARGS__))
#define SINTER_CHECK_T(ErrType, cond, ...) \
  do { if (!(cond)) SINTER_THROW(ErrType, __VA_ARGS__); } while (0)
#define SINTER_CHECK(cond, ...) SINTER_CHECK_T(ValueError, cond, __VA_ARGS__)
#define SINTER_CHECK_SHAPE(cond, ...) SINTER_CHECK_T(ShapeError, cond, __VA_ARGS__)
#define SINTER_CHECK_DTYPE(cond, ...) SINTER_CHECK_T(DTypeError, cond, __VA_ARGS__)
#define SINTER_CHECK_INDEX(cond, ...) SINTER_CHECK_T(IndexError, cond, __VA_ARGS__)
// Internal invariants: a failure here is a Sinter bug, still reported as an exception, never abort.
#define SINTER_ASSERT(cond, ...) \
  SINTER_CHECK_T(Error, cond, "[internal] ", #cond, " failed at ", __FILE__, ":", __LINE__, " ", ##__VA_ARGS__)

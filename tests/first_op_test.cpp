// A program whose first op is elementwise: its table is filled when the op registry is first
// used, and it was once read before that (a null dereference). Its own process, so nothing else
// has touched the registry first.
#include <sinter/sinter.h>

#include <cstdio>

int main() {
  using namespace sinter;
  const std::vector<float> y = (ones({3}) * 2.0).to_vector<float>();
  const std::vector<float> z = neg(ones({2})).to_vector<float>();
  const bool ok = y == std::vector<float>{2, 2, 2} && z == std::vector<float>{-1, -1};
  std::printf("%s\n", ok ? "ok" : "wrong values");
  return ok ? 0 : 1;
}

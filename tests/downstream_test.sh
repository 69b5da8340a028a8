#!/usr/bin/env bash
# Installs the built Sinter into a temporary prefix, then uses it as another project would:
# examples/downstream through find_package(sinter 0.1), and a one-file program through pkg-config.
#   tests/downstream_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

cmake --install "$build" --prefix "$prefix" >/dev/null
libdir=$(dirname "$(find "$prefix" -name 'libsinter.so.*.*.*' | head -1)")

# The CLI and the library carry the version.
"$prefix/bin/sinter" --version | tee "$work/version.txt"
grep -qx "sinter 0.1.0" "$work/version.txt"
objdump -p "$libdir"/libsinter.so | grep "SONAME *libsinter.so.0.1" > /dev/null  # not -q: an early exit would SIGPIPE objdump under pipefail
test -f "$libdir/cmake/sinter/sinterConfig.cmake" && test -f "$libdir/cmake/sinter/sinterConfigVersion.cmake"

# find_package(sinter 0.1 REQUIRED) and sinter::sinter.
cmake -S "$src/examples/downstream" -B "$work/downstream" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/downstream" >/dev/null
"$work/downstream/downstream" | tee "$work/downstream.txt"
grep -q "^downstream: sinter 0.1.0, .* parameters, loss .* after 40 steps$" "$work/downstream.txt"

# A version the package does not satisfy is refused.
mkdir -p "$work/too_new"
cat > "$work/too_new/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(too_new LANGUAGES CXX)
find_package(sinter 0.2 REQUIRED)
CMAKE
if cmake -S "$work/too_new" -B "$work/too_new/build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null 2>&1; then
  echo "find_package(sinter 0.2) accepted version 0.1.0" >&2
  exit 1
fi

# pkg-config --cflags --libs sinter.
export PKG_CONFIG_PATH="$libdir/pkgconfig"
test "$(pkg-config --modversion sinter)" = 0.1.0
cat > "$work/pc.cpp" <<'CPP'
#include <sinter/sinter.h>
#include <cstdio>
int main() {
  sinter::Tensor x = sinter::arange(0, 4, 1, sinter::DType::f32);
  std::printf("pkg-config: sum %g\n", sinter::sum(x * x).item<float>());
  return 0;
}
CPP
# shellcheck disable=SC2046
g++ -O1 "$work/pc.cpp" -o "$work/pc" $(pkg-config --cflags --libs sinter)
"$work/pc" | tee "$work/pc.txt"
grep -qx "pkg-config: sum 14" "$work/pc.txt"
echo "downstream: install, find_package, pkg-config and --version all work"

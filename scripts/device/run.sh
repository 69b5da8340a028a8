#!/usr/bin/env bash
# The prepared device run for a lent H200 (docs/cuda.md, ../shared/GPU.md): probes the machine,
# builds Sinter with the CUDA backend from the working tree on its cores, runs the CUDA tests with
# SINTER_REQUIRE_GPU=1 (a skipped GPU test fails) and writes everything under $OUT.
#   scripts/device/run.sh            (on the device: the `run` tool sets $OUT)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/sinter_device}
mkdir -p "$OUT"
step() { echo "== $1 ($(date +%T))" | tee -a "$OUT/summary.txt"; }

step probe
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  nvcc --version | tail -1
  cmake --version | head -1
  python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'
  for lib in dnnl gomp mpi_cxx gtest; do ls /usr/lib/x86_64-linux-gnu/lib$lib.so* 2>/dev/null | head -1 || echo "no lib$lib"; done
  ls /usr/include/nlohmann/json.hpp /usr/include/oneapi/dnnl/dnnl.hpp 2>&1
} > "$OUT/probe.txt" 2>&1
cat "$OUT/probe.txt"

if [ -f build-device/sinter-device.tar.xz ]; then  # carried: made by scripts/device/pack.sh
  step "unpack the carried build"
  mkdir -p /tmp/sinter-device && tar -C /tmp/sinter-device -xJf build-device/sinter-device.tar.xz
  step "CUDA tests (SINTER_REQUIRE_GPU=1), carried build"
  SINTER_REQUIRE_GPU=1 SINTER_CUDA_POISON=1 LD_LIBRARY_PATH=/tmp/sinter-device/lib SINTER_CUDA_LIBRARY=/tmp/sinter-device/lib/libsinter_cuda.so \
    timeout 300 /tmp/sinter-device/sinter_tests --gtest_filter='Cuda*:AllOps/CudaOps*' --gtest_output="json:$OUT/cuda_tests.json" 2>&1 |
    tee "$OUT/cuda_tests.txt" | tail -40
  step done
  exit 0
fi

step configure
if ! cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DSINTER_CUDA=ON -DSINTER_NATIVE=OFF \
     > "$OUT/configure.txt" 2>&1; then
  tail -30 "$OUT/configure.txt"
  step "configure failed (see configure.txt): carry a build made elsewhere instead"
  exit 1
fi

step build
if ! cmake --build build-device -j "$(nproc)" --target sinter_tests > "$OUT/build.txt" 2>&1; then
  grep -E "error|Error" "$OUT/build.txt" | head -30
  exit 1
fi

step "CUDA tests (SINTER_REQUIRE_GPU=1)"
SINTER_REQUIRE_GPU=1 SINTER_CUDA_POISON=1 timeout 300 build-device/tests/sinter_tests --gtest_filter='Cuda*:AllOps/CudaOps*' \
  --gtest_output="json:$OUT/cuda_tests.json" 2>&1 | tee "$OUT/cuda_tests.txt" | tail -40
step done

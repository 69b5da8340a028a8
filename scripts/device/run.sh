#!/usr/bin/env bash
# The prepared device run for a lent H200 (docs/cuda.md, ../shared/GPU.md): probes the machine,
# builds Sinter with the CUDA backend on its cores (or unpacks a carried build), runs the CUDA tests
# with SINTER_REQUIRE_GPU=1 (a skipped GPU test fails), the op sweep under compute-sanitizer
# memcheck, and `sinter bench cuda` with the device's PyTorch; everything goes under $OUT.
#   scripts/device/run.sh [tests|bench|sanitizer]...   (default: all three, in that order, within
#   about 10 minutes; the `run` tool sets $OUT)
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

# Sinter loads cuDNN and cuSPARSELt at run time: the device's PyTorch wheels carry them (and the
# CUDA runtime that cudnn-frontend may open beside them).
nv_dirs=$(python3 - <<'EOF' 2>/dev/null
import glob, os, nvidia
found = {os.path.dirname(p) for r in nvidia.__path__ for pat in ("libcudnn.so.9", "libcusparseLt.so.0", "libcudart.so.13")
         for p in glob.glob(os.path.join(r, "**", pat), recursive=True)}
print(":".join(sorted(found)))
EOF
)
if [ -n "$nv_dirs" ]; then
  export SINTER_NV_DIRS=$nv_dirs
  echo "cuDNN, cuSPARSELt and the CUDA runtime from PyTorch's wheels: $nv_dirs" | tee -a "$OUT/probe.txt"
fi
# The toolkit's libraries (cuBLASLt) first, then the wheels' (which carry cuBLASLt too).
with_nv() {
  local d
  for d in /usr/local/cuda/lib64 ${SINTER_NV_DIRS//:/ }; do
    [ -d "$d" ] && export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d
  done
  return 0
}

parts=${*:-tests bench sanitizer}
want() { [[ " $parts " == *" $1 "* ]]; }

# What runs once the programs are there: $1 sinter_tests, $2 the sinter command line.
run_parts() {
  local tests=$1 cli=$2
  export SINTER_CLI_PATH=$cli
  with_nv
  if want tests; then
    step "CUDA tests (SINTER_REQUIRE_GPU=1)"
    SINTER_REQUIRE_GPU=1 SINTER_CUDA_POISON=1 timeout 240 "$tests" --gtest_filter='Cuda*:AllOps/CudaOps*' \
      --gtest_output="json:$OUT/cuda_tests.json" 2>&1 | tee "$OUT/cuda_tests.txt" | grep -E "FAILED|Failure|error|PASSED|SKIPPED|CUDA kernels" | tail -60
  fi
  if want bench; then
    step "sinter bench cuda (PyTorch: $(python3 -c 'import torch; print(torch.__version__)' 2>&1 | tail -1))"
    timeout 330 "$cli" bench cuda --python python3 --torch-script bench/torch_peer.py --json "$OUT/bench_cuda.json" \
      --update "$OUT/BENCHMARKS.cuda.md" --svg "$OUT/bench_cuda.svg" 2>&1 | tee "$OUT/bench_cuda.txt" | tail -40
  fi
  if want sanitizer; then
    local cs
    cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
    if [ -n "$cs" ]; then
      step "compute-sanitizer memcheck on the op sweep"
      SINTER_REQUIRE_GPU=1 timeout 150 "$cs" --tool memcheck --error-exitcode 3 --print-limit 20 "$tests" --gtest_filter='AllOps/CudaOps*' \
        > "$OUT/memcheck.txt" 2>&1
      echo "memcheck exit $?" | tee -a "$OUT/summary.txt"
      grep -E "ERROR SUMMARY|Invalid|========= [A-Z]" "$OUT/memcheck.txt" | head -20
    else
      step "no compute-sanitizer on this machine"
    fi
  fi
  step done
}

if [ -f build-device/sinter-device.tar.xz ]; then  # carried: made by scripts/device/pack.sh
  step "unpack the carried build"
  mkdir -p /tmp/sinter-device && tar -C /tmp/sinter-device -xJf build-device/sinter-device.tar.xz
  export LD_LIBRARY_PATH=/tmp/sinter-device/lib SINTER_CUDA_LIBRARY=/tmp/sinter-device/lib/libsinter_cuda.so
  run_parts /tmp/sinter-device/sinter_tests /tmp/sinter-device/sinter
  exit 0
fi

step configure
if ! cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DSINTER_CUDA=ON -DSINTER_CUDA_EMULATOR=OFF -DSINTER_NATIVE=OFF \
     > "$OUT/configure.txt" 2>&1; then
  tail -30 "$OUT/configure.txt"
  step "configure failed (see configure.txt): carry a build made elsewhere instead"
  exit 1
fi

step build
if ! cmake --build build-device -j "$(nproc)" --target sinter_tests sinter_cli > "$OUT/build.txt" 2>&1; then
  grep -E "error|Error" "$OUT/build.txt" | head -30
  exit 1
fi
run_parts build-device/tests/sinter_tests build-device/sinter

#!/usr/bin/env bash
# Installs every Debian package Sinter needs to build, test, fuzz and benchmark. Idempotent:
# packages already present are skipped, and `apt-get update` runs once, only when something is missing.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libdnnl-dev            # dense GEMM (oneDNN 2.6), chosen by measurement: see BENCHMARKS.md
  libgtest-dev           # tests
  nlohmann-json3-dev     # JSON for safetensors headers and configs
  libcli11-dev           # the sinter command line
  clang libclang-rt-14-dev libfuzzer-14-dev   # libFuzzer targets for the parsers (scripts/fuzz.sh, CI)
  libomp-dev
  libopenmpi-dev openmpi-bin   # the distributed backend (process groups) and mpirun for multi-rank tests
  fortunes               # the default training corpus
  python3                # the runtime's ctypes example (examples/aot/generate.py), run by the tests
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $sudo_cmd apt-get update -qq
  $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "setup: all packages present"
# Where the CUDA toolkit is, the headers it lacks (cudnn-frontend) from NVIDIA's wheels.
"$(dirname "$0")/fetch_cuda_headers.sh"

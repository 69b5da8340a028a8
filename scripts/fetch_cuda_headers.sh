#!/usr/bin/env bash
# Fetches the headers the CUDA backend builds against that the toolkit lacks, from NVIDIA's wheels
# on PyPI, into third_party/ (ignored by git): cudnn-frontend (cuDNN's graph API for C++, header
# only) and cuSPARSELt's header. The libraries themselves are loaded at run time (docs/cuda.md).
# Idempotent; nothing to do without nvcc; a wheel it cannot fetch leaves the backend without that part.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest=$root/third_party

nvcc=$(command -v nvcc || true)
[ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
if [ -z "$nvcc" ]; then
  echo "fetch_cuda_headers: no nvcc, nothing to fetch"
  exit 0
fi

# fetch NAME WHEEL VERSION PLATFORM PREFIX: the wheel's files under PREFIX, into third_party/NAME.
# Any build of a wheel carries the same headers: it is asked for by platform, not by this Python.
fetch() {
  local name=$1 wheel=$2 version=$3 platform=$4 prefix=$5 out=$dest/$1
  if [ -f "$out/VERSION" ] && [ "$(cat "$out/VERSION")" = "$version" ]; then
    echo "fetch_cuda_headers: $name $version present"
    return
  fi
  if ! python3 -m pip --version >/dev/null 2>&1; then
    sudo_cmd=""
    [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
    $sudo_cmd apt-get install -y -qq --no-install-recommends python3-pip >/dev/null
  fi
  local tmp
  tmp=$(mktemp -d)
  if ! python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 --platform "$platform" -d "$tmp" \
       "$wheel==$version"; then
    echo "fetch_cuda_headers: could not fetch $wheel $version; the CUDA backend builds without $name (docs/cuda.md)"
    rm -rf "$tmp"
    return
  fi
  rm -rf "$out" && mkdir -p "$out/include"
  python3 - "$tmp"/*.whl "$prefix" "$out/include" <<'EOF'
import os, sys, zipfile
wheel, prefix, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z:
    members = [m for m in z.namelist() if m.startswith(prefix) and not m.endswith("/")]
    if not members:
        sys.exit(f"fetch_cuda_headers: {wheel} has nothing under {prefix}")
    for m in members:
        target = os.path.join(out, m[len(prefix):])
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with z.open(m) as src, open(target, "wb") as dst:
            dst.write(src.read())
EOF
  rm -rf "$tmp"
  echo "$version" > "$out/VERSION"
  echo "fetch_cuda_headers: $name $version in $out/include"
}

fetch cudnn-frontend nvidia-cudnn-frontend 1.32.0 manylinux_2_28_x86_64 include/
# 0.8.1: the cuSPARSELt the lent H200's PyTorch carries (its handles' layout must match the library's).
fetch cusparselt nvidia-cusparselt-cu13 0.8.1 manylinux2014_x86_64 nvidia/cusparselt/include/

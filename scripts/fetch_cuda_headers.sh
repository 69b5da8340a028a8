#!/usr/bin/env bash
# Fetches the headers the CUDA backend builds against that the toolkit lacks, from NVIDIA's wheels
# on PyPI, into third_party/ (ignored by git): cudnn-frontend (cuDNN's graph API for C++, header
# only). The libraries themselves are loaded at run time. Idempotent; nothing to do without nvcc.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest=$root/third_party
frontend_version=1.32.0

nvcc=$(command -v nvcc || true)
[ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
if [ -z "$nvcc" ]; then
  echo "fetch_cuda_headers: no nvcc, nothing to fetch"
  exit 0
fi
stamp=$dest/cudnn-frontend/VERSION
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$frontend_version" ]; then
  echo "fetch_cuda_headers: cudnn-frontend $frontend_version present"
  exit 0
fi

if ! python3 -m pip --version >/dev/null 2>&1; then
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get install -y -qq --no-install-recommends python3-pip >/dev/null
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Any of the wheel's builds carries the same headers: ask for one by platform, not by this Python.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 --platform manylinux_2_28_x86_64 \
  -d "$tmp" "nvidia-cudnn-frontend==$frontend_version"
rm -rf "$dest/cudnn-frontend"
mkdir -p "$dest/cudnn-frontend"
python3 - "$tmp"/*.whl "$dest/cudnn-frontend" <<'EOF'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    members = [m for m in z.namelist() if m.startswith("include/")]
    if not members:
        sys.exit(f"fetch_cuda_headers: {wheel} has no include/ folder")
    z.extractall(out, members)
EOF
echo "$frontend_version" > "$stamp"
echo "fetch_cuda_headers: cudnn-frontend $frontend_version in $dest/cudnn-frontend/include"

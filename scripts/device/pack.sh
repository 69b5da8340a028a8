#!/usr/bin/env bash
# Builds what a device run can carry instead of building there (../shared/GPU.md): a portable build
# (x86-64-v3, no OpenMPI, the CUDA backend for sm_90a) of the tests and the command line, with the
# libraries they need beyond glibc and libstdc++, stripped and packed as
# build-device/sinter-device.tar.xz. Carry it with `run`'s carry=["build-device/sinter-device.tar.xz"];
# scripts/device/run.sh unpacks and uses it when it is there.
set -euo pipefail
cd "$(dirname "$0")/../.."
cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DSINTER_NATIVE=OFF -DCMAKE_CXX_FLAGS=-march=x86-64-v3 \
  -DSINTER_MPI=OFF -DSINTER_CUDA=ON -DSINTER_CUDA_EMULATOR=OFF >/dev/null
cmake --build build-device -j "$(nproc)" --target sinter_tests sinter_cli sinter_cuda
stage=build-device/stage
rm -rf "$stage" && mkdir -p "$stage/lib"
cp build-device/tests/sinter_tests build-device/sinter "$stage/"
cp -P build-device/libsinter.so* build-device/libsinter_cuda.so "$stage/lib/"
# Every library the programs load that is not the C or C++ runtime (those the device has).
for lib in $(ldd "$stage/sinter_tests" build-device/libsinter_cuda.so | awk '/=> \//{print $3}' | sort -u); do
  case "$(basename "$lib")" in libc.so*|libm.so*|libstdc++*|libgcc_s*|ld-linux*|libpthread*|libdl*|librt*|libsinter*) ;;
    libcublas*|libcudart*|libcuda.so*|libnvrtc*|libcusparse*) ;;  # the device has the CUDA toolkit
    *) cp -L "$lib" "$stage/lib/" ;;
  esac
done
strip --strip-unneeded "$stage"/sinter_tests "$stage"/sinter "$stage"/lib/*.so* 2>/dev/null || true
tar -C "$stage" -cJf build-device/sinter-device.tar.xz .
ls -la build-device/sinter-device.tar.xz

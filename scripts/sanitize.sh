#!/usr/bin/env bash
# The sanitizer subset CI runs, in scripts/sanitize_build.sh's build (clang, ASan + UBSan): the
# tests of the op table (every op against its reference, compiled against eager), the tokenizer,
# safetensors, the compiler, user kernels, AOT export and the runtime (the C side), the training
# faults, and the CUDA kernels on the emulator (a kernel touching bytes past its tensor is
# reported). It is built without OpenMPI and without nvcc's CUDA backend, so CI builds both ways
# (scripts/test.sh builds with both). `SINTER_SANITIZE=1 scripts/test.sh` runs every test the same
# way (GCC, -O2).
#   scripts/sanitize.sh [CTEST_REGEX]
set -euo pipefail
cd "$(dirname "$0")/.."
subset=${1:-'^(AllOps/OpTable|OpTable|OpTableCoverage|AllOps/CompiledOp|Tokenizer|SafeTensors|Compile\.|CompilePasses|UserKernel|Aot\.|AotBadFiles|OnNan|TrainState|install_downstream|dist_without_mpi|CudaAllocator|CudaBackend|CudaEmulator|emulated_Cuda(Backend|Allocator|Ops|Attention|Sparse24|Graph)$)'}
# A compiled training step run over 200 steps, and over every length 17..128 (112 steps): the main
# suite and the full sanitizer suite run them; the subset keeps the compiled-step tests of a few steps.
slow='Compile\.(TrainingWithACompiledStepTracksEagerTraining|ATrainingStepServesEverySequenceLengthWithOneCompile)$'
scripts/sanitize_build.sh sinter_tests sinter_cli sinter_dist_fault sinter_cuda_emulated sinter_cuda_emulator_test
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# libomp's idle threads sleep at once instead of spinning 200 ms after each parallel region: with
# two tests at a time on two cores, the spinning took the CPU the other test needed (the subset:
# 566 s with the default, 351 s with 0, on a 2-core Zen 3).
export KMP_BLOCKTIME=0
ctest --test-dir build-sanitize --output-on-failure -j "$(nproc)" -R "$subset" -E "$slow"

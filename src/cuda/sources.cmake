# The CUDA backend's sources, shared by libsinter_cuda (nvcc, CMakeLists.txt) and the emulated
# backend built for the CPU (emulator/CMakeLists.txt): one list, so neither can miss a kernel.
set(SINTER_CUDA_SOURCES
  attention.cpp
  backend.cpp
  caching_allocator.cpp
  copy.cu
  elementwise.cu
  factory.cu
  flash.cu
  flash_decode.cu
  flash_tc.cu
  flash_tc_backward.cu
  gemm.cpp
  graph.cpp
  index.cu
  linalg.cpp
  nn.cu
  positions.cu
  shape.cpp
  reduce.cu
  softmax.cu
  topk.cu
  sparse24.cu
  sparse24_linear.cpp
  update.cu
)

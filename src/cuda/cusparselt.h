#pragma once
// 2:4 sparse GEMMs on Hopper's sparse tensor cores through cuSPARSELt (cusparselt.cpp), loaded at
// run time: the header from NVIDIA's wheel at build time (scripts/fetch_cuda_headers.sh), the
// library from $SINTER_CUSPARSELT_LIBRARY or the loader's path when first used. A weight is
// compressed once; each M gets its plan and algorithm search once, kept with the weight.
#include <cstdint>
#include <memory>
#include <string>

#include "sinter/tensor.h"

namespace sinter::cuda {

struct SparseGemm;  // a compressed (N, K) bf16 weight and its plans

constexpr uint32_t kCusparseltAlignment = 16;  // bytes: the address of every operand (its descriptors say so)
constexpr int64_t kDenseRows = 8;              // x's rows (M) go to cuSPARSELt in multiples of this (bf16)

// Why cuSPARSELt cannot run here ("" when it can): not built, library missing or of another version.
std::string cusparselt_why_not();
// w (N, K) bf16 on the device, 2:4 along K (two nonzeros in each four), compressed on the device.
std::shared_ptr<SparseGemm> cusparselt_compress(const Tensor& w);
// y (M, N) = x (M, K) w^T, all bf16 contiguous on w's device; any M (padded to a multiple of
// kDenseRows) and any offset (copied where not aligned).
void cusparselt_matmul(SparseGemm& w, const Tensor& x, const Tensor& y);

}  // namespace sinter::cuda

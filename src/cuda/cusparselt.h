#pragma once
// 2:4 sparse GEMMs on Hopper's sparse tensor cores through cuSPARSELt (cusparselt.cpp), loaded at
// run time: the header from NVIDIA's wheel at build time (scripts/fetch_cuda_headers.sh), the
// library from $SINTER_CUSPARSELT_LIBRARY or the loader's path when first used. A weight is
// compressed once; each M (and epilogue) gets its plan, kept with the weight (the most recently
// used kCusparseltPlansPerWeight of them), and the first M of each bucket (cusparselt_bucket) runs
// cuSPARSELt's algorithm search, whose choice the bucket's other Ms, and a remade plan, reuse.
#include <cstdint>
#include <memory>
#include <string>

#include "sinter/tensor.h"

namespace sinter::cuda {

struct SparseGemm;  // a compressed (N, K) bf16 weight and its plans

constexpr uint32_t kCusparseltAlignment = 16;  // bytes: the address of every operand (its descriptors say so)
constexpr int64_t kDenseRows = 8;              // x's rows (M) go to cuSPARSELt in multiples of this (bf16)
constexpr size_t kCusparseltPlansPerWeight = 32;  // plans a weight keeps: a server's many prompt lengths stay bounded

// The bucket of M: M rounded up to a power of two, at least kDenseRows.
int64_t cusparselt_bucket(int64_t M);
// Why cuSPARSELt cannot run here ("" when it can): not built, library missing or of another version.
std::string cusparselt_why_not();
// w (N, K) bf16 on the device, 2:4 along K (two nonzeros in each four), compressed on the device.
std::shared_ptr<SparseGemm> cusparselt_compress(const Tensor& w);
// y (M, N) = x (M, K) w^T (+ bias (N), then ReLU where relu, both in cuSPARSELt's epilogue before
// rounding), all bf16 on w's device, x and y contiguous; any M (padded to a multiple of
// kDenseRows) and any offset (copied where not aligned).
void cusparselt_matmul(SparseGemm& w, const Tensor& x, const Tensor& y, const Tensor& bias = {}, bool relu = false);

}  // namespace sinter::cuda

#pragma once
// The CUDA FlashAttention-2 kernels (flash.cu): the sdpa geometry of every backend
// (attention/attention.h), tiles of queries against tiles of keys in shared memory with an online
// softmax and f32 accumulation, for f32 and bf16 operands and head dims up to kMaxHeadDim. The
// forward saves O and the rows' log-sum-exp; the backward recomputes the scores tile by tile, one
// block per key tile accumulating dK and dV over the group's query heads, dQ by atomic adds.
#include "attention/attention.h"

namespace sinter::cuda {

constexpr int64_t kMaxHeadDim = 256;

// What the kernels read besides the geometry: an additive f32 mask laid out by g.ms (or null), and
// the KV cache's length on the device (or null: every key exists).
struct FlashExtras {
  const float* mask = nullptr;
  const int64_t* kv_len = nullptr;
};

// o and lse (f32, contiguous (B, Hq, Lq)); q, k, v, o of `dtype` (f32 or bf16) laid out by g.
void flash_forward(const detail::Geometry& g, DType dtype, const void* q, const void* k, const void* v, FlashExtras x, void* o,
                   float* lse, int device);
// The forward of one query row (a decode step) split over the keys: blocks of keys in parallel,
// their partial softmax sums combined by a second kernel (flash_forward calls it for Lq = 1).
void flash_decode(const detail::Geometry& g, DType dtype, const void* q, const void* k, const void* v, FlashExtras x, void* o,
                  float* lse, int device);
// The bf16 forward on the tensor cores (flash_tc.cu), for the calls flash_tc_takes (head dims 64, 80,
// 96 and 128, more than one query row): P is rounded to bf16 for its product with V, as cuDNN's is.
bool flash_tc_takes(const detail::Geometry& g, DType dtype);
void flash_forward_tc(const detail::Geometry& g, const void* q, const void* k, const void* v, FlashExtras x, void* o, float* lse,
                      int device);
// dq_acc: f32 (B, Hq, Lq, D) contiguous, zeroed; delta: f32 (B, Hq, Lq) scratch; dk, dv laid out
// by g.ldk, g.ldv. lse and dlse f32 contiguous. bf16 calls flash_tc_backward_takes run on the
// tensor cores.
void flash_backward(const detail::Geometry& g, DType dtype, const void* q, const void* k, const void* v, const void* o,
                    const float* lse, const void* dout, const float* dlse, FlashExtras x, float* delta, float* dq_acc, void* dk,
                    void* dv, int device);

// The backward's f32 inputs and dQ's accumulator (B, Hq, Lq[, D]), contiguous: the forward's
// log-sum-exp, delta = rowsum(dO O) - dLSE, and the zeroed dQ.
struct BackwardPtrs {
  const float *lse, *delta;
  float* dq_acc;
};

// The bf16 backward on the tensor cores (flash_tc_backward.cu), head dims 64, 80, 96 and 128: P and
// dS are rounded to bf16 for their products, as FlashAttention-2's and cuDNN's are. flash_backward
// computes delta first.
bool flash_tc_backward_takes(const detail::Geometry& g, DType dtype);
void flash_backward_tc(const detail::Geometry& g, const void* q, const void* k, const void* v, const void* dout, BackwardPtrs bp,
                       FlashExtras x, void* dk, void* dv, int device);

}  // namespace sinter::cuda

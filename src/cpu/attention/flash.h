#pragma once
// FlashAttention-2 on the CPU: tiles of Q against tiles of K/V with an online softmax, fp32
// accumulation, fully masked tiles skipped; the forward saves only O and the row log-sum-exp, and
// the backward recomputes the scores tile by tile. Memory: O(tile^2) per thread, not O(L^2).
// mask: additive, broadcastable to (B, Hq, Lq, Lkv), read in the compute dtype (f32 for bf16 inputs).
// bf16 inputs compute in f32 (lse stays f32). A row that sees no key (or only -inf) gives 0 and
// lse = -inf, as PyTorch's safe softmax.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "attention/attention.h"
#include "cpu/simd/lanes.h"

namespace sinter::detail {

constexpr int64_t kBr = 32, kBc = 64;  // query rows x key columns per tile (generic kernels)

// The f32 kernels' register blocking: floats per register, per block row.
constexpr int64_t kV = cpu::simd::kVectorBytes / 4, kNr = 2 * kV;
constexpr int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

template <class T>
void flash_forward(const Geometry& g, const T* q, const T* k, const T* v, const T* mask, T* o, T* lse);
// KT f32, or bf16 for K and V read in place where every job has at most 4 rows (group x Lq <= 4:
// decode), which the bf16 instantiation alone serves.
template <class KT>
void flash_forward_f32(const Geometry& g, const float* q, const KT* k, const KT* v, const float* mask, float* o, float* lse);
template <class T>
void flash_backward(const Geometry& g, const T* q, const T* k, const T* v, const T* o, const T* lse, const T* dout,
                    const T* dlse, const T* mask, T* dq, T* dk, T* dv);
void flash_backward_f32(const Geometry& g, const float* q, const float* k, const float* v, const float* o, const float* lse,
                        const float* dout, const float* dlse, const float* mask, float* dq, float* dk, float* dv);
// bf16 q, k and v on AMX tiles (flash_amx.cpp): whether this machine runs the call there (no
// dropout, a positive scale, more than 4 query rows per kv head), and the kernel (o bf16, lse f32).
bool flash_amx_takes(const Geometry& g);
void flash_forward_amx(const Geometry& g, const bf16* q, const bf16* k, const bf16* v, const float* mask, bf16* o, float* lse);
// The backward on AMX tiles (flash_amx_backward.cpp) for bf16 q, k, v, o, dO and gradients (lse
// and dlse f32): whether it runs the call (no dropout, a positive scale), and the kernel.
bool flash_amx_backward_takes(const Geometry& g);
void flash_backward_amx(const Geometry& g, const bf16* q, const bf16* k, const bf16* v, const bf16* o, const float* lse,
                        const bf16* dout, const float* dlse, const float* mask, bf16* dq, bf16* dk, bf16* dv);
// Whether the register-blocked kernels run this call: f32 and bf16, any head dims (f64 runs the
// generic kernels, a slow reference).
bool flash_fast_path(DType dtype, int64_t D, int64_t Dv);

}  // namespace sinter::detail

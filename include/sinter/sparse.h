#pragma once
// 2:4 semi-structured sparse weights: at most two nonzeros in every group of four consecutive
// columns, stored as the kept values and their positions, so a matmul reads about half the bytes
// and does half the multiply-adds of the dense weight (docs/sparse.md).

//   Tensor w = prune_2_4(dense);                      // magnitude pruning, per group of four
//   SemiStructuredSparse s = to_sparse_semi_structured(w);            // f32 values
//   SemiStructuredSparse q = to_sparse_semi_structured(w, DType::i8); // int8 values, per-row scales
//   Tensor y = linear(x, s, bias);                    // == linear(x, s.to_dense(), bias)
//   s.prepack();                                      // the weights again in the kernels' layout (faster at small M)
//   s.prepack(/*replace=*/true);                      // or that layout alone, for serving: one copy
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "sinter/tensor.h"

namespace sinter {

// An (N, K) matrix in the 2:4 pattern (K a multiple of 8):
//   values (N, K/2)  the kept entries, f32, bf16 or i8, in column order;
//   meta   (N, K/8)  u8: 4 bits per group of four (two 2-bit column offsets, the smaller in the
//                    low bits), two groups per byte, the earlier group in the low nibble;
//   scales (N)       f32 per-row multipliers: w = values * scale (1 for float values).
// Only the values are ever trained (fine-tuning keeps the pattern): `values` may require grad.
struct SemiStructuredSparse {
  Tensor values, meta, scales;
  SemiStructuredSparse() = default;
  SemiStructuredSparse(Tensor v, Tensor m, Tensor s) : values(std::move(v)), meta(std::move(m)), scales(std::move(s)) {}
  // prepack(): the weights again in the layout the kernels for 2 <= M <= 40 read (AVX2: 8-row
  // tiles, as many bytes as values + meta; AVX-512: 16-row tiles for 2 <= M <= 128, 6-20% more;
  // in the values' dtype), so such a call streams them once instead of
  // repacking them first (as oneDNN's prepacked dense weights); int8 values use it at M = 1 too
  // (prepacked_serves below). linear() uses it when no gradient is needed and values and meta are
  // still the ones it was made from (an in-place change, as fine-tuning makes, or new tensors in
  // their place leave it unused until prepack() is called again).
  Tensor packed;
  void prepack(bool replace = false);
  bool packed_current() const;
  // prepack(replace = true): the prepacked layout becomes the weight's only copy (about the bytes
  // of values + meta: 0.56x dense for f32 values with AVX-512, 0.53x with AVX2); values and meta
  // keep their shape and dtype but no bytes (symbolic tensors). linear() then reads the layout at
  // every M, for inference only (no gradient: an error says so); to_dense() and unpack() rebuild
  // values + meta from it bit for bit (unpack() to save, train or export the weight).
  bool packed_only() const;
  void unpack();

  bool defined() const { return values.defined(); }
  int64_t rows() const { return values.size(0); }
  int64_t cols() const { return values.size(1) * 2; }
  Shape shape() const { return {rows(), cols()}; }
  DType dtype() const { return values.dtype(); }
  int64_t nbytes() const;  // values + meta + scales (not the packed copy); packed only: packed + scales
  // The dense (N, K) matrix: the values' dtype for float values, f32 (dequantised) for int8.
  Tensor to_dense() const;

  // What `packed` was made from, for values and meta: the storage (weakly held: a freed one never
  // matches a new one at the same address), data pointer and version.
  struct Source {
    std::weak_ptr<Storage> storage;
    const void* data = nullptr;
    uint64_t version = 0;
    bool same(const Tensor& t) const;
  };
  Source packed_from[2];

 private:
  void prepack_copy();
};

// Packs a dense (N, K) matrix that is already in the 2:4 pattern. values_dtype: f32, bf16
// (rounded) or i8 (symmetric per-row scales, max |w| -> 127, halves rounded away from zero);
// default: the input's dtype. On the input's device, by ops: a GPU matrix packs on the GPU into the
// CPU's bytes. A group with more than two nonzeros is an error naming the row, columns and values.
SemiStructuredSparse to_sparse_semi_structured(const Tensor& dense, std::optional<DType> values_dtype = {});

// Keeps the two largest |w| of every group of four along the last dim (the earlier on ties) and
// zeroes the other two; mask_2_4 is the boolean mask of what it keeps. On w's device.
Tensor prune_2_4(const Tensor& w);
Tensor mask_2_4(const Tensor& w);

// Whether the 2:4 kernels read a prepacked weight of these values for M rows of x (2 <= M <= 40
// with AVX2, 2 <= M <= 128 with AVX-512, and M = 1 for i8 values; the other sizes run kernels
// faster from values + meta).
bool prepacked_serves(DType values, int64_t M);
// Whether a prepacked copy of w would be read by linear(x, w) with M rows of x of dtype x: the
// kernel choice of the op itself (small layers run densely from a cached dense copy, and never
// read it).
bool prepack_helps(const SemiStructuredSparse& w, DType x, int64_t M);
// The kernel linear(x, w) runs for M rows of x of dtype x ("streaming", "16-row tiles", "dense copy
// (oneDNN)", ...), and whether that is the dense copy of a small layer.
std::string sparse_kernel_for(const SemiStructuredSparse& w, DType x, int64_t M);
bool sparse_runs_densely(const SemiStructuredSparse& w, DType x);
// Bytes held by the dense copies of small 2:4 layers (a layer whose dense f32 weight is at most
// 256 KiB computes densely with f32 or bf16 inputs: it lives in cache, where the 2:4 kernels'
// index decoding costs more than the bytes they save; all copies together stay within 16 MiB).
int64_t sparse_dense_copy_bytes();

// y = act(x w^T + b) with a 2:4 weight (N, K); x (..., K) f32 or bf16, y in x's dtype. activation:
// "none", "relu", "silu" or "gelu" (erf), applied in the kernel's epilogue. Differentiable in x,
// b and the weight's values (the gradient of the kept entries only: the pattern stays). One op
// (sparse24_linear) whose kernel chooses how to compute it: by the rows of x, the CPU, the
// dtypes, whether w.prepack() made a current copy, and the layer's size.
Tensor linear(const Tensor& x, const SemiStructuredSparse& w, const Tensor& b = {}, const std::string& activation = "none");

}  // namespace sinter

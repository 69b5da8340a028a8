#pragma once
// The 2:4 sparse matmul kernels behind the sparse24_linear op: y = act(scale * (x W^T) + b).
// Layout (include/sinter/sparse.h): values (N, K/2), meta (N, K/8) u8, scales (N) f32.
//
// One function, choose(), picks the kernel of a call (by M, the ISA, the dtypes, whether a
// prepacked copy is at hand and the layer's size); the op's CPU kernel (linear_cpu.cpp) runs it.
// The families, one file each:
//   streaming.cpp  M <= kSmallM (decode; AVX-512: M = 1, float values): one streaming pass over the weights, the kept columns of
//                  x gathered in registers, four rows of x per pass over an L2-sized block of rows.
//   tiles8.cpp     AVX2, kSmallM < M < kKMajorM: vectors over 8 weight rows, x's kept columns
//                  picked per lane by an in-lane permute indexed by the meta nibbles; weights
//                  repacked per call (or read prepacked) and reused for every tile of 8 rows of x.
//   tiles16.cpp    AVX-512: the same over 16 weight rows, one vpermps per kept value over 16
//                  columns of x; bf16 x with bf16 values through vdpbf16ps on pairs.
//   k_major.cpp    M >= kKMajorM: x as column-major panels of 64 (AVX2) or 128 rows (AVX-512),
//                  each kept value broadcast against its column of x, picked by address; and the
//                  same over the 8-row prepacked layout in place (f32 values, kKmpMinM..kKmpMaxM).
//   pairs.cpp      bf16 x and bf16 values with AVX512-BF16: K-major, a group's two kept values
//                  one pair for vdpbf16ps.
//   rows512.cpp    AVX-512, M <= kRowsMaxM from values + meta in place: vectors over 16 kept
//                  values of a weight row, x's kept columns picked by vpermt2ps.
// Without AVX2 every M takes the streaming path.
#include <cmath>
#include <cstdint>
#include <string>

#include "sinter/dtype.h"

namespace sinter::sparse {

enum class Act { none, relu, silu, gelu };
Act parse_activation(const std::string& name, const char* op = "sparse24_linear");  // throws naming op on an unknown name

template <class T> inline T activate(T v, Act a) {
  switch (a) {
    case Act::relu: return v > T(0) ? v : T(0);
    case Act::silu: return v / (T(1) + std::exp(-v));
    case Act::gelu: return T(0.5) * v * (T(1) + std::erf(v * T(0.70710678118654752)));
    default: return v;
  }
}

#if defined(__AVX512F__) && defined(__BMI2__)
#define SINTER_TILES16 1  // the tiles run over 16 weight rows (tiles16.cpp), with their own prepacked layout
#endif

constexpr int64_t kSmallM = 4;
#if defined(SINTER_TILES16)
// Zen 5, 2 threads, 4096 x 11008, f32 values (`sinter bench sparse`, the 2:4 rows): the 16-row
// tiles from values + meta against the K-major kernel at M = 8 / 16 / 32 / 64 / 96: 4.4 / 5.8 /
// 8.0 / 13.9-14.9 / 19.6 against 10.2 / 10.4 / 11.0 / 15.2-16.8 / 19.8 ms; even at M = 128.
constexpr int64_t kKMajorM = 96;
#else
// Zen 3, 2 threads, 4096 x 4096 and 4096 x 11008, f32 values: the 8-row tiles against the
// K-major kernel 1.11-1.45x at M = 9-18, even at 22, 0.91-0.93x at 24 (where K-major's 24-row
// panel has no padding).
constexpr int64_t kKMajorM = 23;
#endif

// Prepacked weights (SemiStructuredSparse::prepack): the tiles' layout built once, in the values'
// dtype (f32, bf16, i8), so a call that reads it streams the weights once, in order, instead of
// packing them first (the values are widened in the tile).
// - AVX2 (and portable builds): blocks of 8 weight rows x 32 columns: 8 meta words (u32, a row's
//   4 meta bytes), then the 16 kept values of each row interleaved (value j of row r at 8 j + r);
//   chunk-major (64 rows: 8 groups of 8), then column block (256 columns), group, block. Rows and
//   columns are padded to 8 and 32 with zero values: the same bytes as values + meta when
//   N % 8 == 0 and K % 32 == 0.
// - AVX-512 (SINTER_TILES16): blocks of 16 weight rows x 16 columns: 16 u32 index words (row r's
//   block column of kept value j in bits 4j..4j+3), then the 8 kept values of each row (value j of
//   row r at 16 j + r; bf16 values as the pairs vdpbf16ps takes: the two of group j / 2 side by
//   side in lane r); chunks of 8 groups of 16 rows, then spans of 64 blocks, group, block. Rows
//   and columns are padded to 16 with zero values: 0.25 bytes a kept value more than values +
//   meta (the index words are twice the meta): 6% more for f32 values, 11% bf16, 20% int8.
#if defined(SINTER_TILES16)
// Zen 5, 2 threads, 4096 x 11008, f32 values, against the values + meta kernels of the same call:
// M = 1 / 4 / 16 / 32 / 64 / 128: 1.97 / 2.38 / 3.16 / 5.7 / 12.0 / 22.9 ms against 2.09 / 3.68 /
// 5.8 / 8.0 / 14.9 / 23.9-26.6; at M = 512 0.59-1.27x dense against 1.21-1.48x (x no longer
// stays in L2). At M = 1 only int8 values read it (0.58 against 0.85 ms).
constexpr int64_t kPrepackedMaxM = 128;
#else
// Zen 3, 2 threads, the three `sinter bench sparse` shapes, against the values + meta kernels of
// the same call: M = 2 0.97-1.17x, M = 4-32 1.05-1.85x, M = 33-40 0.94-1.28x, K-major ahead from
// 48; at M = 1 int8 values 1.03-1.33x, f32 0.78-0.90x, bf16 0.88-0.95x. Without AVX2 never.
constexpr int64_t kPrepackedMaxM = 40;
#endif
#if !defined(SINTER_TILES16)
// f32 values prepacked in the 8-row layout at kKmpMinM <= M <= kKmpMaxM: the K-major kernel
// reads the layout in place (k_major.cpp) instead of the permute tiles. Zen 3, 2 threads, the
// three `sinter bench sparse` shapes, one-copy weights, the two kernels alternating in one process
// (the choice switched between calls): M = 24-64 1.03-1.12x the tiles' speed, 128 1.09-1.13x;
// M = 8 0.71-0.75x, 16 0.98-1.02x, 20 0.88-0.92x; M = 512 0.89-1.05x.
constexpr int64_t kKmpMinM = 24, kKmpMaxM = 128;
#endif
bool prepacked_serves(DType vt, int64_t M);
int64_t prepacked_bytes(DType vt, int64_t N, int64_t K);
void prepack(const void* values, DType vt, const uint8_t* meta, int64_t N, int64_t K, uint8_t* out);
// The inverse: values (N, K/2) of dtype vt and meta (N, K/8) from a prepacked weight, bit for bit.
void unpack(const uint8_t* packed, DType vt, int64_t N, int64_t K, void* values, uint8_t* meta);

#if defined(SINTER_TILES16)
// The AVX-512 rows kernel (rows512.cpp) from values + meta at 2 <= M <= kRowsMaxM (int8 values
// from M = 1). Intel Xeon (AVX-512), 2 threads, 4096 x 4096, 4096 x 11008 and 11008 x 4096,
// against the kernels that serve those sizes without it (streaming to M = 4, 16-row tiles packed
// per call above): f32 M = 2-4 0.61-1.17x the time, 8 0.64-1.01x, 16 0.79-1.08x; bf16 and int8 values M = 2-4
// 0.46-0.98x, 8 0.74-0.96x, 12-16 0.82-1.12x; M = 1 f32 0.89-1.17x, bf16 0.90-1.42x, int8
// 0.68-0.81x. Against the prepacked tiles at M = 2-4: f32 values 0.54-0.76x the time on the two
// 180 MB shapes (1.0-1.1x on 4096 x 4096, which stays in this CPU's L3), so f32 values take it even
// when prepacked; bf16 0.96-1.36x, int8 1.15-1.44x, so those keep their prepacked copy. From
// M = 6 it takes 1.3-1.8x the prepacked tiles' time.
constexpr int64_t kRowsMaxM = 8;
#endif

// bf16 x and bf16 values on AVX512-BF16, M >= kPairsM: the K-major pairs kernel. Zen 4, 2
// threads, 4096 x 4096, against the f32 kernels on values + meta: M = 16-32 1.18-1.27x, 48-128
// 1.37-1.45x. Against the 8-row prepacked tiles (4096 x 4096 and 4096 x 11008): M = 12 0.97x, 16
// 1.22-1.28x, 20 0.84-0.87x, 24 0.97-1.01x, 28 1.13-1.16x, 32 1.25-1.30x: a prepacked weight keeps
// its tiles at kPairsM < M < kPairsPrepackedM. With the 16-row tiles, bf16 x takes their pairs
// kernel above kSmallM rows (prepacked always, values + meta from M > kPairsM) and K-major pairs
// at kSmallM < M <= kPairsM.
constexpr int64_t kPairsM = 16, kPairsPrepackedM = 26;

// Dense 2:4 layers this small (their dense f32 weight, bytes) compute densely with f32 or bf16
// inputs: they live in cache, where the 2:4 kernels' index decoding costs more than the bytes they
// save (0.42-1.02x the dense kernel at M = 1 ... 2048 up to 256 KiB; `sinter bench sparse`, the
// small-layer rows). The dense copies (dense_copy.cpp, f32: bf16 x is widened, so the product is
// the 2:4 kernels' one) are made once and remade when values, meta or scales change; all of them
// together stay within kDenseCopyBudget bytes: past it, a model is too big to stay in cache and
// the 2:4 kernels win.
constexpr int64_t kSmallLayerBytes = int64_t(256) << 10;
constexpr int64_t kDenseCopyBudget = int64_t(16) << 20;

enum class Kernel {
  dense,            // a cached dense copy of a small layer, oneDNN's GEMM
  reference_f64,    // f64 x and values, plainly (what gradient checks differentiate)
  streaming,        // streaming.cpp
  tiles8,           // tiles8.cpp, from values + meta
  tiles16,          // tiles16.cpp, from values + meta
  k_major,          // k_major.cpp
  prepacked8,       // tiles8.cpp (or its portable reading), from the prepacked layout
  k_major_prepacked8,  // k_major.cpp, from the 8-row prepacked layout (f32 values)
  prepacked16,      // tiles16.cpp, from the prepacked layout
  pairs_k_major,    // pairs.cpp: bf16 x bf16
  pairs_tiles16,    // tiles16.cpp's vdpbf16ps kernel, from values + meta
  pairs_prepacked16,// the same from the prepacked layout
  rows512,          // rows512.cpp
};
const char* kernel_name(Kernel k);

struct Call {
  DType x, values;
  int64_t M, N, K;
  bool prepacked = false;     // a current prepacked copy comes with the call
  bool dense_allowed = true;  // the dense-copy budget has room (or the copy exists)
  bool packed_only = false;   // the prepacked copy is all there is (prepack(replace=true)): its kernels at every M
};
// The kernel for a call: the one place it is decided.
Kernel choose(const Call& c);

// The families' entry points. x (M, K) row-major; bias (N) or null; y (M, N) f32 (f64 for the
// reference). values of dtype vt unless said otherwise.
void run_streaming(const float* x, int64_t M, int64_t K, const void* values, DType vt, const uint8_t* meta, const float* scales,
                   const float* bias, Act act, float* y, int64_t N);
void run_tiles8(const float* x, int64_t M, int64_t K, const void* values, DType vt, const uint8_t* meta, const uint8_t* prepacked,
                const float* scales, const float* bias, Act act, float* y, int64_t N);
int64_t tiles8_bytes(DType vt, int64_t N, int64_t K);
void tiles8_prepack(const void* values, DType vt, const uint8_t* meta, int64_t N, int64_t K, uint8_t* out);
void tiles8_unpack(const uint8_t* packed, DType vt, int64_t N, int64_t K, void* values, uint8_t* meta);
void run_k_major(const float* x, int64_t M, int64_t K, const void* values, DType vt, const uint8_t* meta, const float* scales,
                 const float* bias, Act act, float* y, int64_t N);
void run_k_major_prepacked(const float* x, int64_t M, int64_t K, const uint8_t* packed, const float* scales, const float* bias,
                           Act act, float* y, int64_t N);
void run_k_major_pairs(const uint16_t* x, int64_t M, int64_t K, const uint16_t* values, const uint8_t* meta, const float* scales,
                       const float* bias, Act act, float* y, int64_t N);
#if defined(SINTER_TILES16)
int64_t tiles16_bytes(DType vt, int64_t N, int64_t K);
void tiles16_prepack(const void* values, DType vt, const uint8_t* meta, int64_t N, int64_t K, uint8_t* out);
void tiles16_unpack(const uint8_t* packed, DType vt, int64_t N, int64_t K, void* values, uint8_t* meta);
// values + meta (packed per call, as f32) or prepacked (values and meta unused).
void tiles16_linear(const float* x, int64_t M, int64_t K, const void* values, DType vt, const uint8_t* meta, const uint8_t* prepacked,
                    const float* scales, const float* bias, Act act, float* y, int64_t N);
#if defined(__AVX512BF16__)
// bf16 x with bf16 values (prepacked or values + meta): vdpbf16ps on the pairs.
void tiles16_linear_bf16(const uint16_t* x, int64_t M, int64_t K, const uint16_t* values, const uint8_t* meta, const uint8_t* prepacked,
                         const float* scales, const float* bias, Act act, float* y, int64_t N);
#endif
#endif
#if defined(SINTER_TILES16)
void run_rows512(const float* x, int64_t M, int64_t K, const void* values, DType vt, const uint8_t* meta, const float* scales,
                 const float* bias, Act act, float* y, int64_t N);
#endif
void linear_f64(const double* x, int64_t M, int64_t K, const double* values, const uint8_t* meta, const float* scales,
                const double* bias, Act act, double* y, int64_t N);

// dense (N, K) = values at meta's positions times scales (T: f32 or f64 output; vt any value dtype).
template <class T> void to_dense(const void* values, DType vt, const uint8_t* meta, const float* scales, int64_t N, int64_t K, T* out);
// kept (N, K/2) = dense (N, K) at meta's positions.
template <class T> void gather_kept(const T* dense, const uint8_t* meta, int64_t N, int64_t K, T* kept);

// Column offsets of the four kept entries of a meta byte (two groups) within its 8 columns.
inline void byte_offsets(uint8_t b, int off[4]) {
  off[0] = b & 3, off[1] = (b >> 2) & 3, off[2] = 4 + ((b >> 4) & 3), off[3] = 4 + (b >> 6);
}

}  // namespace sinter::sparse

#pragma once
// The 2:4 sparse matmul kernels behind linear(x, SemiStructuredSparse): y = act(scale * (x W^T) + b).
// Layout (include/sinter/sparse.h): values (N, K/2), meta (N, K/8) u8, scales (N) f32.
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

// x (M, K) f32 row-major; values of dtype vt (f32, bf16, i8); bias (N) or null; y (M, N) f32.
// M <= kSmallM: one streaming pass over the weights (decode), kept columns of x gathered with
// in-register permutes, four rows of x per pass over an L2-sized block of weight rows;
// kSmallM < M < kKMajorM: the tiles. With AVX2, vectors over 8 weight rows, x's kept columns
// picked per lane by an in-lane permute indexed by the meta nibbles; with AVX-512 (tiles16.cpp),
// vectors over 16 weight rows and one vpermps per kept value over 16 columns of x. Weights are
// repacked per call and reused for every tile of 8 (or 16) rows of x (a prepacked weight, below,
// skips that);
// M >= kKMajorM: K-major, x as column-major panels of 64 (AVX2) or 128 rows (AVX-512), each kept
// value broadcast against its column of x (picked by address: the load ports, not the shuffle
// pipe), the weights packed a block of a chunk of rows at a time as f32.
// Without AVX2 every M takes the streaming path.
constexpr int64_t kSmallM = 4;
#if defined(SINTER_TILES16)
// Measured (session 23, Zen 5, 2 threads, alternating in one process, f32 values): the 16-row
// tiles from values + meta against the K-major kernel on 4096 x 11008 M = 8 / 16 / 32 / 64 / 96:
// 4.4 / 5.8 / 8.0 / 13.9-14.9 / 19.6 against 10.2 / 10.4 / 11.0 / 15.2-16.8 / 19.8 ms; at
// M = 128 22.9-26.6 against 23.4-26.6 on the three shapes (even). At M = 4 the streaming kernel
// 3.7 against 4.5 ms.
constexpr int64_t kKMajorM = 96;
#else
// Measured (session 17, alternating in-process runs, 2 threads, f32 values, 4096 x 4096 and
// 4096 x 11008): the 8-row tiles against the K-major kernel 1.11-1.45x at M = 9-18 (int8, bf16
// values at M = 10-16: 0.98-1.33x), 0.98-1.15x at M = 20-21, even at 22, 0.91-0.93x at 24 (where
// K-major's 24-row panel has no padding); session 14 had measured them even at M = 9-24 before
// the tiles' weights were packed in long runs.
constexpr int64_t kKMajorM = 23;
#endif
void linear_f32(const float* x, int64_t M, int64_t K, const void* values, DType vt, const uint8_t* meta, const float* scales,
                const float* bias, Act act, float* y, int64_t N);
// Prepacked weights (SemiStructuredSparse::prepack): the tiles' layout built once, in the values'
// dtype (f32, bf16, i8), so a call where prepacked_serves(vt, M) reads the weights once, in
// order, instead of packing them first (the values are widened in the tile).
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
int64_t prepacked_bytes(DType vt, int64_t N, int64_t K);
void prepack(const void* values, DType vt, const uint8_t* meta, int64_t N, int64_t K, uint8_t* out);
void linear_prepacked_f32(const float* x, int64_t M, int64_t K, const uint8_t* packed, DType vt, const float* scales,
                          const float* bias, Act act, float* y, int64_t N);
#if defined(SINTER_TILES16)
// Where linear() reads a prepacked weight (session 23, Zen 5, 2 threads, alternating in one
// process, against the values + meta kernels of the same call; f32 values): 4096 x 11008 M = 1 /
// 4 / 16 / 32 / 64 / 128: 1.97 / 2.38 / 3.16 / 5.7 / 12.0 / 22.9 ms against 2.09 / 3.68 / 5.8 /
// 8.0 / 14.9 / 23.9-26.6; the three shapes at M = 128 1.35-1.40x dense against 1.22-1.34x, at
// M = 256 1.12-1.28x against 1.27-1.36x (K-major), at M = 512 0.59-1.27x against 1.21-1.48x
// (every tile of x is read again for each group of 16 weight rows: x no longer stays in L2). At
// M = 1 only int8 values read it (0.58 against 0.85 ms): f32 values gain 6%, not worth a second
// copy of the weights in memory.
constexpr int64_t kPrepackedMaxM = 128;
#else
// Where linear() reads a prepacked weight (scratch A/B in session 18, 2 threads, the three bench
// shapes, alternating with the values + meta kernels of the same call): M = 2 0.97-1.17x,
// M = 4-32 1.05-1.85x (on 4096 x 11008 at M = 18-30 the difference between about even with dense
// and 1.23-1.44x it), M = 33-40 0.94-1.28x (1.07-1.28x at 33-36), K-major even at 48 and ahead at
// 64; at M = 1 int8 values 1.03-1.33x, f32 0.78-0.90x and bf16 0.88-0.95x (their decode kernel
// reads two or four rows side by side; two or four chunks side by side did not speed the tiles
// up). Without AVX2 never (the portable reading of the layout is a plain loop, kept for the op's
// other callers).
constexpr int64_t kPrepackedMaxM = 40;
#endif
bool prepacked_serves(DType vt, int64_t M);
#if defined(SINTER_TILES16)
int64_t tiles16_bytes(DType vt, int64_t N, int64_t K);
void tiles16_prepack(const void* values, DType vt, const uint8_t* meta, int64_t N, int64_t K, uint8_t* out);
// values + meta (packed per call, as f32) or prepacked (values and meta unused).
void tiles16_linear(const float* x, int64_t M, int64_t K, const void* values, DType vt, const uint8_t* meta, const uint8_t* prepacked,
                    const float* scales, const float* bias, Act act, float* y, int64_t N);
#if defined(__AVX512BF16__)
// bf16 x with bf16 values (prepacked or values + meta): vdpbf16ps on the pairs (tiles16.cpp).
void tiles16_linear_bf16(const uint16_t* x, int64_t M, int64_t K, const uint16_t* values, const uint8_t* meta, const uint8_t* prepacked,
                         const float* scales, const float* bias, Act act, float* y, int64_t N);
#endif
#endif
// bf16 x and bf16 values on a CPU with AVX512-BF16, M >= kPairsM: vdpbf16ps takes a group's two
// kept values as one pair against x laid out as pairs of columns (kernels.cpp, k_major_pairs);
// y (M, N) f32. pairs_serve says when linear() takes it. Measured (session 22, Zen 4, 2 threads,
// 4096 x 4096, alternating in one process) against the kernels above on values + meta: M = 16-32
// 1.18-1.27x, 48-128 1.37-1.45x. Against the prepacked tiles (4096 x 4096 and 4096 x 11008):
// M = 12 0.97x, 16 1.22-1.28x (the rows read in place), 20 0.84-0.87x, 24 0.97-1.01x, 28
// 1.13-1.16x, 32 1.25-1.30x; so a prepacked weight keeps its tiles at kPairsM < M < kPairsPrepackedM
// (pairs_beat_prepacked).
// With the 16-row tiles (SINTER_TILES16) bf16 x takes the tiles' pairs kernel (vpermw picks each
// lane's two columns, vdpbf16ps multiplies them with the lane's pair of values) above kSmallM rows
// (pairs_serve): prepacked always, from values + meta at M > kPairsM, the K-major kernel at
// kSmallM < M <= kPairsM (its rows read in place). Measured (session 23, Zen 5, 4096 x 11008,
// alternating): prepacked, the tiles against K-major pairs M = 16 / 32 / 64 / 128 2.5 / 3.9 / 7.2
// / 13.7-14.9 ms against 3.3 / 7.2 / 10.6 / 20.1; from values + meta M = 16 / 32 / 128 / 512 4.2 /
// 5.5 / 14.2 / 53.7 against 3.2 / 7.5 / 20.6 / 73.3; at M = 6-12 the f32 tiles, the tiles' pairs
// kernel and K-major pairs all run 0.73-1.10x oneDNN's bf16 matmul (the packing per call bounds them).
constexpr int64_t kPairsM = 16, kPairsPrepackedM = 26;
bool pairs_beat_prepacked(int64_t M);
bool pairs_serve(DType x, DType vt, int64_t M);
void linear_bf16_pairs(const uint16_t* x, int64_t M, int64_t K, const uint16_t* values, const uint8_t* meta, const float* scales,
                       const float* bias, Act act, float* y, int64_t N);
// The same in f64, plainly (the reference the gradient checks differentiate); values f64.
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

#pragma once
// The 2:4 sparse matmul kernels behind the sparse24_linear op: y = act(scale * (x W^T) + b).
// Layout (include/sinter/sparse.h): values (N, K/2), meta (N, K/8) u8, scales (N) f32.
// Each kernel family is a file (an ISA variant a file of its own) that describes its kernels as
// KernelDef records: what a kernel serves (dtypes, M range, layout; its thresholds live there)
// and where it stands in the walk. choose() walks the records of the families this build has and
// takes the first that serves the call. docs/sparse.md describes the families.
#include <cmath>
#include <cstdint>
#include <span>
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

// The ISA a build targets, as constants for code that is not an ISA variant itself.
#if defined(__AVX512F__) && defined(__BMI2__)
#define SINTER_TILES16 1  // the tiles run over 16 weight rows (tiles16.cpp), with their own prepacked layout
#endif
#if defined(__AVX2__)
inline constexpr bool kAvx2 = true;
#else
inline constexpr bool kAvx2 = false;
#endif

// Thresholds two families share: streaming serves decode (M <= kSmallM); bf16 x with bf16 values
// takes the K-major pairs kernel up to kPairsM rows and the 16-row tiles' pairs above (pairs.cpp).
constexpr int64_t kSmallM = 4;
constexpr int64_t kPairsM = 16;

// Dense 2:4 layers this small (their dense f32 weight, bytes) compute densely with f32 or bf16
// inputs: in cache, the 2:4 kernels' index decoding costs more than the bytes they save (0.42-1.02x
// the dense kernel at M = 1 ... 2048 up to 256 KiB; `sinter bench sparse`, the small-layer rows).
// The dense copies (dense_copy.cpp) stay within kDenseCopyBudget bytes together.
constexpr int64_t kSmallLayerBytes = int64_t(256) << 10;
constexpr int64_t kDenseCopyBudget = int64_t(16) << 20;

enum class Kernel {
  dense,               // a cached dense copy of a small layer, oneDNN's GEMM (dense_copy.cpp)
  reference_f64,       // f64 x and values, plainly (what gradient checks differentiate)
  streaming,           // streaming_avx2.cpp / streaming_portable.cpp
  tiles8,              // tiles8.cpp, from values + meta
  tiles16,             // tiles16.cpp, from values + meta
  k_major,             // k_major.cpp
  prepacked8,          // tiles8.cpp (tiles8_layout.cpp without AVX2), from the prepacked layout
  k_major_prepacked8,  // k_major.cpp, from the 8-row prepacked layout (f32 values)
  prepacked16,         // tiles16.cpp, from the prepacked layout
  pairs_k_major,       // pairs.cpp: bf16 x bf16
  pairs_tiles16,       // tiles16_bf16.cpp, from values + meta
  pairs_prepacked16,   // the same from the prepacked layout
  rows512,             // rows512.cpp
  amx_bf16,            // amx_bf16.cpp: bf16 x bf16 through the tile unit
};
const char* kernel_name(Kernel k);

struct Call {
  DType x, values;
  int64_t M, N, K;
  bool prepacked = false;     // a current prepacked copy comes with the call
  bool dense_allowed = true;  // the dense-copy budget has room (or the copy exists)
  bool packed_only = false;   // the prepacked copy is all there is (prepack(replace=true)): its kernels at every M
  bool has_values() const { return !packed_only; }
};

// What a kernel runs on: x (M, K) row-major as f32 (x) or bf16 (xh); bias (N) or null; y (M, N)
// f32 (or bf16, yh); values of dtype vt + meta, or `packed` (the prepacked layout, past its header).
struct Args {
  const float* x;
  const uint16_t* xh;
  int64_t M, K, N;
  const void* values;
  DType vt;
  const uint8_t* meta;
  const uint8_t* packed;
  const float* scales;
  const float* bias;
  Act act;
  float* y;
  uint16_t* yh = nullptr;  // bf16 y instead, for kernels whose record says bf16_y (y then null)
};

// Where a kernel stands in choose()'s walk (lower first), and what comes before it.
enum Order : int {
  kOrderReference = 0,   // f64 x
  kOrderDense = 30,      // a small layer's dense copy
  kOrderRowsF32 = 40,    // AVX-512 rows, f32 values at 2 <= M <= kSmallM: even over a prepacked copy
  kOrderAmx = 44,        // bf16 x bf16 on the tile unit (AMX), ahead of every vector kernel it beats
  kOrderPairsFirst = 45, // bf16 pairs ahead of the 8-row prepacked tiles at some M
  kOrderPrepacked = 50,  // the readers of a prepacked copy (and of a weight held only prepacked)
  kOrderPairs = 60,      // bf16 x with bf16 values
  kOrderRows = 70,       // AVX-512 rows from values + meta
  kOrderTiles = 80,      // the tile kernels over values + meta
  kOrderKMajor = 90,     // K-major panels
  kOrderStreaming = 100, // everything else
};

struct KernelDef {
  Kernel kernel;
  int order;
  bool (*serves)(const Call&);
  void (*run)(const Args&);  // null for dense and reference_f64, which linear_cpu.cpp runs itself
  bool bf16_x = false;       // reads x as bf16 (Args::xh)
  bool reads_packed = false; // reads the prepacked layout (Args::packed), not values + meta
  bool bf16_y = false;       // writes a bf16 y itself (Args::yh), rounding once
};

// The families' records, empty where the file's ISA is not built.
std::span<const KernelDef> streaming_kernels();
std::span<const KernelDef> tiles8_kernels();
std::span<const KernelDef> tiles8_portable_kernels();
std::span<const KernelDef> tiles16_kernels();
std::span<const KernelDef> tiles16_bf16_kernels();
std::span<const KernelDef> k_major_kernels();
std::span<const KernelDef> k_major_prepacked8_kernels();
std::span<const KernelDef> pairs_kernels();
std::span<const KernelDef> rows512_kernels();
std::span<const KernelDef> amx_kernels();
// The dense bf16 linear on the same tile code (amx_bf16.cpp; gemm.cpp calls it): y (M x N) =
// x (M x K) w^T (w: N x K rows) + bias (f32, or null), every pointer bf16 but the bias. False where
// this build or machine has no tile unit (or SINTER_AMX=0).
bool amx_dense_bf16(const uint16_t* x, const uint16_t* w, const float* bias, uint16_t* y, int64_t M, int64_t N, int64_t K);

// The kernel for a call: the one place it is decided.
const KernelDef& choose(const Call& c);

// A prepacked layout: the tiles' blocks, in the values' dtype. Its bytes start with a 64-byte
// header (magic "S24PACK", the format, the values' dtype, N, K), so bytes packed for another ISA
// are an error naming both formats rather than a wrong product.
enum PackFormatId : uint32_t { kPack8Rows = 1, kPack16Rows = 2 };
struct PackFormat {
  PackFormatId id;
  const char* name;  // "8-row tiles (AVX2)"
  int64_t max_m;     // its readers serve 2 <= M <= max_m (int8 values M = 1 too); 0: only a weight held prepacked alone
  int64_t (*bytes)(DType vt, int64_t N, int64_t K);
  void (*pack)(const void* values, DType vt, const uint8_t* meta, int64_t N, int64_t K, uint8_t* out);
  void (*unpack)(const uint8_t* packed, DType vt, int64_t N, int64_t K, void* values, uint8_t* meta);
};
constexpr int64_t kPackHeaderBytes = 64;
const PackFormat& tiles8_format();
const PackFormat* tiles16_format();  // null without AVX-512
const PackFormat& pack_format();     // this build's: the 16-row tiles where built, else the 8-row ones

bool prepacked_serves(DType vt, int64_t M);
int64_t prepacked_bytes(DType vt, int64_t N, int64_t K);  // header included
void prepack(const void* values, DType vt, const uint8_t* meta, int64_t N, int64_t K, uint8_t* out);
// The inverse: values (N, K/2) of dtype vt and meta (N, K/8) from a prepacked weight, bit for bit.
void unpack(const uint8_t* packed, DType vt, int64_t N, int64_t K, void* values, uint8_t* meta);
// The layout past the header, after checking that the header is this build's format for these
// values and shape (an error naming `op`, both formats or what differs).
const uint8_t* packed_payload(const uint8_t* packed, int64_t nbytes, DType vt, int64_t N, int64_t K, const char* op);

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

// The 8-row layout's packing (tiles8_layout.cpp), which every build has.
int64_t tiles8_bytes(DType vt, int64_t N, int64_t K);
void tiles8_prepack(const void* values, DType vt, const uint8_t* meta, int64_t N, int64_t K, uint8_t* out);
void tiles8_unpack(const uint8_t* packed, DType vt, int64_t N, int64_t K, void* values, uint8_t* meta);

}  // namespace sinter::sparse

// The one place a 2:4 call's kernel is chosen (choose), the prepacked layout's entry points,
// the f64 reference, and the dense <-> kept conversions.
#include "cpu/sparse24/kernel_common.h"

namespace sinter::sparse {

Act parse_activation(const std::string& name, const char* op) {
  if (name == "none") return Act::none;
  if (name == "relu") return Act::relu;
  if (name == "silu") return Act::silu;
  if (name == "gelu") return Act::gelu;
  SINTER_THROW(Error, "[", op, "] unknown activation '", name, "' (none, relu, silu, gelu)");
}

const char* kernel_name(Kernel k) {
  switch (k) {
    case Kernel::dense: return "dense copy (oneDNN)";
    case Kernel::reference_f64: return "f64 reference";
    case Kernel::streaming: return "streaming";
    case Kernel::tiles8: return "8-row tiles";
    case Kernel::tiles16: return "16-row tiles";
    case Kernel::k_major: return "K-major";
    case Kernel::prepacked8: return "8-row tiles, prepacked";
    case Kernel::k_major_prepacked8: return "K-major, 8-row prepacked";
    case Kernel::prepacked16: return "16-row tiles, prepacked";
    case Kernel::pairs_k_major: return "K-major bf16 pairs";
    case Kernel::pairs_tiles16: return "16-row tiles, bf16 pairs";
    case Kernel::pairs_prepacked16: return "16-row tiles, bf16 pairs, prepacked";
    case Kernel::rows512: return "AVX-512 rows";
  }
  return "?";
}

bool prepacked_serves(DType vt, int64_t M) {
#if defined(__AVX2__)
  return M <= kPrepackedMaxM && (M >= 2 || (M == 1 && vt == DType::i8));
#else
  (void)vt, (void)M;
  return false;
#endif
}

// The kernel that reads a prepacked weight for this call's dtypes.
static Kernel prepacked_kernel(const Call& c) {
  (void)c;  // a build without AVX2 or AVX512-BF16 reads nothing of it
#if defined(SINTER_TILES16)
#if defined(__AVX512BF16__)
  if (c.x == DType::bf16 && c.values == DType::bf16) return Kernel::pairs_prepacked16;
#endif
  return Kernel::prepacked16;
#else
#if defined(__AVX2__)
  if (c.values == DType::f32 && c.M >= kKmpMinM && c.M <= kKmpMaxM) return Kernel::k_major_prepacked8;
#endif
  return Kernel::prepacked8;
#endif
}

Kernel choose(const Call& c) {
  if (c.x == DType::f64) return Kernel::reference_f64;
  if (c.packed_only) return prepacked_kernel(c);
  if (c.dense_allowed && (c.x == DType::f32 || c.x == DType::bf16) && c.N * c.K * 4 <= kSmallLayerBytes) return Kernel::dense;
#if defined(__AVX512BF16__)
  const bool pairs = c.x == DType::bf16 && c.values == DType::bf16 &&
#if defined(SINTER_TILES16)
                     c.M > kSmallM;
  const bool pairs_first = false;  // the prepacked 16-row tiles read bf16 x with vdpbf16ps too
#else
                     c.M >= kPairsM;
  const bool pairs_first = pairs && (c.M <= kPairsM || c.M >= kPairsPrepackedM);
#endif
#else
  const bool pairs = false, pairs_first = false;
#endif
#if defined(SINTER_TILES16)
  // f32 values at 2 <= M <= kSmallM: the rows kernel streams values + meta faster than the
  // prepacked tiles stream their copy (kernels.h)
  if (c.values == DType::f32 && c.M >= 2 && c.M <= kSmallM) return Kernel::rows512;
#endif
  if (c.prepacked && prepacked_serves(c.values, c.M) && !pairs_first) return prepacked_kernel(c);
  if (pairs) {
#if defined(SINTER_TILES16)
    if (c.M > kPairsM) return Kernel::pairs_tiles16;
#endif
    return Kernel::pairs_k_major;
  }
#if defined(SINTER_TILES16)
  if (c.M <= kRowsMaxM && (c.M >= 2 || c.values == DType::i8)) return Kernel::rows512;
#endif
#if defined(__AVX2__)
  if (c.M >= kKMajorM) return Kernel::k_major;
#if defined(SINTER_TILES16)
  if (c.M > kSmallM) return Kernel::tiles16;
#else
  if (c.M > kSmallM) return Kernel::tiles8;
#endif
#endif
  return Kernel::streaming;
}

int64_t prepacked_bytes(DType vt, int64_t N, int64_t K) {
#if defined(SINTER_TILES16)
  return tiles16_bytes(vt, N, K);
#else
  return tiles8_bytes(vt, N, K);
#endif
}

void prepack(const void* values, DType vt, const uint8_t* meta, int64_t N, int64_t K, uint8_t* out) {
#if defined(SINTER_TILES16)
  tiles16_prepack(values, vt, meta, N, K, out);
#else
  tiles8_prepack(values, vt, meta, N, K, out);
#endif
}

void unpack(const uint8_t* packed, DType vt, int64_t N, int64_t K, void* values, uint8_t* meta) {
#if defined(SINTER_TILES16)
  tiles16_unpack(packed, vt, N, K, values, meta);
#else
  tiles8_unpack(packed, vt, N, K, values, meta);
#endif
}

void linear_f64(const double* x, int64_t M, int64_t K, const double* values, const uint8_t* meta, const float* scales,
                const double* bias, Act act, double* y, int64_t N) {
  plain_rows(x, M, K, [&](int64_t i) { return values[i]; }, meta, scales, bias, act, y, N);
}

template <class T> void to_dense(const void* values, DType vt, const uint8_t* meta, const float* scales, int64_t N, int64_t K, T* out) {
  const int64_t K2 = K / 2, K8 = K / 8;
  parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      T* row = out + n * K;
      std::fill(row, row + K, T(0));
      for (int64_t b = 0; b < K8; ++b) {
        int off[4];
        byte_offsets(meta[n * K8 + b], off);
        for (int t = 0; t < 4; ++t) {
          const int64_t i = n * K2 + 4 * b + t;
          const T v = vt == DType::f64 ? T(static_cast<const double*>(values)[i]) : T(value_at(values, vt, i));
          row[8 * b + off[t]] += v * T(scales[n]);  // a column named twice (meta a reader may hand us) adds up, as in every product
        }
      }
    }
  });
}

template <class T> void gather_kept(const T* dense, const uint8_t* meta, int64_t N, int64_t K, T* kept) {
  const int64_t K2 = K / 2, K8 = K / 8;
  parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t b = 0; b < K8; ++b) {
        int off[4];
        byte_offsets(meta[n * K8 + b], off);
        for (int t = 0; t < 4; ++t) kept[n * K2 + 4 * b + t] = dense[n * K + 8 * b + off[t]];
      }
  });
}

template void to_dense<float>(const void*, DType, const uint8_t*, const float*, int64_t, int64_t, float*);
template void to_dense<double>(const void*, DType, const uint8_t*, const float*, int64_t, int64_t, double*);
template void gather_kept<float>(const float*, const uint8_t*, int64_t, int64_t, float*);
template void gather_kept<double>(const double*, const uint8_t*, int64_t, int64_t, double*);

}  // namespace sinter::sparse

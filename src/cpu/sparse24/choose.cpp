// The one place a 2:4 call's kernel is chosen (choose: the families' records in order), the
// prepacked layout's header and entry points, the f64 reference, and the dense <-> kept conversions.
#include <algorithm>
#include <cstring>
#include <vector>

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
    case Kernel::amx_bf16: return "AMX bf16 tiles, expanded";
  }
  return "?";
}

namespace {

// The kernels every build has that are not a family's: f64 calls (plainly), and small layers
// (a cached dense copy) wherever values + meta exist.
const KernelDef kBuiltIn[] = {
    {Kernel::reference_f64, kOrderReference, [](const Call& c) { return c.x == DType::f64; }, nullptr},
    {Kernel::dense, kOrderDense,
     [](const Call& c) {
       return c.has_values() && c.dense_allowed && (c.x == DType::f32 || c.x == DType::bf16) && c.N * c.K * 4 <= kSmallLayerBytes;
     },
     nullptr},
};

// Every record of the families built, in walking order.
const std::vector<const KernelDef*>& walk() {
  static const std::vector<const KernelDef*> all = [] {
    std::vector<const KernelDef*> v;
    for (std::span<const KernelDef> family :
         {std::span<const KernelDef>(kBuiltIn), streaming_kernels(), tiles8_kernels(), tiles8_portable_kernels(), tiles16_kernels(),
          tiles16_bf16_kernels(), k_major_kernels(), k_major_prepacked8_kernels(), pairs_kernels(), rows512_kernels(), amx_kernels()})
      for (const KernelDef& k : family) v.push_back(&k);
    std::stable_sort(v.begin(), v.end(), [](const KernelDef* a, const KernelDef* b) { return a->order < b->order; });
    return v;
  }();
  return all;
}

}  // namespace

const KernelDef& choose(const Call& c) {
  for (const KernelDef* k : walk())
    if (k->serves(c)) return *k;
  SINTER_THROW(Error, "[internal] sparse24_linear: no 2:4 kernel of this build serves a call with ", c.M, " rows");
}

bool prepacked_serves(DType vt, int64_t M) {
  return M <= pack_format().max_m && (M >= 2 || (M == 1 && vt == DType::i8));
}

const PackFormat& pack_format() {
  static const PackFormat& f = tiles16_format() ? *tiles16_format() : tiles8_format();
  return f;
}

namespace {

constexpr char kMagic[8] = {'S', '2', '4', 'P', 'A', 'C', 'K', '\0'};
struct Header {
  char magic[8];
  uint32_t format, dtype;
  int64_t N, K;
};
static_assert(sizeof(Header) <= kPackHeaderBytes);

const char* format_name(uint32_t id) {
  switch (id) {
    case kPack8Rows: return "8-row tiles (AVX2)";
    case kPack16Rows: return "16-row tiles (AVX-512)";
    default: return "unknown";
  }
}

}  // namespace

int64_t prepacked_bytes(DType vt, int64_t N, int64_t K) { return kPackHeaderBytes + pack_format().bytes(vt, N, K); }

void prepack(const void* values, DType vt, const uint8_t* meta, int64_t N, int64_t K, uint8_t* out) {
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.format = pack_format().id, h.dtype = uint32_t(vt), h.N = N, h.K = K;
  std::memset(out, 0, kPackHeaderBytes);
  std::memcpy(out, &h, sizeof h);
  pack_format().pack(values, vt, meta, N, K, out + kPackHeaderBytes);
}

const uint8_t* packed_payload(const uint8_t* packed, int64_t nbytes, DType vt, int64_t N, int64_t K, const char* op) {
  Header h{};
  SINTER_CHECK(nbytes >= kPackHeaderBytes, "[", op, "] ", nbytes, " bytes are not a prepacked 2:4 weight (no header)");
  std::memcpy(&h, packed, sizeof h);
  SINTER_CHECK(std::memcmp(h.magic, kMagic, sizeof kMagic) == 0, "[", op, "] the bytes are not a prepacked 2:4 weight (no S24PACK header)");
  const PackFormat& f = pack_format();
  SINTER_CHECK(h.format == f.id, "[", op, "] the weight was prepacked as ", format_name(h.format), "; this build reads ", f.name,
               ": unpack() it where it was packed, or prepack() it here from values + meta");
  SINTER_CHECK(h.dtype == uint32_t(vt) && h.N == N && h.K == K, "[", op, "] the prepacked bytes hold a (", h.N, ", ", h.K, ") weight of ",
               dtype_name(DType(h.dtype)), " values, not (", N, ", ", K, ") of ", vt);
  return packed + kPackHeaderBytes;
}

void unpack(const uint8_t* packed, DType vt, int64_t N, int64_t K, void* values, uint8_t* meta) {
  const uint8_t* p = packed_payload(packed, prepacked_bytes(vt, N, K), vt, N, K, "unpack");
  pack_format().unpack(p, vt, N, K, values, meta);
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

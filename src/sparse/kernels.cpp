// 2:4 sparse matmul kernels (see kernels.h). Measured against oneDNN's dense matmul by
// `sinter bench sparse` (BENCHMARKS.md).
#include "sparse/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "core/parallel.h"
#include "ops/scalar_fns.h"
#include "sinter/error.h"
#include "sinter/tensor.h"

namespace sinter::sparse {

Act parse_activation(const std::string& name) {
  if (name == "none") return Act::none;
  if (name == "relu") return Act::relu;
  if (name == "silu") return Act::silu;
  if (name == "gelu") return Act::gelu;
  SINTER_THROW(Error, "[sparse24_linear] unknown activation '", name, "' (none, relu, silu, gelu)");
}

namespace {

template <class T> SINTER_INLINE T activate(T v, Act a) {
  switch (a) {
    case Act::relu: return v > T(0) ? v : T(0);
    case Act::silu: return v / (T(1) + std::exp(-v));
    case Act::gelu: return T(0.5) * v * (T(1) + std::erf(v * T(0.70710678118654752)));
    default: return v;
  }
}

// One kept value as f32, whatever its storage.
SINTER_INLINE float value_at(const void* values, DType vt, int64_t i) {
  switch (vt) {
    case DType::f32: return static_cast<const float*>(values)[i];
    case DType::f64: return float(static_cast<const double*>(values)[i]);
    case DType::bf16: return float(static_cast<const bf16*>(values)[i]);
    default: return float(static_cast<const int8_t*>(values)[i]);
  }
}

typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef int8_t v8c __attribute__((vector_size(8)));
typedef int16_t v8s __attribute__((vector_size(16)));

SINTER_INLINE v8f load8f(const float* p) { v8f v; std::memcpy(&v, p, 32); return v; }
SINTER_INLINE void store8f(float* p, v8f v) { std::memcpy(p, &v, 32); }

// Eight kept values as f32.
template <class V> SINTER_INLINE v8f load_values(const V* p);
template <> SINTER_INLINE v8f load_values<float>(const float* p) { return load8f(p); }
template <> SINTER_INLINE v8f load_values<bf16>(const bf16* p) {
#if defined(__AVX2__)
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return (v8f)_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);  // the bf16 bits are the high half of an f32
#else
  v8s s;
  std::memcpy(&s, p, 16);
  return (v8f)(__builtin_convertvector(s, v8i) << 16);
#endif
}
template <> SINTER_INLINE v8f load_values<int8_t>(const int8_t* p) {
#if defined(__AVX2__)
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return (v8f)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
#else
  v8c c;
  std::memcpy(&c, p, 8);
  return __builtin_convertvector(__builtin_convertvector(c, v8i), v8f);
#endif
}

// For a meta byte: lanes 0-3 the byte's four kept columns (0..7), lanes 4-7 the same plus 8.
struct PermuteTable {
  alignas(32) int32_t idx[256][8];
  PermuteTable() {
    for (int b = 0; b < 256; ++b) {
      int off[4];
      byte_offsets(uint8_t(b), off);
      for (int t = 0; t < 4; ++t) idx[b][t] = off[t], idx[b][4 + t] = 8 + off[t];
    }
  }
};
const PermuteTable& permute_table() {
  static const PermuteTable t;
  return t;
}

// The eight kept columns of x[16c, 16c + 16) for meta bytes b0 (lanes 0-3) and b1 (lanes 4-7).
SINTER_INLINE v8f gather16(const float* x16, v8i idx) {
  const v8f a = load8f(x16), b = load8f(x16 + 8);
#if defined(__AVX2__)
  return (v8f)_mm256_blend_ps(_mm256_permutevar8x32_ps((__m256)a, (__m256i)idx),
                              _mm256_permutevar8x32_ps((__m256)b, (__m256i)idx), 0xF0);
#else
  return __builtin_shuffle(a, b, idx);
#endif
}

SINTER_INLINE float hsum(v8f v) {
  float s = 0;
  for (int l = 0; l < 8; ++l) s += v[l];
  return s;
}

// Decode: y[m, n] for M <= 4 rows of x, weight rows [n0, n1). Each weight row is read once, in
// order, 8 kept values (16 columns) per step; rows are prefetched a few steps ahead.
constexpr int64_t kPf = 2048;  // prefetch distance in the values stream, bytes (1-4 KiB measured; 2 KiB best)
template <int M, class V>
void small_m_rows(const float* x, int64_t K, const V* values, const uint8_t* meta, int64_t n0, int64_t n1, float* dots) {
  const PermuteTable& pt = permute_table();
  const int64_t chunks = K / 16, K2 = K / 2, K8 = K / 8;
  for (int64_t n = n0; n < n1; ++n) {
    const V* w = values + n * K2;
    const uint8_t* mt = meta + n * K8;
    __builtin_prefetch(mt + 4 * K8, 0, 0);  // meta: a line per row, four rows ahead
    v8f acc0[M], acc1[M];  // two chains per row of x: the FMA latency is hidden
    for (int m = 0; m < M; ++m) acc0[m] = v8f{}, acc1[m] = v8f{};
    auto idx_of = [&](int64_t c) {
      v8i i0, i1;
      std::memcpy(&i0, pt.idx[mt[2 * c]], 32);
      std::memcpy(&i1, pt.idx[mt[2 * c + 1]], 32);
      return __builtin_shuffle(i0, i1, (v8i){0, 1, 2, 3, 12, 13, 14, 15});
    };
    int64_t c = 0;
    for (; c + 2 <= chunks; c += 2) {
      __builtin_prefetch(reinterpret_cast<const char*>(w + 8 * c) + kPf, 0, 0);  // values: kPf bytes ahead
      const v8i ia = idx_of(c), ib = idx_of(c + 1);
      const v8f wa = load_values(w + 8 * c), wb = load_values(w + 8 * c + 8);
      for (int m = 0; m < M; ++m) {
        acc0[m] += wa * gather16(x + m * K + 16 * c, ia);
        acc1[m] += wb * gather16(x + m * K + 16 * c + 16, ib);
      }
    }
    float tail[M] = {};
    for (; c < chunks; ++c) {
      const v8i ia = idx_of(c);
      const v8f wa = load_values(w + 8 * c);
      for (int m = 0; m < M; ++m) acc0[m] += wa * gather16(x + m * K + 16 * c, ia);
    }
    if (K % 16) {  // one last meta byte: four kept values over 8 columns
      int off[4];
      byte_offsets(mt[K8 - 1], off);
      for (int t = 0; t < 4; ++t)
        for (int m = 0; m < M; ++m) tail[m] += float(w[K2 - 4 + t]) * x[m * K + K - 8 + off[t]];
    }
    for (int m = 0; m < M; ++m) dots[m * (n1 - n0) + (n - n0)] = hsum(acc0[m] + acc1[m]) + tail[m];
  }
}

template <class V>
void small_m(const float* x, int64_t M, int64_t K, const V* values, const uint8_t* meta, const float* scales, const float* bias,
             Act act, float* y, int64_t N) {
  // Up to four rows of x per pass over a block of weight rows; with more rows the block (at most
  // ~256 KiB of values) is passed again from L2, so memory still sees each weight byte once.
  const int64_t K2 = K / 2, row_bytes = K2 * int64_t(sizeof(V)) + K / 8;
  const int64_t block = M <= 4 ? 64 : std::max<int64_t>(8, (int64_t(256) << 10) / row_bytes);
  parallel_for(0, N, std::min<int64_t>(block, 64), [&](int64_t lo, int64_t hi) {
    std::vector<float> dots(static_cast<size_t>(4 * block));
    for (int64_t n0 = lo; n0 < hi; n0 += block) {
      const int64_t n1 = std::min(hi, n0 + block), nb = n1 - n0;
      for (int64_t m0 = 0; m0 < M; m0 += 4) {
        const float* xm = x + m0 * K;
        switch (std::min<int64_t>(4, M - m0)) {
          case 1: small_m_rows<1>(xm, K, values, meta, n0, n1, dots.data()); break;
          case 2: small_m_rows<2>(xm, K, values, meta, n0, n1, dots.data()); break;
          case 3: small_m_rows<3>(xm, K, values, meta, n0, n1, dots.data()); break;
          default: small_m_rows<4>(xm, K, values, meta, n0, n1, dots.data()); break;
        }
        for (int64_t m = m0; m < std::min(M, m0 + 4); ++m)
          for (int64_t n = n0; n < n1; ++n)
            y[m * N + n] = activate(dots[size_t((m - m0) * nb + n - n0)] * scales[n] + (bias ? bias[n] : 0.0f), act);
      }
    }
  });
}
// Many rows: x packed as panels of pw rows, column-major inside a panel (xp[k][j]), so one kept
// value (n, k) multiplies a contiguous run of pw x values: one broadcast, pw/8 loads and FMAs.
// pw = 64 or 96 (8 or 12 registers of accumulators for one weight row) when M fills it, else 24
// (4 weight rows x 3 registers). Columns are blocked (kc) so a panel block stays in L1; each
// group of weight rows is decoded once, block-major, into records of (kc/2 values as f32, their
// offsets into the panel), so the inner loop reads one contiguous stream.
constexpr int64_t kGroupRows = 64, kSubRows = 16;

// acc(R rows x NV registers) += sum over j < J of w[r][j] * xp[k[r][j] ...]; row r's record at
// rec + r * 2J: J values, then J offsets.
template <int R, int NV>
SINTER_INLINE void panel_block(const float* rec, int64_t J, const float* xp, float* yb) {
  constexpr int64_t pw = 8 * NV;
  v8f acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = load8f(yb + r * pw + 8 * v);
  const int32_t* k = reinterpret_cast<const int32_t*>(rec);
  for (int64_t j = 0; j < J; ++j)
    for (int r = 0; r < R; ++r) {
      const float wv = rec[r * 2 * J + j];
      const float* xr = xp + k[r * 2 * J + J + j];
      for (int v = 0; v < NV; ++v) acc[r][v] += wv * load8f(xr + 8 * v);
    }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) store8f(yb + r * pw + 8 * v, acc[r][v]);
}

// Rows [n0, n0 + rows) decoded into records: block b, row r at dec + (b * rows + r) * 2J; a block
// past K's end is padded with zero values at offset 0.
template <class V>
void decode_rows(const V* values, const uint8_t* meta, int64_t n0, int64_t rows, int64_t K, int64_t pw, int64_t kc, float* dec) {
  const int64_t K2 = K / 2, K8 = K / 8, J = kc / 2, blocks = (K + kc - 1) / kc;
  for (int64_t bl = 0; bl < blocks; ++bl)
    for (int64_t r = 0; r < rows; ++r) {
      float* w = dec + (bl * rows + r) * 2 * J;
      int32_t* k = reinterpret_cast<int32_t*>(w + J);
      const V* v = values + (n0 + r) * K2;
      const uint8_t* mt = meta + (n0 + r) * K8;
      for (int64_t jb = 0; jb < J / 4; ++jb) {  // four kept values per meta byte
        const int64_t byte = bl * kc / 8 + jb;
        if (byte >= K8) {
          for (int t = 0; t < 4; ++t) w[4 * jb + t] = 0.0f, k[4 * jb + t] = 0;
          continue;
        }
        int off[4];
        byte_offsets(mt[byte], off);
        for (int t = 0; t < 4; ++t) w[4 * jb + t] = float(v[4 * byte + t]), k[4 * jb + t] = int32_t((8 * byte + off[t]) * pw);
      }
    }
}

template <int NV, int R>
void panels_w(const float* x, int64_t M, int64_t K, const void* values, DType vt, const uint8_t* meta, const float* scales,
              const float* bias, Act act, float* y, int64_t N) {
  constexpr int64_t pw = 8 * NV, kc = NV == 2 ? 256 : NV == 3 ? 192 : NV == 8 ? 72 : 48;  // pw * kc * 4 bytes <= 18 KiB
  constexpr int64_t J = kc / 2;
  const int64_t P = (M + pw - 1) / pw, blocks = (K + kc - 1) / kc;
  // From the caching allocator: 64-byte aligned, so no 8-float load straddles a cache line.
  Tensor xp_buf = Tensor::empty({P * K * pw}, DType::f32);
  float* xp = xp_buf.data<float>();
  parallel_for(0, P, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      for (int64_t k = 0; k < K; ++k)
        for (int64_t j = 0; j < pw; ++j) {
          const int64_t m = p * pw + j;
          xp[(p * K + k) * pw + j] = m < M ? x[m * K + k] : 0.0f;
        }
  });
  const int64_t groups = (N + kGroupRows - 1) / kGroupRows;
  parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
    std::vector<float> dec(static_cast<size_t>(blocks * kGroupRows * 2 * J)), yb(static_cast<size_t>(kGroupRows * pw));
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t n0 = g * kGroupRows, rows = std::min(kGroupRows, N - n0);
      switch (vt) {  // decode the group once, reuse it for every panel
        case DType::f32: decode_rows(static_cast<const float*>(values), meta, n0, rows, K, pw, kc, dec.data()); break;
        case DType::bf16: decode_rows(static_cast<const bf16*>(values), meta, n0, rows, K, pw, kc, dec.data()); break;
        case DType::f64: decode_rows(static_cast<const double*>(values), meta, n0, rows, K, pw, kc, dec.data()); break;
        default: decode_rows(static_cast<const int8_t*>(values), meta, n0, rows, K, pw, kc, dec.data()); break;
      }
      for (int64_t p = 0; p < P; ++p) {
        std::fill(yb.begin(), yb.end(), 0.0f);
        const float* xpp = xp + p * K * pw;
        // Sub-groups of rows: their partial sums, a block's records and the panel block fit in L1.
        for (int64_t s0 = 0; s0 < rows; s0 += kSubRows) {
          const int64_t s1 = std::min(rows, s0 + kSubRows);
          for (int64_t bl = 0; bl < blocks; ++bl) {
            const float* rec = dec.data() + bl * rows * 2 * J;
            int64_t r = s0;
            for (; r + R <= s1; r += R) panel_block<R, NV>(rec + r * 2 * J, J, xpp, yb.data() + r * pw);
            for (; r < s1; ++r) panel_block<1, NV>(rec + r * 2 * J, J, xpp, yb.data() + r * pw);
          }
        }
        for (int64_t j = 0; j < std::min(pw, M - p * pw); ++j)
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t n = n0 + r;
            y[(p * pw + j) * N + n] = activate(yb[size_t(r * pw + j)] * scales[n] + (bias ? bias[n] : 0.0f), act);
          }
      }
    }
  });
}

void panels(const float* x, int64_t M, int64_t K, const void* values, DType vt, const uint8_t* meta, const float* scales,
            const float* bias, Act act, float* y, int64_t N) {
  // Panel width by cost: panels needed x (registers per kept value + ~2.5 for its broadcast,
  // offset load and loop), with 4 rows at a time (and more padding) below 64.
  auto cost = [&](int64_t nv) { return double((M + 8 * nv - 1) / (8 * nv)) * (double(nv) + 2.5); };
  if (M <= 16) return panels_w<2, 4>(x, M, K, values, vt, meta, scales, bias, act, y, N);
  if (M < 48) return panels_w<3, 4>(x, M, K, values, vt, meta, scales, bias, act, y, N);
  if (cost(8) <= cost(12)) return panels_w<8, 1>(x, M, K, values, vt, meta, scales, bias, act, y, N);
  return panels_w<12, 1>(x, M, K, values, vt, meta, scales, bias, act, y, N);
}

}  // namespace

void linear_f32(const float* x, int64_t M, int64_t K, const void* values, DType vt, const uint8_t* meta, const float* scales,
                const float* bias, Act act, float* y, int64_t N) {
  if (M == 0 || N == 0) return;
  if (M > kSmallM) return panels(x, M, K, values, vt, meta, scales, bias, act, y, N);
  switch (vt) {
    case DType::f32: return small_m(x, M, K, static_cast<const float*>(values), meta, scales, bias, act, y, N);
    case DType::bf16: return small_m(x, M, K, static_cast<const bf16*>(values), meta, scales, bias, act, y, N);
    case DType::i8: return small_m(x, M, K, static_cast<const int8_t*>(values), meta, scales, bias, act, y, N);
    default: return panels(x, M, K, values, vt, meta, scales, bias, act, y, N);
  }
}

void linear_f64(const double* x, int64_t M, int64_t K, const double* values, const uint8_t* meta, const float* scales,
                const double* bias, Act act, double* y, int64_t N) {
  const int64_t K2 = K / 2, K8 = K / 8;
  parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t m = 0; m < M; ++m) {
        double s = 0;
        for (int64_t b = 0; b < K8; ++b) {
          int off[4];
          byte_offsets(meta[n * K8 + b], off);
          for (int t = 0; t < 4; ++t) s += values[n * K2 + 4 * b + t] * x[m * K + 8 * b + off[t]];
        }
        y[m * N + n] = activate(s * double(scales[n]) + (bias ? bias[n] : 0.0), act);
      }
  });
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
          row[8 * b + off[t]] = v * T(scales[n]);
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

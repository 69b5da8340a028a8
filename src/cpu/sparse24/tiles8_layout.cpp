// The 8-row tile layout of prepacked 2:4 weights (kernels.h, kernel_common.h): its size, packing
// and unpacking, every build's; and, without AVX2, its portable reading for a weight held
// prepacked alone (the AVX2 kernels read it in tiles8.cpp).
#include "cpu/sparse24/kernel_common.h"

namespace sinter::sparse {
namespace {

template <class V> void prepack_as(const V* values, const uint8_t* meta, int64_t N, int64_t K, uint8_t* out) {
  const int64_t K2 = K / 2, K8 = K / 8;
  each_block8<V>(N, K, [&](int64_t n0, int64_t q, int64_t at) {
    uint8_t* blk = out + at;
    std::memset(blk, 0, size_t(kBlockBytes<V>));  // rows past N, columns past K: zero values, meta 0
    V* vals = reinterpret_cast<V*>(blk + 32);
    for (int64_t r = 0; r < 8 && n0 + r < N; ++r) {
      const int64_t n = n0 + r;
      std::memcpy(blk + 4 * r, meta + n * K8 + 4 * q, size_t(std::min<int64_t>(4, K8 - 4 * q)));
      for (int64_t j = 0; j < 16 && 16 * q + j < K2; ++j) vals[8 * j + r] = values[n * K2 + 16 * q + j];
    }
  });
}

}  // namespace

int64_t tiles8_bytes(DType vt, int64_t N, int64_t K) {
  return with_value_type(vt, "prepack", [&](auto v) { return (N + 7) / 8 * ((K + 31) / 32) * kBlockBytes<decltype(v)>; });
}

void tiles8_prepack(const void* values, DType vt, const uint8_t* meta, int64_t N, int64_t K, uint8_t* out) {
  with_value_type(vt, "prepack", [&](auto v) { prepack_as(static_cast<const decltype(v)*>(values), meta, N, K, out); });
}

void tiles8_unpack(const uint8_t* packed, DType vt, int64_t N, int64_t K, void* values, uint8_t* meta) {
  with_value_type(vt, "unpack", [&](auto v) {
    using V = decltype(v);
    const int64_t K2 = K / 2, K8 = K / 8;
    V* out = static_cast<V*>(values);
    each_block8<V>(N, K, [&](int64_t n0, int64_t q, int64_t at) {
      const uint8_t* blk = packed + at;
      const V* vals = reinterpret_cast<const V*>(blk + 32);
      for (int64_t r = 0; r < 8 && n0 + r < N; ++r) {  // a row's meta bytes as they are, its kept values interleaved
        const int64_t n = n0 + r;
        std::memcpy(meta + n * K8 + 4 * q, blk + 4 * r, size_t(std::min<int64_t>(4, K8 - 4 * q)));
        for (int64_t j = 0; j < 16 && 16 * q + j < K2; ++j) out[n * K2 + 16 * q + j] = vals[8 * j + r];
      }
    });
  });
}

const PackFormat& tiles8_format() {
  // Zen 3, 2 threads, the three `sinter bench sparse` shapes, against the values + meta kernels of
  // the same call: M = 2 0.97-1.17x, M = 4-32 1.05-1.85x, M = 33-40 0.94-1.28x, K-major ahead from
  // 48; at M = 1 int8 values 1.03-1.33x, f32 0.78-0.90x, bf16 0.88-0.95x. Without AVX2 no call
  // reads it but a weight held only prepacked.
  static const PackFormat f{kPack8Rows, "8-row tiles (AVX2)", kAvx2 ? 40 : 0, tiles8_bytes, tiles8_prepack, tiles8_unpack};
  return f;
}

#if !defined(__AVX2__)
namespace {

template <class V>
void prepacked_rows(const float* x, int64_t M, int64_t K, const uint8_t* packed, const float* scales, const float* bias, Act act,
                    float* y, int64_t N) {
  const int64_t Q = (K + 31) / 32;
  parallel_for(0, N, 8, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t m = 0; m < M; ++m) {
        float s = 0;
        const int64_t ch = n / (8 * kTilesRowGroups), b = n % (8 * kTilesRowGroups) / 8, r = n % 8;
        for (int64_t q = 0; q < Q; ++q) {
          const int64_t q0 = q / kTilesQb * kTilesQb;
          const uint8_t* blk = packed + prepacked_at<V>(N, K, ch, b, q0) + (q - q0) * kBlockBytes<V>;
          uint32_t word;
          std::memcpy(&word, blk + 4 * r, 4);
          const V* vals = reinterpret_cast<const V*>(blk + 32);
          for (int64_t g = 0; g < 8 && 32 * q + 4 * g < K; ++g) {
            const float* xg = x + m * K + 32 * q + 4 * g;
            const uint32_t nib = (word >> (4 * g)) & 15;
            s += float(vals[8 * (2 * g) + r]) * xg[nib & 3] + float(vals[8 * (2 * g + 1) + r]) * xg[nib >> 2];
          }
        }
        y[m * N + n] = activate(s * scales[n] + (bias ? bias[n] : 0.0f), act);
      }
  });
}

void run_prepacked(const Args& a) {
  if (a.M == 0 || a.N == 0) return;
  with_value_type(a.vt, "sparse24_linear", [&](auto v) {
    prepacked_rows<decltype(v)>(a.x, a.M, a.K, a.packed, a.scales, a.bias, a.act, a.y, a.N);
  });
}

const KernelDef kPortable[] = {
    {Kernel::prepacked8, kOrderPrepacked + 1, [](const Call& c) { return c.packed_only; }, run_prepacked, false, true},
};

}  // namespace

std::span<const KernelDef> tiles8_portable_kernels() { return kPortable; }

#else
std::span<const KernelDef> tiles8_portable_kernels() { return {}; }
#endif

}  // namespace sinter::sparse

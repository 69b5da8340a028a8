// The streaming 2:4 kernel's inner pass without AVX2 (streaming.h): GCC vector types, x's kept
// columns gathered through a table of shuffles. Without AVX2 it serves every M.
#include "cpu/sparse24/streaming.h"

namespace sinter::sparse {

#if !defined(__AVX2__)
namespace {

// Decode: y[m, n] for M <= 4 rows of x, weight rows [n0, n1). Each weight row is read once, in
// order, 8 kept values (16 columns) per step; rows are prefetched a few steps ahead.
template <int M, class V>
void small_m_rows(const float* x, int64_t K, const V* values, const uint8_t* meta, int64_t n0, int64_t n1, float* dots) {
  const PermuteTable& pt = permute_table();
  const int64_t chunks = K / 16, K2 = K / 2, K8 = K / 8;
  for (int64_t n = n0; n < n1; ++n) {
    const V* w = values + n * K2;
    const uint8_t* mt = meta + n * K8;
    __builtin_prefetch(mt + 4 * K8, 0, kPfLocality);  // meta: a line per row, four rows ahead
    v8f acc0[M], acc1[M];  // two chains per row of x: the FMA latency is hidden
    for (int m = 0; m < M; ++m) acc0[m] = v8f{}, acc1[m] = v8f{};
    auto idx_of = [&](int64_t c) {
      v8i i0, i1;
      std::memcpy(&i0, pt.idx[mt[2 * c]], 32);
      std::memcpy(&i1, pt.idx[mt[2 * c + 1]], 32);
      return __builtin_shufflevector(i0, i1, 0, 1, 2, 3, 12, 13, 14, 15);
    };
    int64_t c = 0;
    for (; c + 2 <= chunks; c += 2) {
      __builtin_prefetch(reinterpret_cast<const char*>(w + 8 * c) + kPf, 0, kPfLocality);  // values: kPf bytes ahead
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

struct TableRows {
  static constexpr bool rearranged = false;
  template <class V>
  static void run(int rows, const float* xm, const float*, int64_t K, const V* values, const uint8_t* meta, int64_t n0, int64_t n1,
                  float* dots) {
    switch (rows) {
      case 1: return small_m_rows<1>(xm, K, values, meta, n0, n1, dots);
      case 2: return small_m_rows<2>(xm, K, values, meta, n0, n1, dots);
      case 3: return small_m_rows<3>(xm, K, values, meta, n0, n1, dots);
      default: return small_m_rows<4>(xm, K, values, meta, n0, n1, dots);
    }
  }
};

const KernelDef kStreaming[] = {
    {Kernel::streaming, kOrderStreaming, [](const Call& c) { return c.has_values(); }, run<TableRows>},
};

}  // namespace

std::span<const KernelDef> streaming_kernels() { return kStreaming; }

#endif

}  // namespace sinter::sparse

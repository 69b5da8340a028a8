// The 2:4 tile kernels for AVX-512 (tiles16.h): vectors run over 16 weight rows, and for each 16
// columns of a row of x one vpermps per kept value gives every lane (weight row) its kept column
// of x. Zen 5, where a zmm FMA runs at the rate of a ymm one (2 threads, 4096 x 11008, prepacked,
// alternating in one process): M = 16 3.2 ms against 5.3 for the AVX2 8-row tiles, M = 32 5.7
// against 10.0, M = 64 12.0 against 14.4 for the K-major kernel. Selection by vpermps over 16
// columns feeds 8 FMAs per load of x; x is packed per tile of rows (8 rows read in place are 16 KiB
// apart at K = 4096, one set of L1); a prepacked weight is requested 8 KiB ahead.
#include "cpu/sparse24/kernels.h"

#if defined(SINTER_TILES16)
#include "cpu/sparse24/tiles16.h"

namespace sinter::sparse {

int64_t tiles16_bytes(DType vt, int64_t N, int64_t K) {
  return with_value_type(vt, "prepack", [&](auto v) { return (N + 15) / 16 * blocks_of(K) * kBytes<decltype(v)>; });
}

void tiles16_prepack(const void* values, DType vt, const uint8_t* meta, int64_t N, int64_t K, uint8_t* out) {
  with_value_type(vt, "prepack", [&](auto v) {
    using V = decltype(v);
    const int64_t NB = blocks_of(K), G = (N + 15) / 16;
    parallel_for(0, G, 4, [&](int64_t g0, int64_t g1) {
      for (int64_t g = g0; g < g1; ++g)
        for (int64_t b0 = 0; b0 < NB; b0 += kSpanBlocks)
          pack_group_as<V, V>(values, meta, N, K, 16 * g, b0, std::min(NB, b0 + kSpanBlocks), out + prepacked_at<V>(G, NB, g, b0));
    });
  });
}

void tiles16_unpack(const uint8_t* packed, DType vt, int64_t N, int64_t K, void* values, uint8_t* meta) {
  with_value_type(vt, "unpack", [&](auto v) {
    using V = decltype(v);
    const int64_t NB = blocks_of(K), G = (N + 15) / 16, K2 = K / 2, K8 = K / 8;
    V* out = static_cast<V*>(values);
    parallel_for(0, G, 4, [&](int64_t g0, int64_t g1) {
      for (int64_t g = g0; g < g1; ++g)
        for (int64_t b0 = 0; b0 < NB; b0 += kSpanBlocks) {
          const uint8_t* blk = packed + prepacked_at<V>(G, NB, g, b0);
          for (int64_t b = b0; b < std::min(NB, b0 + kSpanBlocks); ++b, blk += kBytes<V>) {
            const V* vals = reinterpret_cast<const V*>(blk + 64);
            for (int r = 0; r < 16 && 16 * g + r < N; ++r) {
              const int64_t n = 16 * g + r;
              uint32_t word;
              std::memcpy(&word, blk + 4 * r, 4);
              for (int j = 0; j < 8 && 8 * b + j < K2; ++j) {  // kept value j: its column in the block, less its group's first
                const uint32_t off = ((word >> (4 * j)) & 15) - 4 * (j / 2);
                uint8_t& byte = meta[n * K8 + 2 * b + j / 4];
                if (j % 4 == 0) byte = 0;
                byte = uint8_t(byte | off << (4 * ((j / 2) % 2) + 2 * (j % 2)));
                out[n * K2 + 8 * b + j] = vals[slot<V>(j, r)];
              }
            }
          }
        }
    });
  });
}

namespace {

void run_tiles(const Args& a) {
  if (a.M == 0 || a.N == 0) return;
  with_value_type(a.vt, "sparse24_linear", [&](auto v) {
    using V = decltype(v);
    linear_as<float, V>(a.x, a.M, a.K, static_cast<const V*>(a.values), a.meta, a.packed, a.scales, a.bias, a.act, a.y, a.N);
  });
}

// Zen 5, 2 threads, 4096 x 11008 (`sinter bench sparse`, the 2:4 rows): the 16-row tiles from
// values + meta against the K-major kernel at M = 8 / 16 / 32 / 64 / 96: 4.4 / 5.8 / 8.0 /
// 13.9-14.9 / 19.6 against 10.2 / 10.4 / 11.0 / 15.2-16.8 / 19.8 ms; even at M = 128.
constexpr int64_t kKMajorM = 96;

const KernelDef kTiles16[] = {
    {Kernel::prepacked16, kOrderPrepacked + 1,
     [](const Call& c) { return c.packed_only || (c.prepacked && prepacked_serves(c.values, c.M)); }, run_tiles, false, true},
    {Kernel::tiles16, kOrderTiles, [](const Call& c) { return c.has_values() && c.M > kSmallM && c.M < kKMajorM; }, run_tiles},
};

}  // namespace

std::span<const KernelDef> tiles16_kernels() { return kTiles16; }

// Blocks of 16 weight rows x 16 columns: 16 u32 index words (row r's block column of kept value j
// in bits 4j..4j+3), then 8 kept values per row (value j of row r at 16 j + r; bf16 as vdpbf16ps's
// pairs); chunks of 8 groups of 16 rows, then spans of 64 blocks, group, block. Padded to 16 rows
// and columns: 6% more bytes than values + meta for f32 values, 11% bf16, 20% int8. Its readers
// beat values + meta up to M = 128 (Zen 5, 4096 x 11008, f32: M = 16 3.16 against 5.8 ms).
const PackFormat* tiles16_format() {
  static const PackFormat f{kPack16Rows, "16-row tiles (AVX-512)", 128, tiles16_bytes, tiles16_prepack, tiles16_unpack};
  return &f;
}

}  // namespace sinter::sparse

#else
namespace sinter::sparse {
std::span<const KernelDef> tiles16_kernels() { return {}; }
const PackFormat* tiles16_format() { return nullptr; }
}  // namespace sinter::sparse
#endif

// The bf16 FlashAttention-2 forward on the tensor cores (flash.h: flash_forward_tc). A block of
// four warps takes 64 query rows, each warp 16, against tiles of 64 keys; q, k and v tiles stay
// bf16 in shared memory (rows padded by 8 against bank conflicts). S = Q K^T and O += P V are
// m16n8k16 products (mma.cuh) accumulating in f32; the scores' fragments are masked, exponentiated
// (exp2 on the SFU, the dropout op's Philox draws) and rounded to bf16 in registers, where they are
// already P's A fragments. The online softmax keeps each row's max and sum in f32, as flash.cu does.
#include "cuda/flash_common.cuh"
#include "cuda/mma.cuh"

namespace sinter::cuda {
namespace {

using detail::Geometry;
using detail::RowLayout;
using namespace flash;

constexpr int kWarps = 4, kRows = 16 * kWarps, kKeys = 64, kPad = 8, kThreads = 32 * kWarps;

template <int D> constexpr int kLd = D + kPad;  // a tile row's stride in bf16 elements

template <int D>
__device__ void load_rows(uint16_t* dst, const BF16* base, const RowLayout& l, int64_t b, int64_t h, int64_t r0, int64_t valid, int n) {
  load_bf16_rows<D, kLd<D>, kThreads>(dst, base, l, b, h, r0, valid, n);
}

size_t tc_smem(int64_t D) { return sizeof(uint16_t) * size_t((kRows + 2 * kKeys) * (D + kPad)); }

// One query row's online softmax state (this lane's two rows: g and g + 8 of the warp's 16); m in
// log2 units.
struct RowState {
  int64_t i, first, limit;
  float m = -INFINITY, l = 0.0f;
};

// The scores of this lane's row g + 8 half against a tile to P, in place, and the online softmax's
// update of the row; returns the factor of the row's accumulator. Scores go to log2 units so that
// exp is the SFU's exp2 (P is rounded to bf16 after it); a tile whose every key the row sees,
// without a mask or dropout, skips the per-element checks.
__device__ float online_softmax(const Call& c, int64_t b, int64_t h, int64_t j0, RowState& st, float (&s)[kKeys / 8][4], int half) {
  const Geometry& g = c.g;
  const int t = int(threadIdx.x) % 4;
  const bool plain = !c.x.mask && g.dropout <= 0 && j0 >= st.first && j0 + kKeys <= st.limit;
  const float scale = float(g.scale) * kLog2e;
  float tile_max = -INFINITY;
  SINTER_UNROLL
  for (int nt = 0; nt < kKeys / 8; ++nt)
    SINTER_UNROLL
    for (int e = 0; e < 2; ++e) {
      const int64_t j = j0 + nt * 8 + 2 * t + e;
      float& x = s[nt][2 * half + e];
      if (plain) x *= scale;
      else x = j >= st.first && j < st.limit ? x * scale + mask_at(c, b, h, st.i, j) * kLog2e : -INFINITY;
      tile_max = fmaxf(tile_max, x);
    }
  for (int o2 = 1; o2 < 4; o2 <<= 1) tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, o2));
  const float m_new = fmaxf(st.m, tile_max);
  const float alpha = m_new == -INFINITY ? 1.0f : exp2f(st.m - m_new);  // exp2(-inf) = 0 on a first visible tile
  float sum = 0.0f;
  SINTER_UNROLL
  for (int nt = 0; nt < kKeys / 8; ++nt)
    SINTER_UNROLL
    for (int e = 0; e < 2; ++e) {
      float& x = s[nt][2 * half + e];
      const float p = m_new == -INFINITY ? 0.0f : exp2f(x - m_new);
      sum += p;
      x = plain || p == 0.0f ? p : p * dropout_keep(g, b, h, st.i, j0 + nt * 8 + 2 * t + e);
    }
  for (int o2 = 1; o2 < 4; o2 <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o2);
  st.l = st.l * alpha + sum;
  st.m = m_new;
  return alpha;
}

template <int D>
__global__ void __launch_bounds__(kThreads) flash_tc_forward_k(Call c, const BF16* q, const BF16* k, const BF16* v, BF16* o, float* lse) {
  uint16_t* sq = dynamic_shared<uint16_t>();
  uint16_t *sk = sq + kRows * kLd<D>, *sv = sk + kKeys * kLd<D>;
  const Geometry& g = c.g;
  const int64_t bh = blockIdx.x, b = bh / g.Hq, h = bh % g.Hq, hk = h / (g.Hq / g.Hkv), n = c.kv_len();
  const int64_t i0 = int64_t(blockIdx.y) * kRows;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, gr = lane / 4, t = lane % 4;
  load_rows<D>(sq, q, g.lq, b, h, i0, g.Lq, kRows);
  RowState rs[2];
  for (int half = 0; half < 2; ++half) {
    RowState& s = rs[half];
    s.i = i0 + warp * 16 + gr + 8 * half;
    s.first = s.i < g.Lq ? key_first(g, n, s.i) : 0, s.limit = s.i < g.Lq ? key_limit(g, n, s.i) : 0;
  }
  float acc[D / 8][4] = {};
  const int64_t last_row = (i0 + kRows < g.Lq ? i0 + kRows : g.Lq) - 1;
  const int64_t j_begin = key_first(g, n, i0), j_end = key_limit(g, n, last_row);
  const uint16_t* qw = sq + warp * 16 * kLd<D>;
  for (int64_t j0 = j_begin; j0 < j_end; j0 += kKeys) {
    __syncthreads();  // the previous tile's k and v are read (and, first, q is written)
    load_rows<D>(sk, k, g.lk, b, hk, j0, n, kKeys);
    load_rows<D>(sv, v, g.lv, b, hk, j0, n, kKeys);
    __syncthreads();
    float s[kKeys / 8][4] = {};
    SINTER_UNROLL
    for (int kk = 0; kk < D / 16; ++kk) {  // S = Q K^T over 16 of the head dim at a time
      uint32_t a[4];
      load_a(a, qw, kLd<D>, kk * 16);
      SINTER_UNROLL
      for (int nt = 0; nt < kKeys / 8; nt += 2) {
        uint32_t bb[2][2];
        load_b_nk(bb, sk, kLd<D>, nt * 8, kk * 16);
        mma_bf16_16816(s[nt], a, bb[0]);
        mma_bf16_16816(s[nt + 1], a, bb[1]);
      }
    }
    float alpha[2];
    SINTER_UNROLL
    for (int half = 0; half < 2; ++half) alpha[half] = online_softmax(c, b, h, j0, rs[half], s, half);
    SINTER_UNROLL
    for (int nd = 0; nd < D / 8; ++nd)
      SINTER_UNROLL
      for (int r = 0; r < 4; ++r) acc[nd][r] *= alpha[r / 2];
    SINTER_UNROLL
    for (int kt = 0; kt < kKeys / 16; ++kt) {  // O += P V over 16 keys at a time; S's C fragments are P's A fragments
      uint32_t a[4];
      a_from_c(a, s[2 * kt], s[2 * kt + 1]);
      SINTER_UNROLL
      for (int nd = 0; nd < D / 8; nd += 2) {
        uint32_t bb[2][2];
        load_b_kn(bb, sv, kLd<D>, kt * 16, nd * 8);
        mma_bf16_16816(acc[nd], a, bb[0]);
        mma_bf16_16816(acc[nd + 1], a, bb[1]);
      }
    }
  }
  for (int half = 0; half < 2; ++half) {
    const RowState& st = rs[half];
    if (st.i >= g.Lq) continue;
    const float inv = st.l > 0.0f ? 1.0f / st.l : 0.0f;
    BF16* orow = row(g.lo, o, b, h, st.i);
    SINTER_UNROLL
    for (int nd = 0; nd < D / 8; ++nd)
      for (int e = 0; e < 2; ++e) store(orow + nd * 8 + 2 * t + e, acc[nd][2 * half + e] * inv);
    if (t == 0) lse[(b * g.Hq + h) * g.Lq + st.i] = st.l > 0.0f ? st.m * kLn2 + ::logf(st.l) : -INFINITY;
  }
}

template <int D> void launch_tc(const Geometry& g, const void* q, const void* k, const void* v, FlashExtras x, void* o, float* lse,
                                int device) {
  const size_t smem = tc_smem(D);
  allow_smem(flash_tc_forward_k<D>, smem);
  const dim3 grid(unsigned(g.B * g.Hq), unsigned((g.Lq + kRows - 1) / kRows));
  launch_kernel("sdpa", flash_tc_forward_k<D>, grid, kThreads, smem, stream(device), Call{g, x}, static_cast<const BF16*>(q),
                static_cast<const BF16*>(k), static_cast<const BF16*>(v), static_cast<BF16*>(o), lse);
}

}  // namespace

bool flash_tc_backward_takes(const Geometry& g, DType dtype) {
  return dtype == DType::bf16 && g.D == g.Dv && (g.D == 64 || g.D == 80 || g.D == 96 || g.D == 128);
}

bool flash_tc_takes(const Geometry& g, DType dtype) { return flash_tc_backward_takes(g, dtype) && g.Lq > 1; }

void flash_forward_tc(const Geometry& g, const void* q, const void* k, const void* v, FlashExtras x, void* o, float* lse, int device) {
  switch (g.D) {
    case 64: return launch_tc<64>(g, q, k, v, x, o, lse, device);
    case 80: return launch_tc<80>(g, q, k, v, x, o, lse, device);
    case 96: return launch_tc<96>(g, q, k, v, x, o, lse, device);
    case 128: return launch_tc<128>(g, q, k, v, x, o, lse, device);
    default: SINTER_THROW(ShapeError, "[sdpa] the tensor-core flash kernel takes head dims 64, 80, 96 and 128, got ", g.D);
  }
}

}  // namespace sinter::cuda

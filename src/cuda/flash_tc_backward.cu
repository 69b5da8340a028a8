// The bf16 FlashAttention-2 backward on the tensor cores (flash.h: flash_backward_tc). A block of
// four warps owns 64 keys, each warp 16, and accumulates their dK and dV in registers over every
// query tile of 32 rows that can see them (all query heads of the GQA group). Per tile each warp
// computes S^T = K Q^T and dP^T = V dO^T as m16n8k16 products (mma.cuh), turns them into P^T and
// dS^T in registers (the forward's log-sum-exp, exp2 on the SFU, the Philox draws), and rounds
// them to bf16 as the A fragments of dV += P^T dO and dK += dS^T Q. dS also goes to shared memory,
// where the four warps read it back untransposed for dQ += dS K, added to the f32 dQ by atomics.
#include "cuda/flash_common.cuh"
#include "cuda/mma.cuh"

namespace sinter::cuda {
namespace {

using detail::Geometry;
using namespace flash;

constexpr int kWarps = 4, kKeys = 16 * kWarps, kQ = 32, kPad = 8, kThreads = 32 * kWarps;
constexpr int kLdS = kKeys + kPad;  // a dS tile row's stride (queries by keys)

template <int D> constexpr int kLd = D + kPad;  // a q, k, v or dO tile row's stride in bf16 elements

// lse and delta of the query tile (f32), then k, v (kKeys rows), q, dO (kQ rows) and dS, bf16.
size_t tc_backward_smem(int64_t D) {
  return sizeof(float) * 2 * kQ + sizeof(uint16_t) * size_t((2 * kKeys + 2 * kQ) * (D + kPad) + kQ * kLdS);
}

template <int D>
__device__ void load_rows(uint16_t* dst, const BF16* base, const RowLayout& l, int64_t b, int64_t h, int64_t r0, int64_t valid, int n) {
  load_bf16_rows<D, kLd<D>, kThreads>(dst, base, l, b, h, r0, valid, n);
}

struct Tile {  // the query tile in shared memory (lse in log2 units)
  const uint16_t *q, *dout;
  uint16_t* ds;
  const float *lse, *delta;
};

// P^T and dS^T of this warp's 16 keys against the tile's kQ queries, from S^T and dP^T in place
// (flash.cu's backward: P = exp(S scale + mask - lse) z, dS = exp(...) (dP z - delta) scale, here
// as exp2 of log2 units with the tile's lse so scaled); dS also to the tile's shared dS (queries
// by keys). A tile whose every query sees every key of the warp, without a mask or dropout, skips
// the per-element checks.
__device__ void probabilities(const Call& c, int64_t n, int64_t b, int64_t h, int64_t i0, int64_t j_w, float (&s)[kQ / 8][4],
                              float (&dp)[kQ / 8][4], const Tile& tl, int key_col) {
  const Geometry& g = c.g;
  const int lane = int(threadIdx.x) % 32, gr = lane / 4, t = lane % 4;
  const bool plain = !c.x.mask && g.dropout <= 0 && i0 + kQ <= g.Lq && j_w + 16 <= n && key_limit(g, n, i0) >= j_w + 16 &&
                     key_first(g, n, i0 + kQ - 1) <= j_w;
  const float scale = float(g.scale), scale2 = scale * kLog2e;
  SINTER_UNROLL
  for (int nt = 0; nt < kQ / 8; ++nt)
    SINTER_UNROLL
    for (int r = 0; r < 4; ++r) {
      const int rr = nt * 8 + 2 * t + r % 2, kr = gr + 8 * (r / 2);
      const int64_t i = i0 + rr, j = j_w + kr;
      const float lse_i = tl.lse[rr];
      float p = 0.0f, ds = 0.0f;
      if (plain) {
        p = exp2f(s[nt][r] * scale2 - lse_i);
        ds = p * (dp[nt][r] - tl.delta[rr]) * scale;
      } else if (i < g.Lq && j < n && j >= key_first(g, n, i) && j < key_limit(g, n, i) && isfinite(lse_i)) {
        const float pc = exp2f(s[nt][r] * scale2 + mask_at(c, b, h, i, j) * kLog2e - lse_i), z = dropout_keep(g, b, h, i, j);
        p = pc * z;
        ds = pc * (dp[nt][r] * z - tl.delta[rr]) * scale;
      }
      s[nt][r] = p, dp[nt][r] = ds;
      tl.ds[rr * kLdS + key_col + kr] = bf16_bits(ds);
    }
}

// dQ += dS K for the tile: warp w takes query rows 16 (w % 2) and the head dim's half w / 2.
template <int D>
__device__ void add_dq(const Tile& tl, const uint16_t* sk, float* dq_rows, int64_t rows_left) {
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, gr = lane / 4, t = lane % 4;
  const int m0 = 16 * (warp % 2), nd0 = (warp / 2) * (D / 16);
  uint32_t a[kKeys / 16][4];
  SINTER_UNROLL
  for (int kt = 0; kt < kKeys / 16; ++kt) load_a(a[kt], tl.ds + m0 * kLdS, kLdS, kt * 16);
  for (int nd = nd0; nd < nd0 + D / 16; ++nd) {
    float acc[4] = {};
    SINTER_UNROLL
    for (int kt = 0; kt < kKeys / 16; kt += 2) {
      uint32_t bb[2][2];
      load_b_kn_2k(bb, sk, kLd<D>, kt * 16, nd * 8);
      mma_bf16_16816(acc, a[kt], bb[0]);
      mma_bf16_16816(acc, a[kt + 1], bb[1]);
    }
    SINTER_UNROLL
    for (int r = 0; r < 4; ++r) {
      const int rr = m0 + gr + 8 * (r / 2);
      if (rr < rows_left && acc[r] != 0.0f) atomicAdd(dq_rows + int64_t(rr) * D + nd * 8 + 2 * t + r % 2, acc[r]);
    }
  }
}

// S^T = K Q^T and dP^T = V dO^T of this warp's 16 keys (rows of kw and vw) against the tile's kQ
// queries, over 16 of the head dim at a time.
template <int D>
__device__ void transposed_scores(const uint16_t* kw, const uint16_t* vw, const Tile& tl, float (&s)[kQ / 8][4],
                                  float (&dp)[kQ / 8][4]) {
  SINTER_UNROLL
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t ak[4], av[4];
    load_a(ak, kw, kLd<D>, kk * 16);
    load_a(av, vw, kLd<D>, kk * 16);
    SINTER_UNROLL
    for (int nt = 0; nt < kQ / 8; nt += 2) {
      uint32_t bq[2][2], bd[2][2];
      load_b_nk(bq, tl.q, kLd<D>, nt * 8, kk * 16);
      load_b_nk(bd, tl.dout, kLd<D>, nt * 8, kk * 16);
      SINTER_UNROLL
      for (int e = 0; e < 2; ++e) mma_bf16_16816(s[nt + e], ak, bq[e]), mma_bf16_16816(dp[nt + e], av, bd[e]);
    }
  }
}

// dV += P^T dO and dK += dS^T Q for this warp's keys, over 16 of the tile's queries at a time.
template <int D>
__device__ void add_dk_dv(const float (&p)[kQ / 8][4], const float (&ds)[kQ / 8][4], const Tile& tl, float (&dk)[D / 8][4],
                          float (&dv)[D / 8][4]) {
  SINTER_UNROLL
  for (int kt = 0; kt < kQ / 16; ++kt) {
    uint32_t ap[4], ads[4];
    a_from_c(ap, p[2 * kt], p[2 * kt + 1]);
    a_from_c(ads, ds[2 * kt], ds[2 * kt + 1]);
    SINTER_UNROLL
    for (int nd = 0; nd < D / 8; nd += 2) {
      uint32_t bd[2][2], bq[2][2];
      load_b_kn(bd, tl.dout, kLd<D>, kt * 16, nd * 8);
      load_b_kn(bq, tl.q, kLd<D>, kt * 16, nd * 8);
      SINTER_UNROLL
      for (int e = 0; e < 2; ++e) mma_bf16_16816(dv[nd + e], ap, bd[e]), mma_bf16_16816(dk[nd + e], ads, bq[e]);
    }
  }
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    flash_tc_backward_k(Call c, const BF16* q, const BF16* k, const BF16* v, const BF16* dout, BackwardPtrs bp, BF16* dk, BF16* dv) {
  float* slse = dynamic_shared<float>();
  float* sdelta = slse + kQ;
  uint16_t* sk = reinterpret_cast<uint16_t*>(sdelta + kQ);
  uint16_t *sv = sk + kKeys * kLd<D>, *sq = sv + kKeys * kLd<D>, *sdo = sq + kQ * kLd<D>, *sds = sdo + kQ * kLd<D>;
  const Geometry& g = c.g;
  const int64_t bk = blockIdx.x, b = bk / g.Hkv, hk = bk % g.Hkv, group = g.Hq / g.Hkv;
  const int64_t j0 = int64_t(blockIdx.y) * kKeys, n = c.kv_len();
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, gr = lane / 4, t = lane % 4;
  load_rows<D>(sk, k, g.lk, b, hk, j0, n, kKeys);
  load_rows<D>(sv, v, g.lv, b, hk, j0, n, kKeys);
  float dk_acc[D / 8][4] = {}, dv_acc[D / 8][4] = {};
  // Query rows that can see a key of the tile: causal rows i >= j0 - off; windowed rows i <= j_last - off - 1 + window.
  const int64_t off = n - g.Lq, j_last = (j0 + kKeys < n ? j0 + kKeys : n) - 1;
  const int64_t i_begin = g.causal ? clamp64(j0 - off, 0, g.Lq) : 0;
  const int64_t i_end = g.window > 0 ? clamp64(j_last - off + g.window, 0, g.Lq) : g.Lq;
  const uint16_t *kw = sk + warp * 16 * kLd<D>, *vw = sv + warp * 16 * kLd<D>;
  const Tile tl{sq, sdo, sds, slse, sdelta};
  for (int64_t h = hk * group; h < (hk + 1) * group && j0 < n; ++h) {
    const int64_t row0 = (b * g.Hq + h) * g.Lq;
    for (int64_t i0 = i_begin - i_begin % kQ; i0 < i_end; i0 += kQ) {
      __syncthreads();  // the previous query tile and its dS are read
      load_rows<D>(sq, q, g.lq, b, h, i0, g.Lq, kQ);
      load_rows<D>(sdo, dout, g.ldo, b, h, i0, g.Lq, kQ);
      if (threadIdx.x < kQ) {
        const int64_t i = i0 + threadIdx.x;
        slse[threadIdx.x] = i < g.Lq ? bp.lse[row0 + i] * kLog2e : -INFINITY;
        sdelta[threadIdx.x] = i < g.Lq ? bp.delta[row0 + i] : 0.0f;
      }
      __syncthreads();
      float s[kQ / 8][4] = {}, dp[kQ / 8][4] = {};
      transposed_scores<D>(kw, vw, tl, s, dp);
      probabilities(c, n, b, h, i0, j0 + warp * 16, s, dp, tl, warp * 16);
      add_dk_dv<D>(s, dp, tl, dk_acc, dv_acc);
      __syncthreads();  // every warp's dS is in shared memory
      add_dq<D>(tl, sk, bp.dq_acc + (row0 + i0) * D, g.Lq - i0);
    }
  }
  SINTER_UNROLL
  for (int half = 0; half < 2; ++half) {  // this lane's keys g and g + 8 of the warp's 16; keys past the cache's length get 0
    const int64_t j = j0 + warp * 16 + gr + 8 * half;
    if (j >= g.Lkv) continue;
    BF16 *dkrow = row(g.ldk, dk, b, hk, j), *dvrow = row(g.ldv, dv, b, hk, j);
    SINTER_UNROLL
    for (int nd = 0; nd < D / 8; ++nd)
      SINTER_UNROLL
      for (int e = 0; e < 2; ++e) {
        store(dkrow + nd * 8 + 2 * t + e, j < n ? dk_acc[nd][2 * half + e] : 0.0f);
        store(dvrow + nd * 8 + 2 * t + e, j < n ? dv_acc[nd][2 * half + e] : 0.0f);
      }
  }
}

template <int D>
void launch_tc_backward(const Geometry& g, const void* q, const void* k, const void* v, const void* dout, BackwardPtrs bp, FlashExtras x,
                        void* dk, void* dv, int device) {
  const size_t smem = tc_backward_smem(D);
  allow_smem(flash_tc_backward_k<D>, smem);
  const dim3 grid(unsigned(g.B * g.Hkv), unsigned((g.Lkv + kKeys - 1) / kKeys));
  launch_kernel("sdpa_flash_backward", flash_tc_backward_k<D>, grid, kThreads, smem, stream(device), Call{g, x},
                static_cast<const BF16*>(q), static_cast<const BF16*>(k), static_cast<const BF16*>(v), static_cast<const BF16*>(dout), bp,
                static_cast<BF16*>(dk), static_cast<BF16*>(dv));
}

}  // namespace

void flash_backward_tc(const Geometry& g, const void* q, const void* k, const void* v, const void* dout, BackwardPtrs bp, FlashExtras x,
                       void* dk, void* dv, int device) {
  switch (g.D) {
    case 64: return launch_tc_backward<64>(g, q, k, v, dout, bp, x, dk, dv, device);
    case 80: return launch_tc_backward<80>(g, q, k, v, dout, bp, x, dk, dv, device);
    case 96: return launch_tc_backward<96>(g, q, k, v, dout, bp, x, dk, dv, device);
    case 128: return launch_tc_backward<128>(g, q, k, v, dout, bp, x, dk, dv, device);
    default: SINTER_THROW(ShapeError, "[sdpa_flash_backward] the tensor-core flash kernel takes head dims 64, 80, 96 and 128, got ", g.D);
  }
}

}  // namespace sinter::cuda

// The CUDA FlashAttention-2 kernels (flash.h). A block of 128 threads takes a tile of kBr query
// rows (forward) or kBc keys (backward); operands are widened to f32 in shared memory (rows padded
// by one float against bank conflicts), four threads share each row. Scores use the CPU flash
// kernels' formulas (scalar_fns.h exp, the dropout op's Philox draws), so both backends agree
// within f32 summation order.
#include "cuda/flash_common.cuh"

namespace sinter::cuda {
namespace {

using detail::Geometry;
using detail::RowLayout;
using namespace flash;

constexpr int kBr = 32, kBc = 32, kThreads = 128, kParts = kThreads / kBr;  // kParts threads per row

// rows [r0, r0 + n) of one (b, h) matrix laid out by l, widened into dst[kBr or kBc][width + 1];
// rows past `valid` are zeros.
template <class S>
__device__ void load_tile(float* dst, const S* base, const RowLayout& l, int64_t b, int64_t h, int64_t r0, int64_t valid, int n,
                          int64_t width) {
  const int64_t stride = width + 1;
  for (int64_t e = threadIdx.x; e < n * width; e += blockDim.x) {
    const int64_t r = e / width, d = e % width;
    dst[r * stride + d] = r0 + r < valid ? float(load(row(l, base, b, h, r0 + r) + d)) : 0.0f;
  }
}

// Shared memory of the forward: q, k, v tiles, p (the tile's probabilities) and the O accumulator.
size_t forward_smem(int64_t D, int64_t Dv) {
  return sizeof(float) * size_t(kBr * (D + 1) + kBc * (D + 1) + kBc * (Dv + 1) + kBr * (kBc + 1) + kBr * (Dv + 1));
}

template <class S> __global__ void __launch_bounds__(kThreads) flash_forward_k(Call c, const S* q, const S* k, const S* v, S* o, float* lse) {
  float* smem = dynamic_shared<float>();
  const Geometry& g = c.g;
  const int64_t D = g.D, Dv = g.Dv, bh = blockIdx.x, b = bh / g.Hq, h = bh % g.Hq, hk = h / (g.Hq / g.Hkv);
  const int64_t i0 = int64_t(blockIdx.y) * kBr, n = c.kv_len();
  float *sq = smem, *sk = sq + kBr * (D + 1), *sv = sk + kBc * (D + 1), *sp = sv + kBc * (Dv + 1), *so = sp + kBr * (kBc + 1);
  const int r = threadIdx.x / kParts, part = threadIdx.x % kParts;
  const int64_t i = i0 + r;
  load_tile(sq, q, g.lq, b, h, i0, g.Lq, kBr, D);
  for (int64_t e = threadIdx.x; e < kBr * Dv; e += blockDim.x) so[(e / Dv) * (Dv + 1) + e % Dv] = 0.0f;
  const int64_t last_row = (i0 + kBr < g.Lq ? i0 + kBr : g.Lq) - 1;
  const int64_t j_begin = key_first(g, n, i0), j_end = key_limit(g, n, last_row);
  const int64_t first = i < g.Lq ? key_first(g, n, i) : 0, limit = i < g.Lq ? key_limit(g, n, i) : 0;
  float m = -INFINITY, l = 0.0f;
  const float scale = float(g.scale);
  for (int64_t j0 = j_begin; j0 < j_end; j0 += kBc) {
    __syncthreads();  // the previous tile's k and v are read
    load_tile(sk, k, g.lk, b, hk, j0, n, kBc, D);
    load_tile(sv, v, g.lv, b, hk, j0, n, kBc, Dv);
    __syncthreads();
    float s[kBc / kParts];
#pragma unroll
    for (int t = 0; t < kBc / kParts; ++t) s[t] = 0.0f;
    for (int64_t d = 0; d < D; ++d) {
      const float qd = sq[r * (D + 1) + d];
#pragma unroll
      for (int t = 0; t < kBc / kParts; ++t) s[t] += qd * sk[(part + kParts * t) * (D + 1) + d];
    }
    float tile_max = -INFINITY;
#pragma unroll
    for (int t = 0; t < kBc / kParts; ++t) {
      const int64_t j = j0 + part + kParts * t;
      s[t] = j >= first && j < limit ? s[t] * scale + mask_at(c, b, h, i, j) : -INFINITY;
      tile_max = fmaxf(tile_max, s[t]);
    }
    for (int o2 = 1; o2 < kParts; o2 <<= 1) tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, o2));
    const float m_new = fmaxf(m, tile_max);
    const float alpha = m_new == -INFINITY ? 1.0f : fn::exp_nonpos_(m - m_new);  // exp(-inf) = 0 on a first visible tile
    float sum = 0.0f;
#pragma unroll
    for (int t = 0; t < kBc / kParts; ++t) {
      const float p = m_new == -INFINITY ? 0.0f : fn::exp_nonpos_(s[t] - m_new);
      sum += p;
      sp[r * (kBc + 1) + part + kParts * t] = p == 0.0f ? 0.0f : p * dropout_keep(g, b, h, i, j0 + part + kParts * t);
    }
    for (int o2 = 1; o2 < kParts; o2 <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o2);
    l = l * alpha + sum;
    m = m_new;
    __syncwarp();  // the row's probabilities, written by its kParts threads of this warp
    for (int64_t d = part; d < Dv; d += kParts) {
      float acc = so[r * (Dv + 1) + d] * alpha;
      for (int cc = 0; cc < kBc; ++cc) acc += sp[r * (kBc + 1) + cc] * sv[cc * (Dv + 1) + d];
      so[r * (Dv + 1) + d] = acc;
    }
  }
  __syncthreads();  // the O accumulator's zeros, where no tile was visible
  if (i >= g.Lq) return;
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  S* orow = row(g.lo, o, b, h, i);
  for (int64_t d = part; d < Dv; d += kParts) store(orow + d, so[r * (Dv + 1) + d] * inv);
  if (part == 0) lse[(b * g.Hq + h) * g.Lq + i] = l > 0.0f ? m + ::logf(l) : -INFINITY;
}

// delta_i = rowsum(dO_i * O_i) - dLSE_i (dLSE_i / dS_ij = P_ij): one warp per row.
template <class S> __global__ void flash_delta_k(Geometry g, const S* o, const S* dout, const float* dlse, float* delta) {
  const int64_t rows = g.B * g.Hq * g.Lq;
  const int64_t rw = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (rw >= rows) return;
  const int64_t i = rw % g.Lq, bh = rw / g.Lq, b = bh / g.Hq, h = bh % g.Hq;
  const S *orow = row(g.lo, o, b, h, i), *drow = row(g.ldo, dout, b, h, i);
  float s = 0.0f;
  for (int64_t d = threadIdx.x % 32; d < g.Dv; d += 32) s += float(load(orow + d)) * float(load(drow + d));
  for (int o2 = 16; o2 > 0; o2 >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o2);
  if (threadIdx.x % 32 == 0) delta[rw] = s - dlse[rw];
}

// Shared memory of the backward: k, v, dk, dv of the key tile; q, dO, p, dS of a query tile; lse and delta.
size_t backward_smem(int64_t D, int64_t Dv) {
  return sizeof(float) * size_t(2 * kBc * (D + 1) + 2 * kBc * (Dv + 1) + kBr * (D + 1) + kBr * (Dv + 1) + 2 * kBr * (kBc + 1) + 2 * kBr);
}

template <class S>
__global__ void __launch_bounds__(kThreads)
    flash_backward_k(Call c, const S* q, const S* k, const S* v, const S* dout, BackwardPtrs bp, S* dk, S* dv) {
  float* smem = dynamic_shared<float>();
  const Geometry& g = c.g;
  const int64_t D = g.D, Dv = g.Dv, bk = blockIdx.x, b = bk / g.Hkv, hk = bk % g.Hkv, group = g.Hq / g.Hkv;
  const int64_t j0 = int64_t(blockIdx.y) * kBc, n = c.kv_len();
  if (j0 >= g.Lkv) return;
  float *sk = smem, *sv = sk + kBc * (D + 1), *sdk = sv + kBc * (Dv + 1), *sdv = sdk + kBc * (D + 1), *sq = sdv + kBc * (Dv + 1);
  float *sdo = sq + kBr * (D + 1), *sp = sdo + kBr * (Dv + 1), *sds = sp + kBr * (kBc + 1), *slse = sds + kBr * (kBc + 1);
  float* sdelta = slse + kBr;
  load_tile(sk, k, g.lk, b, hk, j0, n, kBc, D);
  load_tile(sv, v, g.lv, b, hk, j0, n, kBc, Dv);
  for (int64_t e = threadIdx.x; e < kBc * (D + 1); e += blockDim.x) sdk[e] = 0.0f;
  for (int64_t e = threadIdx.x; e < kBc * (Dv + 1); e += blockDim.x) sdv[e] = 0.0f;
  const int cc = threadIdx.x / kParts, part = threadIdx.x % kParts;  // phases 1-2: key column cc
  const int64_t j = j0 + cc, off = n - g.Lq;
  const int64_t j_last = (j0 + kBc < n ? j0 + kBc : n) - 1;
  // Query rows that can see a key of the tile: causal rows i >= j0 - off; windowed rows i <= j_last - off - 1 + window.
  const int64_t i_begin = g.causal ? clamp64(j0 - off, 0, g.Lq) : 0;
  const int64_t i_end = g.window > 0 ? clamp64(j_last - off + g.window, 0, g.Lq) : g.Lq;
  const float scale = float(g.scale);
  for (int64_t h = hk * group; h < (hk + 1) * group && j0 < n; ++h) {
    const int64_t row0 = (b * g.Hq + h) * g.Lq;
    for (int64_t i0 = i_begin - i_begin % kBr; i0 < i_end; i0 += kBr) {
      __syncthreads();  // the previous query tile is read
      load_tile(sq, q, g.lq, b, h, i0, g.Lq, kBr, D);
      load_tile(sdo, dout, g.ldo, b, h, i0, g.Lq, kBr, Dv);
      if (threadIdx.x < kBr) {
        const int64_t i = i0 + threadIdx.x;
        slse[threadIdx.x] = i < g.Lq ? bp.lse[row0 + i] : -INFINITY;
        sdelta[threadIdx.x] = i < g.Lq ? bp.delta[row0 + i] : 0.0f;
      }
      __syncthreads();
      for (int t = 0; t < kBr / kParts; ++t) {  // phase 1: P and dS of rows part + kParts t at key cc
        const int rr = part + kParts * t;
        const int64_t i = i0 + rr;
        const float lse_i = slse[rr];
        float p = 0.0f, ds = 0.0f;
        if (i < g.Lq && j < n && j >= key_first(g, n, i) && j < key_limit(g, n, i) && isfinite(lse_i)) {
          float s = 0.0f, dp = 0.0f;
          for (int64_t d = 0; d < D; ++d) s += sq[rr * (D + 1) + d] * sk[cc * (D + 1) + d];
          for (int64_t d = 0; d < Dv; ++d) dp += sdo[rr * (Dv + 1) + d] * sv[cc * (Dv + 1) + d];
          const float pc = fn::exp_(s * scale + mask_at(c, b, h, i, j) - lse_i), z = dropout_keep(g, b, h, i, j);
          p = pc * z;
          ds = pc * (dp * z - sdelta[rr]) * scale;
        }
        sp[rr * (kBc + 1) + cc] = p;
        sds[rr * (kBc + 1) + cc] = ds;
      }
      __syncthreads();
      for (int64_t d = part; d < Dv; d += kParts) {  // phase 2: dV += P^T dO, dK += dS^T Q for key cc
        float acc = 0.0f;
        for (int rr = 0; rr < kBr; ++rr) acc += sp[rr * (kBc + 1) + cc] * sdo[rr * (Dv + 1) + d];
        sdv[cc * (Dv + 1) + d] += acc;
      }
      for (int64_t d = part; d < D; d += kParts) {
        float acc = 0.0f;
        for (int rr = 0; rr < kBr; ++rr) acc += sds[rr * (kBc + 1) + cc] * sq[rr * (D + 1) + d];
        sdk[cc * (D + 1) + d] += acc;
      }
      const int rq = threadIdx.x / kParts;  // phase 3: dQ += dS K for query row rq
      if (i0 + rq < g.Lq)
        for (int64_t d = part; d < D; d += kParts) {
          float acc = 0.0f;
          for (int c2 = 0; c2 < kBc; ++c2) acc += sds[rq * (kBc + 1) + c2] * sk[c2 * (D + 1) + d];
          if (acc != 0.0f) atomicAdd(bp.dq_acc + (row0 + i0 + rq) * D + d, acc);
        }
    }
  }
  __syncthreads();
  if (j >= g.Lkv) return;
  S *dkrow = row(g.ldk, dk, b, hk, j), *dvrow = row(g.ldv, dv, b, hk, j);  // keys past the cache's length get 0
  for (int64_t d = part; d < D; d += kParts) store(dkrow + d, j < n ? sdk[cc * (D + 1) + d] : 0.0f);
  for (int64_t d = part; d < Dv; d += kParts) store(dvrow + d, j < n ? sdv[cc * (Dv + 1) + d] : 0.0f);
}

template <class Fn> void with_storage(DType dt, const char* op, Fn&& fn) {
  if (dt == DType::f32) return fn(float{});
  if (dt == DType::bf16) return fn(BF16{});
  SINTER_THROW(DTypeError, "[", op, "] the CUDA flash kernels take f32 or bf16, got ", dt);
}

void check_dims(const Geometry& g, const char* op) {
  SINTER_CHECK_SHAPE(g.D <= kMaxHeadDim && g.Dv <= kMaxHeadDim, "[", op, "] the CUDA flash kernels take head dims up to ", kMaxHeadDim,
                     ", got ", g.D, "/", g.Dv);
}

}  // namespace

void flash_forward(const Geometry& g, DType dtype, const void* q, const void* k, const void* v, FlashExtras x, void* o, float* lse,
                   int device) {
  check_dims(g, "sdpa");
  if (g.B * g.Hq * g.Lq == 0) return;
  if (g.Lq == 1 && g.dropout == 0) return flash_decode(g, dtype, q, k, v, x, o, lse, device);
  if (flash_tc_takes(g, dtype)) return flash_forward_tc(g, q, k, v, x, o, lse, device);
  with_storage(dtype, "sdpa", [&]<class S>(S) {
    const size_t smem = forward_smem(g.D, g.Dv);
    allow_smem(flash_forward_k<S>, smem);
    const dim3 grid(unsigned(g.B * g.Hq), unsigned((g.Lq + kBr - 1) / kBr));
    launch_kernel("sdpa", flash_forward_k<S>, grid, kThreads, smem, stream(device), Call{g, x}, static_cast<const S*>(q),
                  static_cast<const S*>(k), static_cast<const S*>(v), static_cast<S*>(o), lse);
  });
}

void flash_backward(const Geometry& g, DType dtype, const void* q, const void* k, const void* v, const void* o, const float* lse,
                    const void* dout, const float* dlse, FlashExtras x, float* delta, float* dq_acc, void* dk, void* dv, int device) {
  check_dims(g, "sdpa_flash_backward");
  if (g.B * g.Hkv * g.Lkv == 0) return;
  with_storage(dtype, "sdpa_flash_backward", [&]<class S>(S) {
    const cudaStream_t s = stream(device);
    const int64_t rows = g.B * g.Hq * g.Lq;
    if (rows > 0) {
      launch_kernel("sdpa_flash_backward", flash_delta_k<S>, unsigned((rows + 7) / 8), 256, 0, s, g, static_cast<const S*>(o),
                    static_cast<const S*>(dout), dlse, delta);
    }
    if (flash_tc_backward_takes(g, dtype))
      return flash_backward_tc(g, q, k, v, dout, BackwardPtrs{lse, delta, dq_acc}, x, dk, dv, device);
    const size_t smem = backward_smem(g.D, g.Dv);
    allow_smem(flash_backward_k<S>, smem);
    const dim3 grid(unsigned(g.B * g.Hkv), unsigned((g.Lkv + kBc - 1) / kBc));
    launch_kernel("sdpa_flash_backward", flash_backward_k<S>, grid, kThreads, smem, s, Call{g, x}, static_cast<const S*>(q),
                  static_cast<const S*>(k), static_cast<const S*>(v), static_cast<const S*>(dout), BackwardPtrs{lse, delta, dq_acc},
                  static_cast<S*>(dk), static_cast<S*>(dv));
  });
}

}  // namespace sinter::cuda

// The decode forward (flash.h: flash_decode): one query row per head over a KV cache, split into
// chunks of kChunk keys so that every SM reads part of the cache. A block takes one chunk of one
// KV head for up to kMaxGroup of its query heads (GQA reads each key once for such a group); a
// warp loads U keys before computing on them, lane l holding elements l, l + 32, ... of q, k, v,
// with an online softmax in registers; the warps' sums meet in shared memory and go out as (max,
// sum, acc[Dv]) per chunk, which a second kernel combines into o and lse.
#include "cuda/flash_common.cuh"

namespace sinter::cuda {
namespace {

using namespace flash;

constexpr int kChunk = 256, kWarps = 4, kMaxGroup = 4;

template <class S, int E>
__global__ void __launch_bounds__(kWarps * 32) decode_chunk_k(Call c, const S* q, const S* k, const S* v, float* part, int64_t chunks) {
  __shared__ float sm[kWarps][kMaxGroup][kMaxHeadDim + 2];  // per warp and head: max, sum, acc
  const Geometry& g = c.g;
  const int64_t b = blockIdx.x / g.Hkv, hk = blockIdx.x % g.Hkv, chunk = blockIdx.y, group = g.Hq / g.Hkv;
  const int64_t h0 = hk * group + int64_t(blockIdx.z) * kMaxGroup;
  const int heads = int(hk * group + group - h0 < kMaxGroup ? hk * group + group - h0 : kMaxGroup);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t n = c.kv_len(), first = key_first(g, n, 0), limit = key_limit(g, n, 0);
  const int64_t j_begin = first > chunk * kChunk ? first : chunk * kChunk;
  const int64_t j_end = limit < (chunk + 1) * kChunk ? limit : (chunk + 1) * kChunk;
  float qv[kMaxGroup][E], acc[kMaxGroup][E], m[kMaxGroup], l[kMaxGroup];
#pragma unroll
  for (int h = 0; h < kMaxGroup; ++h) {
    m[h] = -INFINITY, l[h] = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int64_t d = lane + 32 * e;
      qv[h][e] = h < heads && d < g.D ? float(load(row(g.lq, q, b, h0 + h, 0) + d)) : 0.0f;
      acc[h][e] = 0.0f;
    }
  }
  const float scale = float(g.scale);
  constexpr int U = 16 / E;  // keys a warp loads before it computes: bytes in flight to cover the memory's latency
  for (int64_t j0 = j_begin + warp * U; j0 < j_end; j0 += kWarps * U) {
    float kv[U][E], vv[U][E];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t j = j0 + u < j_end ? j0 + u : j0;  // past the end: a key already read, not counted below
      const S *kr = row(g.lk, k, b, hk, j), *vr = row(g.lv, v, b, hk, j);
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const int64_t d = lane + 32 * e;
        kv[u][e] = d < g.D ? float(load(kr + d)) : 0.0f;
        vv[u][e] = d < g.Dv ? float(load(vr + d)) : 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (j0 + u >= j_end) break;
#pragma unroll
      for (int h = 0; h < kMaxGroup; ++h) {
        if (h >= heads) break;
        float s = 0.0f;
#pragma unroll
        for (int e = 0; e < E; ++e) s += qv[h][e] * kv[u][e];
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        s = s * scale + mask_at(c, b, h0 + h, 0, j0 + u);
        const float m_new = fmaxf(m[h], s);
        if (m_new == -INFINITY) continue;  // nothing visible yet
        const float alpha = fn::exp_nonpos_(m[h] - m_new), p = fn::exp_nonpos_(s - m_new);
        l[h] = l[h] * alpha + p;
#pragma unroll
        for (int e = 0; e < E; ++e) acc[h][e] = acc[h][e] * alpha + p * vv[u][e];
        m[h] = m_new;
      }
    }
  }
#pragma unroll
  for (int h = 0; h < kMaxGroup; ++h) {
    if (h >= heads) break;
    if (lane == 0) sm[warp][h][0] = m[h], sm[warp][h][1] = l[h];
#pragma unroll
    for (int e = 0; e < E; ++e)
      if (lane + 32 * e < g.Dv) sm[warp][h][2 + lane + 32 * e] = acc[h][e];
  }
  __syncthreads();
  for (int64_t t = threadIdx.x; t < heads * (g.Dv + 2); t += blockDim.x) {  // the warps' sums, rescaled to one max
    const int h = int(t / (g.Dv + 2)), f = int(t % (g.Dv + 2));
    float mx = -INFINITY;
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, sm[w][h][0]);
    float r = 0.0f;
    if (f == 0) r = mx;
    else if (mx != -INFINITY)
      for (int w = 0; w < kWarps; ++w) r += sm[w][h][f] * fn::exp_nonpos_(sm[w][h][0] - mx);
    part[((b * g.Hq + h0 + h) * chunks + chunk) * (g.Dv + 2) + f] = r;
  }
}

// o and lse of query head (b, h) from its chunks' (max, sum, acc).
template <class S> __global__ void decode_combine_k(Geometry g, const float* part, int64_t chunks, S* o, float* lse) {
  const int64_t bh = blockIdx.x, b = bh / g.Hq, h = bh % g.Hq;
  const float* p = part + bh * chunks * (g.Dv + 2);
  float mx = -INFINITY;
  for (int64_t c = 0; c < chunks; ++c) mx = fmaxf(mx, p[c * (g.Dv + 2)]);
  float sum = 0.0f;
  if (mx != -INFINITY)
    for (int64_t c = 0; c < chunks; ++c) sum += p[c * (g.Dv + 2) + 1] * fn::exp_nonpos_(p[c * (g.Dv + 2)] - mx);
  S* orow = row(g.lo, o, b, h, 0);
  for (int64_t d = threadIdx.x; d < g.Dv; d += blockDim.x) {
    float a = 0.0f;
    if (sum > 0.0f)
      for (int64_t c = 0; c < chunks; ++c) a += p[c * (g.Dv + 2) + 2 + d] * fn::exp_nonpos_(p[c * (g.Dv + 2)] - mx);
    store(orow + d, sum > 0.0f ? a / sum : 0.0f);
  }
  if (threadIdx.x == 0) lse[bh] = sum > 0.0f ? mx + ::logf(sum) : -INFINITY;
}

template <class S, int E>
void launch_decode(const Geometry& g, const FlashExtras& x, const void* q, const void* k, const void* v, void* o, float* lse, int device) {
  const int64_t chunks = (g.Lkv + kChunk - 1) / kChunk, slices = (g.Hq / g.Hkv + kMaxGroup - 1) / kMaxGroup;
  const Tensor part = Tensor::empty({g.B * g.Hq * chunks * (g.Dv + 2)}, DType::f32, Device::cuda(device));  // freed in stream order
  const cudaStream_t s = stream(device);
  launch_kernel("sdpa", decode_chunk_k<S, E>, dim3(unsigned(g.B * g.Hkv), unsigned(chunks), unsigned(slices)), kWarps * 32, 0, s,
                Call{g, x}, static_cast<const S*>(q), static_cast<const S*>(k), static_cast<const S*>(v),
                static_cast<float*>(part.data_ptr()), chunks);
  launch_kernel("sdpa", decode_combine_k<S>, unsigned(g.B * g.Hq), 128, 0, s, g, static_cast<const float*>(part.data_ptr()), chunks,
                static_cast<S*>(o), lse);
}

}  // namespace

void flash_decode(const Geometry& g, DType dtype, const void* q, const void* k, const void* v, FlashExtras x, void* o, float* lse,
                  int device) {
  SINTER_CHECK(g.Lq == 1 && g.dropout == 0, "[sdpa] the decode kernel takes one query row without dropout");
  const int64_t widest = g.D > g.Dv ? g.D : g.Dv;
  auto go = [&]<class S>(S) {
    if (widest <= 64) launch_decode<S, 2>(g, x, q, k, v, o, lse, device);
    else if (widest <= 128) launch_decode<S, 4>(g, x, q, k, v, o, lse, device);
    else launch_decode<S, 8>(g, x, q, k, v, o, lse, device);
  };
  if (dtype == DType::f32) go(float{});
  else if (dtype == DType::bf16) go(BF16{});
  else SINTER_THROW(DTypeError, "[sdpa] the CUDA flash kernels take f32 or bf16, got ", dtype);
}

}  // namespace sinter::cuda

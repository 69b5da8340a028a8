// The decode forward (flash.h: flash_decode): one query row per head over a KV cache, split into
// chunks of kChunk keys so that every SM reads part of the cache. A block takes one chunk of one
// KV head for up to kMaxGroup of its query heads (GQA reads each key once for such a group); its
// warps load several keys before computing on them, with an online softmax in registers; the
// warps' sums meet in shared memory and go out as (max, sum, acc[Dv]) per chunk, which a second
// kernel combines into o and lse. bf16 at head dims 64, 128 and 256 loads 16 bytes a lane
// (decode_chunk_vec_k); the rest, lane l holding elements l, l + 32, ... (decode_chunk_k).
#include "cuda/flash_common.cuh"

namespace sinter::cuda {
namespace {

using detail::RowLayout;
using namespace flash;

constexpr int kChunk = 256, kWarps = 4, kMaxGroup = 4;

using WarpSums = float[kWarps][kMaxGroup][kMaxHeadDim + 2];  // per warp and head: max, sum, acc

// What a block reads: batch b, KV head hk, query heads [h0, h0 + heads) of its group, and keys
// [j_begin, j_end) of its chunk that the query row sees.
struct Slice {
  int64_t b, hk, h0, chunk, j_begin, j_end;
  int heads;
};

__device__ Slice slice_of(const Call& c) {
  const Geometry& g = c.g;
  Slice s;
  const int64_t group = g.Hq / g.Hkv;
  s.b = blockIdx.x / g.Hkv, s.hk = blockIdx.x % g.Hkv, s.chunk = blockIdx.y;
  s.h0 = s.hk * group + int64_t(blockIdx.z) * kMaxGroup;
  s.heads = int(s.hk * group + group - s.h0 < kMaxGroup ? s.hk * group + group - s.h0 : kMaxGroup);
  const int64_t n = c.kv_len(), first = key_first(g, n, 0), limit = key_limit(g, n, 0);
  s.j_begin = first > s.chunk * kChunk ? first : s.chunk * kChunk;
  s.j_end = limit < (s.chunk + 1) * kChunk ? limit : (s.chunk + 1) * kChunk;
  return s;
}

// The block's warps' (max, sum, acc) of each head, rescaled to one max, out as the chunk's partials.
__device__ void combine_warps(const WarpSums& sm, const Geometry& g, const Slice& sl, int64_t chunks, float* part) {
  const int64_t b = sl.b, h0 = sl.h0, chunk = sl.chunk;
  const int heads = sl.heads;
  for (int64_t t = threadIdx.x; t < heads * (g.Dv + 2); t += blockDim.x) {
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

// One key slot's online softmax state merged with that of the lane `o` away (both lanes end with
// the merged state).
__device__ void merge_slots(float& m, float& l, float (&acc)[8], int o) {
  const float m_o = __shfl_xor_sync(0xffffffffu, m, o), l_o = __shfl_xor_sync(0xffffffffu, l, o);
  float acc_o[8];
  SINTER_UNROLL
  for (int d = 0; d < 8; ++d) acc_o[d] = __shfl_xor_sync(0xffffffffu, acc[d], o);
  const float m_new = fmaxf(m, m_o);
  if (m_new == -INFINITY) return;  // neither saw a key
  const float a = fn::exp_nonpos_(m - m_new), b = fn::exp_nonpos_(m_o - m_new);
  l = l * a + l_o * b;
  SINTER_UNROLL
  for (int d = 0; d < 8; ++d) acc[d] = acc[d] * a + acc_o[d] * b;
  m = m_new;
}

template <class S, int E>
__global__ void __launch_bounds__(kWarps * 32) decode_chunk_k(Call c, const S* q, const S* k, const S* v, float* part, int64_t chunks) {
  __shared__ WarpSums sm;
  const Geometry& g = c.g;
  const Slice sl = slice_of(c);
  const int64_t b = sl.b, hk = sl.hk, h0 = sl.h0, j_begin = sl.j_begin, j_end = sl.j_end;
  const int heads = sl.heads, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
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
  combine_warps(sm, g, sl, chunks, part);
}

// The bf16 decode with 16-byte loads, for D = Dv in {64, 128, 256} and k, v rows 16-byte aligned:
// L = D / 8 lanes share a key, each holding 8 of its elements, so one load of the warp reads 32 / L
// keys and a lane has 2 U loads in flight; each key slot of the warp keeps its own online softmax,
// merged across the slots by shuffles before the block's combine.
template <int D>
__global__ void __launch_bounds__(kWarps * 32, 1) decode_chunk_vec_k(Call c, const BF16* q, const BF16* k, const BF16* v, float* part,
                                                                   int64_t chunks) {
  constexpr int L = D / 8, KP = 32 / L, U = 8;  // lanes a key, keys a load, loads of k (and of v) in flight
  __shared__ WarpSums sm;
  const Geometry& g = c.g;
  const Slice sl = slice_of(c);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, slot = lane / L, d0 = 8 * (lane % L);
  float qv[kMaxGroup][8], acc[kMaxGroup][8] = {}, m[kMaxGroup], l[kMaxGroup];
  SINTER_UNROLL
  for (int h = 0; h < kMaxGroup; ++h) {
    m[h] = -INFINITY, l[h] = 0.0f;
    SINTER_UNROLL
    for (int d = 0; d < 8; ++d) qv[h][d] = h < sl.heads ? float(load(row(g.lq, q, sl.b, sl.h0 + h, 0) + d0 + d)) : 0.0f;
  }
  const float scale = float(g.scale);
  for (int64_t j0 = sl.j_begin + warp * KP * U; j0 < sl.j_end; j0 += kWarps * KP * U) {
    Pack<BF16> kc[U], vc[U];
    SINTER_UNROLL
    for (int u = 0; u < U; ++u) {
      const int64_t j = j0 + u * KP + slot < sl.j_end ? j0 + u * KP + slot : j0;  // past the end: a key already read, not counted
      kc[u] = load_pack(row(g.lk, k, sl.b, sl.hk, j) + d0);
      vc[u] = load_pack(row(g.lv, v, sl.b, sl.hk, j) + d0);
    }
    SINTER_UNROLL
    for (int u = 0; u < U; ++u) {
      const int64_t j = j0 + u * KP + slot;
      SINTER_UNROLL
      for (int h = 0; h < kMaxGroup; ++h) {
        if (h >= sl.heads) break;  // the same for the whole block
        float s = 0.0f;
        SINTER_UNROLL
        for (int d = 0; d < 8; ++d) s += qv[h][d] * float(load(&kc[u].v[d]));
        for (int o = 1; o < L; o <<= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (j >= sl.j_end) continue;
        s = s * scale + mask_at(c, sl.b, sl.h0 + h, 0, j);
        const float m_new = fmaxf(m[h], s);
        if (m_new == -INFINITY) continue;  // nothing visible yet
        const float alpha = fn::exp_nonpos_(m[h] - m_new), p = fn::exp_nonpos_(s - m_new);
        l[h] = l[h] * alpha + p;
        SINTER_UNROLL
        for (int d = 0; d < 8; ++d) acc[h][d] = acc[h][d] * alpha + p * float(load(&vc[u].v[d]));
        m[h] = m_new;
      }
    }
  }
  SINTER_UNROLL
  for (int h = 0; h < kMaxGroup; ++h) {
    if (h >= sl.heads) break;
    for (int o = L; o < 32; o <<= 1) merge_slots(m[h], l[h], acc[h], o);
    if (lane == 0) sm[warp][h][0] = m[h], sm[warp][h][1] = l[h];
    SINTER_UNROLL
    for (int d = 0; d < 8; ++d)
      if (slot == 0) sm[warp][h][2 + d0 + d] = acc[h][d];
  }
  __syncthreads();
  combine_warps(sm, g, sl, chunks, part);
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

// The chunk kernel K (decode_chunk_k or decode_chunk_vec_k, over S), then the combine.
template <class S, class K>
void launch_decode(K chunk_kernel, const Geometry& g, const FlashExtras& x, const void* q, const void* k, const void* v, void* o, float* lse,
                   int device) {
  const int64_t chunks = (g.Lkv + kChunk - 1) / kChunk, slices = (g.Hq / g.Hkv + kMaxGroup - 1) / kMaxGroup;
  const Tensor part = Tensor::empty({g.B * g.Hq * chunks * (g.Dv + 2)}, DType::f32, Device::cuda(device));  // freed in stream order
  const cudaStream_t s = stream(device);
  launch_kernel("sdpa", chunk_kernel, dim3(unsigned(g.B * g.Hkv), unsigned(chunks), unsigned(slices)), kWarps * 32, 0, s, Call{g, x},
                static_cast<const S*>(q), static_cast<const S*>(k), static_cast<const S*>(v), static_cast<float*>(part.data_ptr()), chunks);
  launch_kernel("sdpa", decode_combine_k<S>, unsigned(g.B * g.Hq), 128, 0, s, g, static_cast<const float*>(part.data_ptr()), chunks,
                static_cast<S*>(o), lse);
}

// Every row of a bf16 operand laid out by l from base starts on a 16-byte boundary.
bool rows_aligned(const RowLayout& l, const void* base) {
  return reinterpret_cast<uintptr_t>(base) % 16 == 0 && l.b % 8 == 0 && l.h % 8 == 0 && l.r % 8 == 0;
}

}  // namespace

void flash_decode(const Geometry& g, DType dtype, const void* q, const void* k, const void* v, FlashExtras x, void* o, float* lse,
                  int device) {
  SINTER_CHECK(g.Lq == 1 && g.dropout == 0, "[sdpa] the decode kernel takes one query row without dropout");
  const int64_t widest = g.D > g.Dv ? g.D : g.Dv;
  auto go = [&]<class S>(S) {
    if (widest <= 64) launch_decode<S>(decode_chunk_k<S, 2>, g, x, q, k, v, o, lse, device);
    else if (widest <= 128) launch_decode<S>(decode_chunk_k<S, 4>, g, x, q, k, v, o, lse, device);
    else launch_decode<S>(decode_chunk_k<S, 8>, g, x, q, k, v, o, lse, device);
  };
  if (dtype == DType::bf16 && g.D == g.Dv && rows_aligned(g.lk, k) && rows_aligned(g.lv, v)) {
    if (g.D == 64) return launch_decode<BF16>(decode_chunk_vec_k<64>, g, x, q, k, v, o, lse, device);
    if (g.D == 128) return launch_decode<BF16>(decode_chunk_vec_k<128>, g, x, q, k, v, o, lse, device);
    if (g.D == 256) return launch_decode<BF16>(decode_chunk_vec_k<256>, g, x, q, k, v, o, lse, device);
  }
  if (dtype == DType::f32) go(float{});
  else if (dtype == DType::bf16) go(BF16{});
  else SINTER_THROW(DTypeError, "[sdpa] the CUDA flash kernels take f32 or bf16, got ", dtype);
}

}  // namespace sinter::cuda

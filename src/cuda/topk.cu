// CUDA kernels of topk (src/ops/index.cpp) in the CPU's total order (cpu/op_index.cpp): value,
// NaN as the largest, ties by lower index. Rows longer than kRadixFrom of f32, bf16 or f16 keep
// up to kSelectUpTo by radix selection (eight counting scans of the row, a block per row, then a
// sort of the k in shared memory). Otherwise up to kPassesUpTo take k passes of a block-wide pick;
// more sort the row's (value, index) pairs, padded to a power of two, with a bitonic network and
// keep the first k: steps within a tile of kTile entries run in shared memory, the others a launch
// each (36 launches for a row of 50257).
#include <algorithm>
#include <bit>
#include <span>

#include "cuda/block_reduce.cuh"
#include "ops/common.h"
#include "sinter/op.h"

namespace sinter::cuda {
namespace {

constexpr int64_t kPassesUpTo = 64;          // the largest k that takes k passes
constexpr int64_t kRadixFrom = 4096;         // rows longer than this select by radix
constexpr int64_t kSelectUpTo = 1024;        // the most a radix selection keeps
constexpr int64_t kTile = 2 * kBlock;        // entries a block sorts in shared memory
constexpr int64_t kSortBytes = int64_t(1) << 28;  // the most scratch a sort takes at once (rows run in chunks)

// Whether element i (value a) comes before element j (value b) in topk's order.
__device__ __forceinline__ bool before(double a, int64_t i, double b, int64_t j, bool largest) {
  if (isnan(a) || isnan(b)) return isnan(a) && !isnan(b) ? largest : (!isnan(a) && isnan(b) ? !largest : i < j);
  if (a != b) return largest ? a > b : a < b;
  return i < j;
}

template <class S> __global__ void topk_k(int64_t rows, int64_t n, int64_t k, const S* x, S* vals, int64_t* idx, bool largest) {
  __shared__ double bv[kBlock];
  __shared__ int64_t bi[kBlock];
  SINTER_ROWS(r, rows) {
    const S* row = x + r * n;
    double last_v = 0;
    int64_t last_i = -1;
    for (int64_t pick = 0; pick < k; ++pick) {
      double best_v = 0;
      int64_t best_i = -1;
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        const double v = double(load(row + j));
        if (last_i >= 0 && !before(last_v, last_i, v, j, largest)) continue;  // already picked
        if (best_i < 0 || before(v, j, best_v, best_i, largest)) best_v = v, best_i = j;
      }
      bv[threadIdx.x] = best_v, bi[threadIdx.x] = best_i;
      __syncthreads();
      for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
          const int64_t oi = bi[threadIdx.x + s];
          if (oi >= 0 && (bi[threadIdx.x] < 0 || before(bv[threadIdx.x + s], oi, bv[threadIdx.x], bi[threadIdx.x], largest)))
            bv[threadIdx.x] = bv[threadIdx.x + s], bi[threadIdx.x] = oi;
        }
        __syncthreads();
      }
      last_v = bv[0], last_i = bi[0];
      if (threadIdx.x == 0) vals[r * k + pick] = row[last_i], idx[r * k + pick] = last_i;
      __syncthreads();
    }
  }
}

// A row's entry in the sort; index -1 pads the row to a power of two and sorts last.
struct Entry {
  double v;
  int64_t i;
};

__device__ __forceinline__ bool ahead(const Entry& a, const Entry& b, bool largest) {
  if (a.i < 0 || b.i < 0) return b.i < 0 && a.i >= 0;
  return before(a.v, a.i, b.v, b.i, largest);
}

struct EntryOrder {
  bool largest;
  __device__ bool operator()(const Entry& a, const Entry& b) const { return ahead(a, b, largest); }
};
struct KeyOrder {  // order_key's: the larger first
  __device__ bool operator()(uint64_t a, uint64_t b) const { return a > b; }
};

// Step (k2, j) of a bitonic network on pair t of a: entries e and e + j in the order, where e's
// run of k2 (at position base + e) goes first to last; in reverse where it goes the other way.
template <class E, class Order>
__device__ __forceinline__ void exchange(E* a, int64_t t, int64_t base, int64_t k2, int64_t j, Order first) {
  const int64_t e = 2 * j * (t / j) + t % j, f = e + j;
  const bool up = ((base + e) & k2) == 0;
  if (up ? first(a[f], a[e]) : first(a[e], a[f])) {
    const E w = a[e];
    a[e] = a[f], a[f] = w;
  }
}

template <class S> __global__ void sort_load_k(int64_t count, int64_t n, int64_t P, const S* x, Entry* e) {
  SINTER_GRID_STRIDE(t, count) {
    const int64_t r = t / P, c = t % P;
    e[t] = c < n ? Entry{double(load(x + r * n + c)), c} : Entry{0, -1};
  }
}

// One step whose pairs span tiles: a thread per pair of each row of P entries.
__global__ void sort_step_k(int64_t pairs, int64_t P, int64_t k2, int64_t j, Entry* e, bool largest) {
  SINTER_GRID_STRIDE(t, pairs) exchange(e + t / (P / 2) * P, t % (P / 2), 0, k2, j, EntryOrder{largest});
}

// Stages k2_first..k2_last on each tile of T entries in shared memory, each from its step j < T.
__global__ void sort_tiles_k(int64_t tiles, int64_t P, int64_t T, int64_t k2_first, int64_t k2_last, Entry* e, bool largest) {
  __shared__ Entry s[kTile];
  for (int64_t b = blockIdx.x; b < tiles; b += gridDim.x) {
    Entry* g = e + b * T;
    for (int64_t c = threadIdx.x; c < T; c += blockDim.x) s[c] = g[c];
    __syncthreads();
    for (int64_t k2 = k2_first; k2 <= k2_last; k2 *= 2)
      for (int64_t j = (k2 < T ? k2 : T) / 2; j >= 1; j /= 2) {
        for (int64_t t = threadIdx.x; t < T / 2; t += blockDim.x) exchange(s, t, b * T % P, k2, j, EntryOrder{largest});
        __syncthreads();
      }
    for (int64_t c = threadIdx.x; c < T; c += blockDim.x) g[c] = s[c];
    __syncthreads();  // s is loaded again for the next tile
  }
}

template <class S>
__global__ void sort_take_k(int64_t count, int64_t k, int64_t n, int64_t P, const S* x, const Entry* e, S* vals, int64_t* idx) {
  SINTER_GRID_STRIDE(t, count) {
    const int64_t r = t / k, i = e[r * P + t % k].i;
    vals[t] = x[r * n + i], idx[t] = i;
  }
}

// (value, index) as a key in topk's order, the larger first: the value's bits made monotonic (-0
// as +0, NaN the largest), complemented for smallest first (NaN then the smallest), above the
// complemented index (a lower index first). Keys are unique: a row's top k are the k largest.
__device__ __forceinline__ uint64_t order_key(float v, int64_t i, bool largest) {
  uint32_t u = 0xFFFFFFFFu;
  if (v == v) {
    u = __float_as_uint(v == 0.0f ? 0.0f : v);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  }
  if (!largest) u = ~u;
  return uint64_t(u) << 32 | (0xFFFFFFFFu - uint32_t(i));
}

// Each row's top k (k <= kSelectUpTo), a block of kBlock per row: eight scans of the row, each
// counting by its next 8 bits the keys that share the bits fixed so far, fix the k-th largest key
// (`rank`: its place among those); the k keys at or above it are then sorted in shared memory.
template <class S>
__global__ void radix_topk_k(int64_t rows, int64_t n, int64_t k, int64_t P2, const S* x, S* vals, int64_t* idx, bool largest) {
  __shared__ uint32_t count[kBlock], rank, taken;
  __shared__ uint64_t prefix, sel[kSelectUpTo];
  SINTER_ROWS(r, rows) {
    const S* row = x + r * n;
    if (threadIdx.x == 0) prefix = 0, rank = uint32_t(k), taken = 0;
    for (int shift = 56; shift >= 0; shift -= 8) {
      count[threadIdx.x] = 0;
      __syncthreads();
      const uint64_t fixed = prefix, mask = shift == 56 ? 0 : ~uint64_t(0) << (shift + 8);
      const uint32_t want = rank;
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        const uint64_t key = order_key(float(load(row + j)), j, largest);
        if ((key & mask) == fixed) atomicAdd(&count[(key >> shift) & 255], 1u);
      }
      __syncthreads();
      const uint32_t mine = count[threadIdx.x];
      for (int off = 1; off < kBlock; off *= 2) {  // count[d] becomes the keys with digit >= d
        const uint32_t add = threadIdx.x + off < kBlock ? count[threadIdx.x + off] : 0;
        __syncthreads();
        count[threadIdx.x] += add;
        __syncthreads();
      }
      if (count[threadIdx.x] >= want && count[threadIdx.x] - mine < want)
        prefix = fixed | uint64_t(threadIdx.x) << shift, rank = want - (count[threadIdx.x] - mine);
      __syncthreads();
    }
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const uint64_t key = order_key(float(load(row + j)), j, largest);
      if (key >= prefix) sel[atomicAdd(&taken, 1u)] = key;
    }
    for (int64_t c = k + threadIdx.x; c < P2; c += blockDim.x) sel[c] = 0;  // sorts last
    __syncthreads();
    for (int64_t k2 = 2; k2 <= P2; k2 *= 2)
      for (int64_t j = k2 / 2; j >= 1; j /= 2) {
        for (int64_t t = threadIdx.x; t < P2 / 2; t += blockDim.x) exchange(sel, t, 0, k2, j, KeyOrder{});
        __syncthreads();
      }
    for (int64_t c = threadIdx.x; c < k; c += blockDim.x) {
      const int64_t i = 0xFFFFFFFFu - uint32_t(sel[c]);
      vals[r * k + c] = row[i], idx[r * k + c] = i;
    }
    __syncthreads();  // sel and prefix are set again for the next row
  }
}

// vals, idx (rows, k) = the first k of each row of x (rows, n) in topk's order, by sorting.
template <class S>
void sorted_topk(const Tensor& x, int64_t rows, int64_t n, int64_t k, const Tensor& vals, const Tensor& idx, bool largest) {
  const int device = x.device().index;
  const int64_t P = int64_t(std::bit_ceil(uint64_t(n))), T = std::min(kTile, P);
  const int64_t chunk = std::max<int64_t>(1, kSortBytes / (P * int64_t(sizeof(Entry))));
  const Tensor scratch = Tensor::empty({std::min(rows, chunk) * P * int64_t(sizeof(Entry))}, DType::u8, x.device());
  Entry* e = ptr<Entry>(scratch);
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t m = std::min(chunk, rows - r0);
    const unsigned tile_blocks = unsigned(std::min<int64_t>(m * P / T, 65535));
    launch_n("topk", m * P, device, sort_load_k<S>, n, P, ptr<const S>(x) + r0 * n, e);
    launch_kernel("topk", sort_tiles_k, tile_blocks, kBlock, 0, stream(device), m * P / T, P, T, int64_t(2), T, e, largest);
    for (int64_t k2 = 2 * T; k2 <= P; k2 *= 2) {
      for (int64_t j = k2 / 2; j >= T; j /= 2) launch_n("topk", m * P / 2, device, sort_step_k, P, k2, j, e, largest);
      launch_kernel("topk", sort_tiles_k, tile_blocks, kBlock, 0, stream(device), m * P / T, P, T, k2, k2, e, largest);
    }
    launch_n("topk", m * k, device, sort_take_k<S>, k, n, P, ptr<const S>(x) + r0 * n, e, ptr<S>(vals) + r0 * k,
             ptr<int64_t>(idx) + r0 * k);
  }
}

void topk_op(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const Tensor& x = in[0];
  const int64_t dim = x.dim() ? detail::wrap_dim("topk", a.i("dim"), x.dim()) : 0, k = a.i("k");
  Shape order;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (d != dim) order.push_back(d);
  if (x.dim()) order.push_back(dim);
  const Tensor x2 = x.dim() ? x.permute(order).contiguous() : x.contiguous();
  const int64_t n = x.dim() ? x.size(dim) : 1, rows = n ? x.numel() / n : 0;
  const Tensor vals = Tensor::empty({rows, k}, x.dtype(), x.device()), idx = Tensor::empty({rows, k}, DType::i64, x.device());
  if (rows > 0 && k > 0)
    dispatch<Types::numeric>(x.dtype(), "topk", [&](auto tag) {
      using S = decltype(tag);
      if constexpr (std::is_same_v<compute_t<S>, float>)
        if (n > kRadixFrom && k <= kSelectUpTo && n <= int64_t(UINT32_MAX))
          return launch_rows("topk", vals, rows, radix_topk_k<S>, n, k, int64_t(std::bit_ceil(uint64_t(k))), ptr<const S>(x2), ptr<S>(vals),
                             ptr<int64_t>(idx), a.b("largest"));
      if (k > kPassesUpTo) return sorted_topk<S>(x2, rows, n, k, vals, idx, a.b("largest"));
      launch_rows("topk", vals, rows, topk_k<S>, n, k, ptr<const S>(x2), ptr<S>(vals), ptr<int64_t>(idx), a.b("largest"));
    });
  if (x.dim() == 0) {
    copy_convert("topk", vals.reshape({}), out[0]);
    copy_convert("topk", idx.reshape({}), out[1]);
    return;
  }
  Shape ps;
  for (int64_t d : order) ps.push_back(d == dim ? k : x.size(d));
  copy_convert("topk", vals.reshape(ps), out[0].permute(order));
  copy_convert("topk", idx.reshape(ps), out[1].permute(order));
}

}  // namespace

void register_topk_kernel() { register_kernel("topk", DeviceType::cuda, topk_op); }

}  // namespace sinter::cuda

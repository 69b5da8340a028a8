#pragma once
// Element access for CUDA kernels: storage types (bf16 and f16 as their bits, widened to f32 to
// compute and rounded back to nearest-even as the CPU's sinter::bf16 does), and an Indexer that
// turns an element's linear index into each operand's offset (strides in elements, broadcast
// dimensions with stride 0), with a fast path when every operand is contiguous.
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "sinter/tensor.h"

namespace sinter::cuda {

struct BF16 { uint16_t bits; };
struct F16 { uint16_t bits; };

template <class S> struct compute_of { using type = S; };
template <> struct compute_of<BF16> { using type = float; };
template <> struct compute_of<F16> { using type = float; };
template <class S> using compute_t = typename compute_of<S>::type;

template <class S> __device__ __forceinline__ compute_t<S> load(const S* p) { return *p; }
template <> __device__ __forceinline__ float load<BF16>(const BF16* p) { return __uint_as_float(uint32_t(p->bits) << 16); }
template <> __device__ __forceinline__ float load<F16>(const F16* p) { return __half2float(__ushort_as_half(p->bits)); }

template <class S> __device__ __forceinline__ void store(S* p, compute_t<S> v) { *p = v; }
template <> __device__ __forceinline__ void store<BF16>(BF16* p, float v) {
  uint32_t u = __float_as_uint(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) { p->bits = uint16_t((u >> 16) | 0x40); return; }  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  p->bits = uint16_t(u >> 16);
}
template <> __device__ __forceinline__ void store<F16>(F16* p, float v) { p->bits = __half_as_ushort(__float2half_rn(v)); }

// 16 bytes of S (elements of up to 8 bytes) as one load or store, at a 16-byte aligned address
// (the emulated build fails the launch on one that is not, as the device faults).
template <class S> constexpr int kVec = sizeof(S) <= 8 ? int(16 / sizeof(S)) : 1;
template <class S> struct alignas(16) Pack {
  S v[kVec<S>];
};
template <class S> __device__ __forceinline__ Pack<S> load_pack(const S* p) {
#ifdef SINTER_CUDA_EMULATED
  Pack<S> v;
  emulator::check_aligned16(p);
  std::memcpy(&v, p, 16);  // bytes: an aligned load here would let the compiler assume what is checked
  return v;
#else
  return *reinterpret_cast<const Pack<S>*>(p);
#endif
}
template <class S> __device__ __forceinline__ void store_pack(S* p, const Pack<S>& v) {
#ifdef SINTER_CUDA_EMULATED
  emulator::check_aligned16(p);
  std::memcpy(p, &v, 16);
#else
  *reinterpret_cast<Pack<S>*>(p) = v;
#endif
}

// v as O's compute type, by the CPU's rule (core/dispatch.h: convert): a float to an integer
// truncates toward zero, NaN gives 0, and past int64 it saturates before narrowing.
template <class O, class V> __device__ __forceinline__ compute_t<O> convert_to(V v) {
  using C = compute_t<O>;
  if constexpr (std::is_same_v<O, bool>) {
    return v != V(0);
  } else if constexpr (std::is_integral_v<C> && std::is_floating_point_v<V>) {
    const double d = double(v);
    return C(d != d ? 0 : d >= 9.2233720368547758e18 ? INT64_MAX : d <= -9.2233720368547758e18 ? INT64_MIN : int64_t(d));
  } else {
    return C(v);
  }
}

constexpr int kMaxDims = 8, kMaxOperands = 4;

struct Indexer {
  int ndim = 0, operands = 0;
  bool contiguous = true;  // every operand contiguous over the whole shape: offset = index
  int64_t size[kMaxDims] = {};
  int64_t stride[kMaxOperands][kMaxDims] = {};
  __device__ __forceinline__ void offsets(int64_t i, int64_t* off) const {
    for (int k = 0; k < operands; ++k) off[k] = 0;
    if (contiguous) {
      for (int k = 0; k < operands; ++k) off[k] = i;
      return;
    }
    for (int d = ndim - 1; d >= 0; --d) {
      const int64_t c = i % size[d];
      i /= size[d];
      for (int k = 0; k < operands; ++k) off[k] += c * stride[k][d];
    }
  }
};

// Operand 0 is the output; the inputs broadcast to its shape. Throws naming `op` past kMaxDims.
Indexer make_indexer(const char* op, const Tensor& out, std::initializer_list<const Tensor*> inputs);

}  // namespace sinter::cuda

// The CPU elementwise kernels: unary ops, where, clamp, copy (with dtype conversion) and fill;
// binary ops are in elementwise_binary.cpp (a file each, so the two template-heavy halves build
// in parallel).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/dispatch.h"
#include "cpu/cpu.h"
#include "cpu/loops.h"
#include "ops/scalar_fns.h"

namespace sinter::cpu {
namespace {

// Which (functor, storage type) pairs exist: float ops on float types; neg/abs/relu on integers too.
template <class F, class T> constexpr bool unary_ok() {
  if constexpr (std::is_same_v<T, bool>) return false;
  else if constexpr (is_float_v<T>) return true;
  else return std::is_same_v<F, fn::Neg> || std::is_same_v<F, fn::Abs> || std::is_same_v<F, fn::Relu>;
}
// r[i] = f(a[i]) over floats (r may be a): vectorized, and for functors with a branch-free `fast`
// (sin, cos) a vectorized pass of it, then the functor itself where `fast_ok` is false.
template <class F> constexpr bool has_fast_v = requires(float v) { F::fast(v); };
template <class F> SINTER_INLINE void apply_f32(const F& f, const float* a, float* r, int64_t n) {
  if constexpr (has_fast_v<F>) {
    float in[256];
    for (int64_t i0 = 0; i0 < n; i0 += 256) {
      const int64_t m = std::min<int64_t>(256, n - i0);
      std::memcpy(in, a + i0, size_t(m) * sizeof(float));
      int slow = 0;
#pragma omp simd reduction(| : slow)
      for (int64_t i = 0; i < m; ++i) r[i0 + i] = F::fast(in[i]), slow |= !F::fast_ok(in[i]);
      for (int64_t i = 0; slow && i < m; ++i)
        if (!F::fast_ok(in[i])) r[i0 + i] = f(in[i]);
    }
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) r[i] = f(a[i]);
  }
}

template <class F, class T> void unary_loop(const Tensor& x, const Tensor& out) {
  using C = compute_t<T>;
  const F f;
  for_each_strided<2>(out.shape(), {static_cast<char*>(out.data_ptr()), static_cast<char*>(x.data_ptr())},
                      {broadcast_strides_bytes(out, out.shape()), broadcast_strides_bytes(x, out.shape())},
                      [&](std::array<char*, 2> p, std::array<int64_t, 2> s, int64_t n) {
    T* o = reinterpret_cast<T*>(p[0]);
    const T* a = reinterpret_cast<const T*>(p[1]);
    if constexpr (is_half_v<T>) {
      if (s[0] == sizeof(T) && s[1] == sizeof(T)) {
        through_float_blocks(o, std::array<const T*, 1>{a}, n, [&](float* const* in, float* r, int64_t m) { apply_f32(f, in[0], r, m); });
        return;
      }
    }
    if constexpr (std::is_same_v<T, float>) {
      if (s[0] == sizeof(T) && s[1] == sizeof(T)) {
        apply_f32(f, a, o, n);
        return;
      }
    }
    if (s[0] == sizeof(T) && s[1] == sizeof(T)) {
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) o[i] = T(f(C(a[i])));
    } else {
      for (int64_t i = 0; i < n; ++i)
        *reinterpret_cast<T*>(p[0] + i * s[0]) = T(f(C(*reinterpret_cast<const T*>(p[1] + i * s[1]))));
    }
  });
}

}  // namespace

void unary(UnaryOp op, const Tensor& x, const Tensor& out) {
  SINTER_KERNEL_ENTRY();
  SINTER_ASSERT(x.dtype() == out.dtype());
  visit_dtype(x.dtype(), [&]<class T>() {
    switch (op) {
#define UNARY(F, name, rule, dx) \
      case UnaryOp::F: \
        if constexpr (unary_ok<fn::F, T>()) { unary_loop<fn::F, T>(x, out); return; } \
        break;
#define BINARY(F, name, rule, da, db)
#include "ops/elementwise.def"
#undef UNARY
#undef BINARY
    }
    SINTER_THROW(DTypeError, "[internal] unary kernel ", int(op), " has no ", x.dtype(), " version");
  });
}

void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  SINTER_KERNEL_ENTRY();
  visit_dtype(out.dtype(), [&]<class T>() {
    for_each_strided<4>(out.shape(),
                        {static_cast<char*>(out.data_ptr()), static_cast<char*>(cond.data_ptr()),
                         static_cast<char*>(a.data_ptr()), static_cast<char*>(b.data_ptr())},
                        {broadcast_strides_bytes(out, out.shape()), broadcast_strides_bytes(cond, out.shape()),
                         broadcast_strides_bytes(a, out.shape()), broadcast_strides_bytes(b, out.shape())},
                        [&](std::array<char*, 4> p, std::array<int64_t, 4> s, int64_t n) {
      for (int64_t i = 0; i < n; ++i)
        *reinterpret_cast<T*>(p[0] + i * s[0]) = *reinterpret_cast<const bool*>(p[1] + i * s[1])
                                                     ? *reinterpret_cast<const T*>(p[2] + i * s[2])
                                                     : *reinterpret_cast<const T*>(p[3] + i * s[3]);
    });
  });
}

void clamp(const Tensor& x, std::optional<double> lo, std::optional<double> hi, const Tensor& out) {
  SINTER_KERNEL_ENTRY();
  visit_dtype(x.dtype(), [&]<class T>() {
    if constexpr (std::is_same_v<T, bool>) {
      SINTER_THROW(DTypeError, "[clamp] bool tensors cannot be clamped");
    } else {
      using C = compute_t<T>;
      const C l = lo ? C(*lo) : C(0), h = hi ? C(*hi) : C(0);
      const bool has_l = lo.has_value(), has_h = hi.has_value();
      for_each_strided<2>(out.shape(), {static_cast<char*>(out.data_ptr()), static_cast<char*>(x.data_ptr())},
                          {broadcast_strides_bytes(out, out.shape()), broadcast_strides_bytes(x, out.shape())},
                          [&](std::array<char*, 2> p, std::array<int64_t, 2> s, int64_t n) {
        if (s[0] == sizeof(T) && s[1] == sizeof(T) && has_l && has_h) {  // a vectorized min and max (NaN stays NaN)
          T* o = reinterpret_cast<T*>(p[0]);
          const T* a = reinterpret_cast<const T*>(p[1]);
#pragma omp simd
          for (int64_t i = 0; i < n; ++i) {
            const C v = C(a[i]), v1 = v < l ? l : v;
            o[i] = T(v1 > h ? h : v1);
          }
          return;
        }
        for (int64_t i = 0; i < n; ++i) {
          C v = C(*reinterpret_cast<const T*>(p[1] + i * s[1]));
          if (has_l && v < l) v = l;
          if (has_h && v > h) v = h;
          *reinterpret_cast<T*>(p[0] + i * s[0]) = T(v);
        }
      });
    }
  });
}

namespace {
// dst = src where each runs contiguously along a different dim (a transpose one way or the other:
// .contiguous() of a transposed view, rows_last of a reduction and writing its rows back): copied in
// 32 x 32 tiles over those two dims, each tile read and written from L1, where copying along dst's
// rows walks src a column at a time (a 4096 x 4096 f32 transpose: 2.2 GB/s).
template <class S, class D> bool copy_tiled(const Tensor& src, const Tensor& dst) {
  constexpr int64_t kTile = 32;
  const int64_t nd = dst.dim();
  if (nd < 2 || dst.numel() < kTile * kTile) return false;  // two dims of 16 or more; small copies skip the scan
  const Dims ss = broadcast_strides_bytes(src, dst.shape());
  int64_t da = -1, db = -1;  // src's contiguous dim, dst's contiguous dim
  for (int64_t d = 0; d < nd; ++d) {
    if (dst.size(d) < kTile / 2) continue;
    if (ss[size_t(d)] == int64_t(sizeof(S))) da = d;
    if (dst.stride(d) == 1) db = d;
  }
  if (da < 0 || db < 0 || da == db) return false;
  const int64_t A = dst.size(da), B = dst.size(db), ta = (A + kTile - 1) / kTile, tb = (B + kTile - 1) / kTile;
  const int64_t dst_a = dst.stride(da), src_b = ss[size_t(db)], outer = dst.numel() / (A * B);
  const char* ps = static_cast<const char*>(src.data_ptr());
  D* pd = static_cast<D*>(dst.data_ptr());
  parallel_for(0, outer * ta * tb, std::max<int64_t>(1, kElementwiseGrain / (kTile * kTile)), [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      int64_t o = t / (ta * tb), src_off = 0, dst_off = 0;  // the other dims' index, last first
      for (int64_t d = nd - 1; d >= 0; --d) {
        if (d == da || d == db) continue;
        const int64_t i = o % dst.size(d);
        o /= dst.size(d), src_off += i * ss[size_t(d)], dst_off += i * dst.stride(d);
      }
      const int64_t a0 = t / tb % ta * kTile, b0 = t % tb * kTile, a1 = std::min(A, a0 + kTile), b1 = std::min(B, b0 + kTile);
      for (int64_t a = a0; a < a1; ++a) {
        D* out = pd + dst_off + a * dst_a;
        const char* in = ps + src_off + a * int64_t(sizeof(S));
        for (int64_t b = b0; b < b1; ++b) out[b] = convert<D>(*reinterpret_cast<const S*>(in + b * src_b));
      }
    }
  });
  return true;
}
}  // namespace

void copy(const Tensor& src, const Tensor& dst) {
  SINTER_KERNEL_ENTRY();
  visit_dtype(src.dtype(), [&]<class S>() {
    visit_dtype(dst.dtype(), [&]<class D>() {
      if (copy_tiled<S, D>(src, dst)) return;
      for_each_strided<2>(dst.shape(), {static_cast<char*>(dst.data_ptr()), static_cast<char*>(src.data_ptr())},
                          {broadcast_strides_bytes(dst, dst.shape()), broadcast_strides_bytes(src, dst.shape())},
                          [&](std::array<char*, 2> p, std::array<int64_t, 2> s, int64_t n) {
        if (s[0] == sizeof(D) && s[1] == sizeof(S)) {
          D* o = reinterpret_cast<D*>(p[0]);
          const S* a = reinterpret_cast<const S*>(p[1]);
          if constexpr (std::is_same_v<S, D>) {
            std::memcpy(o, a, size_t(n) * sizeof(D));
          } else {
#pragma omp simd
            for (int64_t i = 0; i < n; ++i) o[i] = convert<D>(a[i]);
          }
        } else {
          for (int64_t i = 0; i < n; ++i)
            *reinterpret_cast<D*>(p[0] + i * s[0]) = convert<D>(*reinterpret_cast<const S*>(p[1] + i * s[1]));
        }
      });
    });
  });
}

void fill(const Tensor& dst, double value) {
  SINTER_KERNEL_ENTRY();
  visit_dtype(dst.dtype(), [&]<class T>() {
    const T v = convert<T>(value);
    for_each_strided<1>(dst.shape(), {static_cast<char*>(dst.data_ptr())}, {broadcast_strides_bytes(dst, dst.shape())},
                        [&](std::array<char*, 1> p, std::array<int64_t, 1> s, int64_t n) {
      for (int64_t i = 0; i < n; ++i) *reinterpret_cast<T*>(p[0] + i * s[0]) = v;
    });
  });
}

}  // namespace sinter::cpu

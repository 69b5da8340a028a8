// CUDA kernels of the elementwise ops (src/ops/elementwise.def), cast and copy: one grid-stride
// loop per (functor, dtype) over strided, broadcast operands (16-byte vectors where every operand
// is contiguous and aligned), computing with the same scalar functors as the CPU
// (src/ops/scalar_fns.h, built with --fmad=false), so f32 results equal the CPU's bit for bit
// where both run Sinter's own functions.
#include <span>
#include <string_view>

#include "cuda/cuda.h"
#include "cuda/launch.cuh"
#include "cuda/strided.cuh"
#include "sinter/op.h"
#include "sinter/ops.h"

#define SINTER_HD __host__ __device__
#include "ops/scalar_fns.h"

namespace sinter::cuda {

Indexer make_indexer(const char* op, const Tensor& out, std::initializer_list<const Tensor*> inputs) {
  Indexer ix;
  const Shape& shape = out.shape();
  SINTER_CHECK_SHAPE(shape.size() <= size_t(kMaxDims), "[", op, "] CUDA kernels take up to ", kMaxDims, " dims, got ", shape);
  ix.ndim = int(shape.size());
  ix.operands = int(inputs.size()) + 1;
  for (int d = 0; d < ix.ndim; ++d) ix.size[d] = shape[size_t(d)];
  for (int d = 0; d < ix.ndim; ++d) ix.stride[0][d] = out.strides()[size_t(d)];
  ix.contiguous = out.is_contiguous();
  int k = 1;
  for (const Tensor* t : inputs) {
    const int lead = ix.ndim - int(t->dim());
    SINTER_CHECK_SHAPE(lead >= 0, "[", op, "] input ", t->shape(), " has more dims than the output ", shape);
    for (int d = 0; d < ix.ndim; ++d) {
      const int64_t s = d < lead ? 0 : t->shape()[size_t(d - lead)] == 1 ? 0 : t->strides()[size_t(d - lead)];
      ix.stride[k][d] = s;
    }
    ix.contiguous = ix.contiguous && t->is_contiguous() && t->shape() == shape;
    ++k;
  }
  return ix;
}

namespace {

enum class Rule { keep, floating, promote, true_div, compare };
constexpr Rule rule_of(std::string_view r) {
  return r == "keep" ? Rule::keep : r == "float" ? Rule::floating : r == "promote" ? Rule::promote
         : r == "true_div" ? Rule::true_div : Rule::compare;
}

template <class F, class S, class O> __global__ void unary_k(int64_t n, Indexer ix, O* y, const S* x) {
  SINTER_GRID_STRIDE(i, n) {
    int64_t off[kMaxOperands];
    ix.offsets(i, off);
    store(y + off[0], compute_t<O>(F{}(load(x + off[1]))));
  }
}

template <class F, class S, class O> __global__ void binary_k(int64_t n, Indexer ix, O* y, const S* a, const S* b) {
  SINTER_GRID_STRIDE(i, n) {
    int64_t off[kMaxOperands];
    ix.offsets(i, off);
    store(y + off[0], compute_t<O>(F{}(load(a + off[1]), load(b + off[2]))));
  }
}

// The contiguous case with 16-byte loads and stores (strided.cuh's Pack): V elements a thread and
// step, each through the same functor (so results equal the strided kernels'), the last n % V one
// by one.
template <class F, class S> __global__ void unary_vec_k(int64_t n, S* y, const S* x) {
  constexpr int V = kVec<S>;
  const int64_t packs = n / V;
  SINTER_GRID_STRIDE(p, packs) {
    const Pack<S> in = load_pack(x + p * V);
    Pack<S> out;
#pragma unroll
    for (int k = 0; k < V; ++k) store(&out.v[k], compute_t<S>(F{}(load(&in.v[k]))));
    store_pack(y + p * V, out);
  }
  SINTER_GRID_STRIDE(j, n - packs * V) store(y + packs * V + j, compute_t<S>(F{}(load(x + packs * V + j))));
}

template <class F, class S> __global__ void binary_vec_k(int64_t n, S* y, const S* a, const S* b) {
  constexpr int V = kVec<S>;
  const int64_t packs = n / V;
  SINTER_GRID_STRIDE(p, packs) {
    const Pack<S> pa = load_pack(a + p * V), pb = load_pack(b + p * V);
    Pack<S> out;
#pragma unroll
    for (int k = 0; k < V; ++k) store(&out.v[k], compute_t<S>(F{}(load(&pa.v[k]), load(&pb.v[k]))));
    store_pack(y + p * V, out);
  }
  const int64_t at = packs * V;
  SINTER_GRID_STRIDE(j, n - at) store(y + at + j, compute_t<S>(F{}(load(a + at + j), load(b + at + j))));
}

// The dtypes a model streams (each vector kernel is one more instantiation per op and dtype).
template <class S> constexpr bool kVectorized = std::is_same_v<S, float> || std::is_same_v<S, BF16> || std::is_same_v<S, F16>;

// Every operand contiguous over the output's shape and 16-byte aligned: the vector kernels apply.
bool vectorizable(const Indexer& ix, std::initializer_list<const void*> ptrs) {
  if (!ix.contiguous) return false;
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

template <class S> __global__ void where_k(int64_t n, Indexer ix, S* y, const bool* c, const S* a, const S* b) {
  SINTER_GRID_STRIDE(i, n) {
    int64_t off[kMaxOperands];
    ix.offsets(i, off);
    store(y + off[0], c[off[1]] ? load(a + off[2]) : load(b + off[3]));
  }
}

template <class I, class O> __global__ void cast_k(int64_t n, Indexer ix, O* y, const I* x) {
  SINTER_GRID_STRIDE(i, n) {
    int64_t off[kMaxOperands];
    ix.offsets(i, off);
    store(y + off[0], convert_to<O>(load(x + off[1])));
  }
}

template <class S> __global__ void clamp_k(int64_t n, Indexer ix, S* y, const S* x, bool has_lo, double lo, bool has_hi, double hi) {
  using C = compute_t<S>;
  const C l = C(lo), h = C(hi);
  SINTER_GRID_STRIDE(i, n) {
    int64_t off[kMaxOperands];
    ix.offsets(i, off);
    C v = load(x + off[1]);
    if (has_lo && v < l) v = l;
    if (has_hi && v > h) v = h;
    store(y + off[0], v);
  }
}

// t as dtype dt (a copy on the device only when it has another dtype).
Tensor as_dtype(const Tensor& t, DType dt) { return t.dtype() == dt ? t : t.to(dt); }

template <class F, Rule R> void unary_op(const char* op, std::span<const Tensor> in, std::span<Tensor> out) {
  const Tensor x = as_dtype(in[0], out[0].dtype());
  const Indexer ix = make_indexer(op, out[0], {&x});
  dispatch<R == Rule::keep ? Types::numeric : Types::floating>(out[0].dtype(), op, [&](auto tag) {
    using S = decltype(tag);
    if constexpr (kVectorized<S>)
      if (vectorizable(ix, {out[0].data_ptr(), x.data_ptr()})) return launch(op, out[0], unary_vec_k<F, S>, ptr<S>(out[0]), ptr<const S>(x));
    launch(op, out[0], unary_k<F, S, S>, ix, ptr<S>(out[0]), ptr<const S>(x));
  });
}

template <class F, Rule R> void binary_op(const char* op, std::span<const Tensor> in, std::span<Tensor> out) {
  DType dt = promote_types(in[0].dtype(), in[1].dtype());
  if (R == Rule::true_div && !is_floating(dt)) dt = DType::f32;
  const Tensor a = as_dtype(in[0], dt), b = as_dtype(in[1], dt);
  const Indexer ix = make_indexer(op, out[0], {&a, &b});
  constexpr Types T = R == Rule::compare ? Types::all : R == Rule::true_div ? Types::floating : Types::numeric;
  dispatch<T>(dt, op, [&](auto tag) {
    using S = decltype(tag);
    if constexpr (R == Rule::compare) {
      launch(op, out[0], binary_k<F, S, bool>, ix, ptr<bool>(out[0]), ptr<const S>(a), ptr<const S>(b));
    } else {
      if constexpr (kVectorized<S>)
        if (vectorizable(ix, {out[0].data_ptr(), a.data_ptr(), b.data_ptr()}))
          return launch(op, out[0], binary_vec_k<F, S>, ptr<S>(out[0]), ptr<const S>(a), ptr<const S>(b));
      launch(op, out[0], binary_k<F, S, S>, ix, ptr<S>(out[0]), ptr<const S>(a), ptr<const S>(b));
    }
  });
}

void clamp_op(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  const Indexer ix = make_indexer("clamp", out[0], {&in[0]});
  dispatch<Types::numeric>(out[0].dtype(), "clamp", [&](auto tag) {
    using S = decltype(tag);
    launch("clamp", out[0], clamp_k<S>, ix, ptr<S>(out[0]), ptr<const S>(in[0]), a.has("min"), a.has("min") ? a.f("min") : 0.0, a.has("max"),
           a.has("max") ? a.f("max") : 0.0);
  });
}

// self op= other (other broadcast to self's shape, in self's dtype).
template <class F> void inplace_op(const char* op, std::span<const Tensor> in, std::span<Tensor> out) {
  const Tensor& self = out[0];
  const Tensor other = as_dtype(in[1], self.dtype());
  const Indexer ix = make_indexer(op, self, {&self, &other});
  dispatch<Types::numeric>(self.dtype(), op, [&](auto tag) {
    using S = decltype(tag);
    launch(op, self, binary_k<F, S, S>, ix, ptr<S>(self), ptr<const S>(self), ptr<const S>(other));
  });
}

void where_op(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) { where_into("where", in[0], in[1], in[2], out[0]); }

}  // namespace

void where_into(const char* op, const Tensor& cond, const Tensor& a_in, const Tensor& b_in, const Tensor& out) {
  const Tensor c = as_dtype(cond, DType::boolean), a = as_dtype(a_in, out.dtype()), b = as_dtype(b_in, out.dtype());
  const Indexer ix = make_indexer(op, out, {&c, &a, &b});
  dispatch<Types::all>(out.dtype(), op, [&](auto tag) {
    using S = decltype(tag);
    launch(op, out, where_k<S>, ix, ptr<S>(out), ptr<const bool>(c), ptr<const S>(a), ptr<const S>(b));
  });
}

// dst = src converted to dst's dtype, src broadcast to dst's shape; both on one device.
void copy_convert(const char* op, const Tensor& src, const Tensor& dst) {
  const Indexer ix = make_indexer(op, dst, {&src});
  dispatch<Types::all>(src.dtype(), op, [&](auto in_tag) {
    using I = decltype(in_tag);
    dispatch<Types::all>(dst.dtype(), op, [&](auto out_tag) {
      using O = decltype(out_tag);
      launch(op, dst, cast_k<I, O>, ix, ptr<O>(dst), ptr<const I>(src));
    });
  });
}

void add_into(const char* op, const Tensor& acc, const Tensor& b) {
  const Tensor bb = as_dtype(b, acc.dtype());
  const Indexer ix = make_indexer(op, acc, {&acc, &bb});
  dispatch<Types::numeric>(acc.dtype(), op, [&](auto tag) {
    using S = decltype(tag);
    launch(op, acc, binary_k<fn::Add, S, S>, ix, ptr<S>(acc), ptr<const S>(acc), ptr<const S>(bb));
  });
}

void register_elementwise_kernels() {
  constexpr DeviceType kCuda = DeviceType::cuda;
#define UNARY(F, name, rule, dx) \
  register_kernel(#name, kCuda, [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) { unary_op<fn::F, rule_of(#rule)>(#name, in, out); });
#define BINARY(F, name, rule, da, db) \
  register_kernel(#name, kCuda, [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) { binary_op<fn::F, rule_of(#rule)>(#name, in, out); });
#include "ops/elementwise.def"
#undef UNARY
#undef BINARY
  register_kernel("where", kCuda, where_op);
  register_kernel("cast", kCuda, [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) { copy_convert("cast", in[0], out[0]); });
  register_kernel("copy", kCuda, [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) { copy_convert("copy", in[0], out[0]); });
  register_kernel("copy_", kCuda, [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
    // From an overlapping view of the same storage through a temporary.
    copy_convert("copy_", in[1].storage() == out[0].storage() ? in[1].clone() : in[1], out[0]);
  });
  register_kernel("clamp", kCuda, clamp_op);
  register_kernel("add_", kCuda, [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) { inplace_op<fn::Add>("add_", in, out); });
  register_kernel("sub_", kCuda, [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) { inplace_op<fn::Sub>("sub_", in, out); });
  register_kernel("mul_", kCuda, [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) { inplace_op<fn::Mul>("mul_", in, out); });
  register_kernel("div_", kCuda, [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) { inplace_op<fn::Div>("div_", in, out); });
  register_kernel("fill_", kCuda, [](std::span<const Tensor>, std::span<Tensor> out, const Attrs& a) {
    copy_convert("fill_", full({}, a.f("value"), out[0].dtype(), out[0].device()), out[0]);
  });
}

}  // namespace sinter::cuda

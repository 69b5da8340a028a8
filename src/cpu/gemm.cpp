// Dense GEMM. f32 and bf16 go to oneDNN's matmul primitive (chosen by measurement: BENCHMARKS.md);
// other dtypes (f64 for gradchecks, integers) use a plain loop that accumulates in double / int64.
#include <dnnl.hpp>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "cpu/cpu.h"

namespace sinter::cpu {
namespace {

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

dnnl::memory::data_type dnnl_type(DType t) {
  switch (t) {
    case DType::f32: return dnnl::memory::data_type::f32;
    case DType::bf16: return dnnl::memory::data_type::bf16;
    default: return dnnl::memory::data_type::undef;
  }
}

// oneDNN wants each matrix row- or column-major (unit stride in one of the last two dims).
bool plain_matrix(const Tensor& t) {
  const int64_t r = t.stride(1), c = t.stride(2);
  return (c == 1 && r >= std::max<int64_t>(t.size(2), 1)) || (r == 1 && c >= std::max<int64_t>(t.size(1), 1));
}

// Size-1 dims may carry any stride; give them the one a dense layout would have.
Tensor normalized(const Tensor& t) {
  Shape st = t.strides();
  const int64_t r = t.size(1), c = t.size(2);
  if (r == 1) st[1] = st[2] == 1 ? std::max<int64_t>(c, 1) : 1;
  if (c == 1) st[2] = st[1] == 1 ? std::max<int64_t>(r, 1) : 1;
  if (t.size(0) == 1) st[0] = std::max<int64_t>(r * c, 1);
  return Tensor::from_storage(t.storage(), t.shape(), st, t.offset(), t.dtype());
}

Tensor plain(const Tensor& t0) {
  Tensor t = normalized(t0);
  if (plain_matrix(t) && (t.size(0) == 1 || t.stride(0) != 0)) return t;
  Tensor c = Tensor::empty(t.shape(), t.dtype());
  copy(t, c);
  return c;
}

// A single matrix goes to oneDNN as 2-D: its batched (3-D) matmul picks other, slower kernels.
dnnl::memory::desc md(const Tensor& t, DType as) {
  dnnl::memory::dims dims(t.shape().begin(), t.shape().end()), strides(t.strides().begin(), t.strides().end());
  if (dims[0] == 1) {
    dims.erase(dims.begin());
    strides.erase(strides.begin());
  }
  return dnnl::memory::desc(dims, dnnl_type(as), strides);
}

void gemm_dnnl(const Tensor& a0, const Tensor& b0, const Tensor& c0, const Tensor& bias) {
  Tensor a = plain(a0), b = plain(b0), c = normalized(c0);
  auto a_md = md(a, a.dtype()), b_md = md(b, b.dtype()), c_md = md(c, c.dtype());
  dnnl::memory::desc bias_md;
  if (bias.defined())
    bias_md = c.size(0) == 1 ? dnnl::memory::desc({1, c.size(2)}, dnnl_type(bias.dtype()), {c.size(2), 1})
                             : dnnl::memory::desc({1, 1, c.size(2)}, dnnl_type(bias.dtype()), {c.size(2), c.size(2), 1});
  // The primitive cache makes re-creating an identical primitive cheap.
  dnnl::matmul prim;
  try {
    prim = dnnl::matmul(bias.defined() ? dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, bias_md, c_md), engine())
                                       : dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), engine()));
  } catch (const dnnl::error& e) {
    SINTER_THROW(Error, "[matmul] oneDNN has no ", a.dtype(), " matmul for a", a.shape(), " b", b.shape(), " here: ", e.what());
  }
  auto mem = [&](const dnnl::memory::desc& d, const Tensor& t) { return dnnl::memory(d, engine(), t.data_ptr()); };
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, mem(a_md, a)}, {DNNL_ARG_WEIGHTS, mem(b_md, b)},
                                             {DNNL_ARG_DST, mem(c_md, c)}};
  if (bias.defined()) args.emplace(DNNL_ARG_BIAS, mem(bias_md, bias));
  static thread_local dnnl::stream stream(engine());
  prim.execute(stream, args);
  stream.wait();
}

}  // namespace

bool dnnl_has_bf16() {
  // oneDNN 2.6 runs bf16 matmul on AVX512 CPUs only; ask it once with a tiny primitive.
  static const bool ok = [] {
    try {
      const auto bf = dnnl::memory::data_type::bf16;
      dnnl::memory::desc m({2, 2}, bf, dnnl::memory::format_tag::ab);
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(m, m, m), engine());
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return ok;
}

namespace {

template <class T> void gemm_loop(const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& bias) {
  using A = std::conditional_t<std::is_floating_point_v<compute_t<T>>, double, int64_t>;
  const int64_t B = c.size(0), M = c.size(1), N = c.size(2), K = a.size(2);
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  const T* pbias = bias.defined() ? bias.data<T>() : nullptr;
  T* pc = c.data<T>();
  const int64_t sa0 = a.stride(0), sa1 = a.stride(1), sa2 = a.stride(2);
  const int64_t sb0 = b.stride(0), sb1 = b.stride(1), sb2 = b.stride(2);
  parallel_for(0, B * M, std::max<int64_t>(1, 4096 / std::max<int64_t>(N * K, 1)), [&](int64_t lo, int64_t hi) {
    std::vector<A> acc(static_cast<size_t>(N));
    for (int64_t bm = lo; bm < hi; ++bm) {
      const int64_t bi = bm / M, m = bm % M;
      for (int64_t n = 0; n < N; ++n) acc[size_t(n)] = pbias ? A(compute_t<T>(pbias[n])) : A(0);
      for (int64_t k = 0; k < K; ++k) {
        const A av = A(compute_t<T>(pa[bi * sa0 + m * sa1 + k * sa2]));
        const T* brow = pb + bi * sb0 + k * sb1;
        for (int64_t n = 0; n < N; ++n) acc[size_t(n)] += av * A(compute_t<T>(brow[n * sb2]));
      }
      for (int64_t n = 0; n < N; ++n) pc[(bi * M + m) * N + n] = convert<T>(acc[size_t(n)]);
    }
  });
}

}  // namespace

void gemm(const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& bias) {
  SINTER_ASSERT(a.dim() == 3 && b.dim() == 3 && c.dim() == 3 && c.is_contiguous());
  if (c.numel() == 0) return;
  if (a.size(2) == 0) {  // empty inner dimension: just the bias
    if (bias.defined()) copy(bias, c);
    else fill(c, 0.0);
    return;
  }
  if (a.dtype() == DType::f32 || (a.dtype() == DType::bf16 && dnnl_has_bf16())) {
    gemm_dnnl(a, b, c, bias);
    return;
  }
  if (a.dtype() == DType::f16 || a.dtype() == DType::bf16) {  // no f16 matmul in oneDNN 2.6, bf16 needs AVX512: widen
    auto widen = [](const Tensor& t) {
      Tensor w = Tensor::empty(t.shape(), DType::f32);
      copy(t, w);
      return w;
    };
    Tensor cf = Tensor::empty(c.shape(), DType::f32);
    gemm_dnnl(widen(a), widen(b), cf, bias.defined() ? widen(bias) : Tensor());
    copy(cf, c);
    return;
  }
  visit_dtype(a.dtype(), [&]<class T>() {
    if constexpr (std::is_same_v<T, bool>) SINTER_THROW(DTypeError, "[matmul] bool tensors are not supported");
    else gemm_loop<T>(a, b, c, bias);
  });
}

}  // namespace sinter::cpu

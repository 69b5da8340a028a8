// Dense GEMM. f32 and bf16 go to oneDNN's matmul primitive (chosen by measurement: BENCHMARKS.md),
// except products of a few rows (decode), which our kernel below runs: f32 where oneDNN's per-call
// cost or its GEMM loses, bf16 weights where oneDNN has no bf16 matmul (AVX2). Other dtypes (f64
// for gradchecks, integers) use a plain loop that accumulates in double / int64.
#include <algorithm>
#include <cstring>
#include <dnnl.hpp>
#include <immintrin.h>
#include <string>
#include <unordered_map>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "cpu/cpu.h"
#include "cpu/simd/lanes.h"
#include "cpu/sparse24/kernels.h"

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

// A matmul primitive and its memory objects, made once per layout: creating a primitive descriptor
// costs ~25 us, more than a whole small GEMM (generation runs hundreds of them per token).
struct Prepared {
  dnnl::matmul prim;
  dnnl::memory a, b, c, bias, residual;
};

// The oneDNN activation of an eager unary op, where it has one.
std::optional<dnnl::algorithm> dnnl_act(UnaryOp op) {
  switch (op) {
    case UnaryOp::Relu: return dnnl::algorithm::eltwise_relu;
    case UnaryOp::GeluTanh: return dnnl::algorithm::eltwise_gelu_tanh;
    case UnaryOp::Gelu: return dnnl::algorithm::eltwise_gelu_erf;
    case UnaryOp::Silu: return dnnl::algorithm::eltwise_swish;  // x * sigmoid(alpha x), alpha 1
    case UnaryOp::Sigmoid: return dnnl::algorithm::eltwise_logistic;
    case UnaryOp::Tanh: return dnnl::algorithm::eltwise_tanh;
    default: return std::nullopt;
  }
}

// Whether oneDNN should apply the activation as a post-op (where it has one) rather than our
// kernel in a pass over the GEMM's output: where its post-op costs no more. Measured with
// linear_fused against the GEMM followed by our kernel, alternating, best of 15-60 (2 threads):
// on an AMD Zen 3 (oneDNN's AVX2 kernels) the post-op takes 1.12x the time at 512 x 1024 x 4096
// and 1.82x at 2048 x 128 x 512 for gelu_tanh, 1.06x / 1.52x for tanh, 0.99-1.05x for gelu, silu
// and sigmoid, 0.88-1.07x for relu; on an Intel Xeon (AVX-512) gelu_tanh's post-op cost what our
// pass does (3.6% of the 512 x 1024 x 4096 GEMM). Our pass also computes eager's bits.
bool dnnl_post_op_pays(UnaryOp op) {
  if (!dnnl_act(op)) return false;
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  return avx512 || (op != UnaryOp::GeluTanh && op != UnaryOp::Tanh);
}

Prepared make_prepared(const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& bias, const GemmEpilogue& ep) {
  auto a_md = md(a, a.dtype()), b_md = md(b, b.dtype()), c_md = md(c, c.dtype());
  dnnl::memory::desc bias_md;
  if (bias.defined())
    bias_md = c.size(0) == 1 ? dnnl::memory::desc({1, c.size(2)}, dnnl_type(bias.dtype()), {c.size(2), 1})
                             : dnnl::memory::desc({1, 1, c.size(2)}, dnnl_type(bias.dtype()), {c.size(2), c.size(2), 1});
  Prepared p;
  dnnl::primitive_attr attr;
  if (!ep.empty()) {
    dnnl::post_ops po;
    if (ep.act) po.append_eltwise(1.f, *dnnl_act(*ep.act), *ep.act == UnaryOp::Silu ? 1.f : 0.f, 0.f);
    if (ep.residual.defined()) po.append_binary(dnnl::algorithm::binary_add, c_md);
    attr.set_post_ops(po);
  }
  try {
    p.prim = dnnl::matmul(bias.defined() ? dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, bias_md, c_md), attr, engine())
                                         : dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), attr, engine()));
  } catch (const dnnl::error& e) {
    SINTER_THROW(Error, "[matmul] oneDNN has no ", a.dtype(), " matmul for a", a.shape(), " b", b.shape(), " here: ", e.what());
  }
  p.a = dnnl::memory(a_md, engine(), DNNL_MEMORY_NONE);
  p.b = dnnl::memory(b_md, engine(), DNNL_MEMORY_NONE);
  p.c = dnnl::memory(c_md, engine(), DNNL_MEMORY_NONE);
  if (bias.defined()) p.bias = dnnl::memory(bias_md, engine(), DNNL_MEMORY_NONE);
  if (ep.residual.defined()) p.residual = dnnl::memory(c_md, engine(), DNNL_MEMORY_NONE);
  return p;
}

void gemm_dnnl(const Tensor& a0, const Tensor& b0, const Tensor& c0, const Tensor& bias, const GemmEpilogue& ep = {}) {
  Tensor a = plain(a0), b = plain(b0), c = normalized(c0);
  // Key: dtypes, shapes and strides of a, b, c, whether there is a bias, and the epilogue.
  int64_t key[3 * 7 + 3];
  int k = 0;
  for (const Tensor* t : {&a, &b, &c}) {
    key[k++] = int64_t(t->dtype());
    for (int d = 0; d < 3; ++d) key[k++] = t->size(d), key[k++] = t->stride(d);
  }
  key[k++] = bias.defined() ? int64_t(bias.dtype()) + 1 : 0;
  key[k++] = ep.act ? int64_t(*ep.act) + 1 : 0;
  key[k++] = ep.residual.defined();
  thread_local std::unordered_map<std::string, Prepared> cache;
  std::string skey(reinterpret_cast<const char*>(key), sizeof key);
  auto it = cache.find(skey);
  if (it == cache.end()) {
    if (cache.size() >= 512) cache.clear();  // a bound for programs that see endless shapes
    it = cache.emplace(std::move(skey), make_prepared(a, b, c, bias, ep)).first;
  }
  Prepared& p = it->second;
  p.a.set_data_handle(a.data_ptr());
  p.b.set_data_handle(b.data_ptr());
  p.c.set_data_handle(c.data_ptr());
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, p.a}, {DNNL_ARG_WEIGHTS, p.b}, {DNNL_ARG_DST, p.c}};
  if (bias.defined()) {
    p.bias.set_data_handle(bias.data_ptr());
    args.emplace(DNNL_ARG_BIAS, p.bias);
  }
  if (ep.residual.defined()) {
    p.residual.set_data_handle(ep.residual.data_ptr());
    args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(ep.act ? 1 : 0) | DNNL_ARG_SRC_1, p.residual);
  }
  static thread_local dnnl::stream stream(engine());
  p.prim.execute(stream, args);
  stream.wait();
}

// y(M, N) = x(M, K) w(N, K)^T (+ bias) for a few rows (decode): dot products along contiguous K,
// four rows of x sharing each load of w. oneDNN spends ~5 us per call in its own bookkeeping,
// more than these products take; threads split N only when there is enough work.
typedef float fvec __attribute__((vector_size(simd::kVectorBytes)));
constexpr int kV = simd::kVectorBytes / 4;  // floats per register

SINTER_INLINE fvec load_v(const float* p) {
  fvec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The four horizontal sums of a, b, c, d.
SINTER_INLINE void hsum4(fvec a, fvec b, fvec c, fvec d, float* out) {
#if defined(__AVX2__)
  auto half = [](fvec v) {
#if defined(__AVX512F__)
    return (__m256)(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) + __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15));
#else
    return (__m256)v;
#endif
  };
  const __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(half(a), half(b)), _mm256_hadd_ps(half(c), half(d)));
  _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1)));
#else
  const fvec* v[4] = {&a, &b, &c, &d};
  for (int j = 0; j < 4; ++j) {
    out[j] = 0;
    for (int l = 0; l < kV; ++l) out[j] += (*v[j])[l];
  }
#endif
}

// kV weights as f32.
SINTER_INLINE fvec load_w(const float* p) { return load_v(p); }
SINTER_INLINE fvec load_w(const bf16* p) { return simd::widen_bf16(p); }

// R (1-4) rows of x against weight rows [lo, hi), four weight rows at a time: 4R vector
// accumulators, each x load used four times and each w load R times; one joint horizontal sum.
template <int R, class W>
void few_rows_block(const float* const* xr, const W* w, const float* bias, float* y, int64_t ldy, int64_t lo, int64_t hi,
                    int64_t K) {
  const int64_t kv = K / kV * kV;
  int64_t n = lo;
  for (; n + 4 <= hi; n += 4) {
    fvec acc[R][4] = {};
    // 1 KiB ahead in each of the four weight rows: the hardware prefetcher alone keeps too few
    // lines in flight for four streams (bf16 at M = 1: 0.87 of a plain read without, 1.2 with).
    // bf16: past a row's end the prefetch moves to the same row of the next four, whose first KiB
    // would otherwise start cold (M = 1, 13824 rows of 5120, Intel Xeon: 3.63-3.81 ms, against
    // 4.24-4.49 staying in the row); f32 keeps running on into the next row in memory (moving
    // made its 20 KiB rows 12% slower).
    constexpr int64_t ahead = 1024 / int64_t(sizeof(W));
    const int64_t turn = sizeof(W) == 2 ? std::max<int64_t>(0, std::min(kv, K - ahead)) : kv;
    for (int64_t k = 0; k < kv; k += kV) {
      const int64_t pf = k < turn ? k + ahead : 3 * K + k + ahead;  // past the end: row n + j + 4, from its start
      fvec xv[R];
      for (int r = 0; r < R; ++r) xv[r] = load_v(xr[r] + k);
      for (int j = 0; j < 4; ++j) {
        __builtin_prefetch(w + (n + j) * K + pf);
        const fvec wv = load_w(w + (n + j) * K + k);
        for (int r = 0; r < R; ++r) acc[r][j] += xv[r] * wv;
      }
    }
    for (int r = 0; r < R; ++r) {
      float s[4];
      hsum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3], s);
      for (int j = 0; j < 4; ++j) {
        for (int64_t k = kv; k < K; ++k) s[j] += xr[r][k] * float(w[(n + j) * K + k]);
        y[r * ldy + n + j] = s[j] + (bias ? bias[n + j] : 0.0f);
      }
    }
  }
  for (; n < hi; ++n)
    for (int r = 0; r < R; ++r) {
      float s = bias ? bias[n] : 0.0f;
      for (int64_t k = 0; k < K; ++k) s += xr[r][k] * float(w[n * K + k]);
      y[r * ldy + n] = s;
    }
}

// Threads split N in chunks of at least 8K multiply-adds; within a thread's rows, every pair of x
// rows passes over a block of weight rows small enough to stay in L1/L2 (~64 KiB), so weights too
// large for the cache are read from memory once whatever M is. Small weights are split too: in a
// decode step each layer's 64-256 KiB come from L2, whose bandwidth bounds a one-row product, and
// two cores read from two L2s (tiny model, 2 threads: 1.2x per token over one core per product).
// Columns [lo, hi) of y(M, N) = x(M, K) w(N, K)^T (+ bias) on the calling thread.
template <class W>
void few_rows_cols(const float* x, const W* w, const float* bias, float* y, int64_t M, int64_t N, int64_t K, int64_t lo, int64_t hi) {
  const int64_t block = std::max<int64_t>(4, (int64_t(1) << 16) / std::max<int64_t>(K * int64_t(sizeof(W)), 1) / 4 * 4);
  for (int64_t n0 = lo; n0 < hi; n0 += block) {
    const int64_t n1 = std::min(hi, n0 + block);
    // Passes of two rows of x; the last three in one (7 loads a 12 multiply-adds, where 2 + 1 rows
    // took 11), and the last four with AVX-512's 32 registers (the weights read once).
    for (int64_t m0 = 0; m0 < M;) {
      const int64_t left = M - m0, r = left == 3 || (kV == 16 && left == 4) ? left : std::min<int64_t>(2, left);
      const float* xr[4];
      for (int64_t i = 0; i < 4; ++i) xr[i] = x + std::min(m0 + i, M - 1) * K;
      float* yr = y + m0 * N;
      switch (r) {
        case 1: few_rows_block<1>(xr, w, bias, yr, N, n0, n1, K); break;
        case 2: few_rows_block<2>(xr, w, bias, yr, N, n0, n1, K); break;
        case 3: few_rows_block<3>(xr, w, bias, yr, N, n0, n1, K); break;
        default: few_rows_block<4>(xr, w, bias, yr, N, n0, n1, K); break;
      }
      m0 += r;
    }
  }
}

// Splits N weight rows of K elements of `elem` bytes over the threads for M rows of x and calls
// rows(lo, hi) on each part. Weights past 4 MB: chunks of ~256 KiB taken as threads free up, so a
// core slowed by the other's memory traffic does not leave its partner waiting at the end.
template <class F> void few_rows_parallel(int64_t N, int64_t K, int64_t elem, int64_t M, const F& rows) {
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 13) / std::max<int64_t>(K * M, 1));
  if (N * K * elem < (int64_t(4) << 20) || num_threads() < 2) {
    parallel_for(0, N, grain, rows);
    return;
  }
  const int64_t chunk = std::max<int64_t>(4, (int64_t(1) << 18) / (K * elem) / 4 * 4);
  parallel_dynamic(0, (N + chunk - 1) / chunk, [&](auto next) {
    for (int64_t c = next(); c >= 0; c = next()) rows(c * chunk, std::min(N, (c + 1) * chunk));
  });
}

template <class W>
void gemm_few_rows(const float* x, const W* w, const float* bias, float* y, int64_t M, int64_t N, int64_t K) {
  few_rows_parallel(N, K, int64_t(sizeof(W)), M, [&](int64_t lo, int64_t hi) { few_rows_cols(x, w, bias, y, M, N, K, lo, hi); });
}

// bf16 weights and activations on a CPU without a bf16 matmul: widening the whole weight to f32
// for oneDNN each call cost 5x the f32 product at M = 1 (`sinter bench linear`); here the
// weights are widened in registers as they are read, and only x (M x K) and the bias up front.
void gemm_few_rows_bf16(const bf16* x, const bf16* w, const bf16* bias, bf16* y, int64_t M, int64_t N, int64_t K) {
  // x, bias and y in f32, one buffer per calling thread kept across calls: this runs every
  // decode step, where three allocations a call would cost as much as a small layer's product.
  thread_local std::vector<float> scratch;
  scratch.resize(size_t(M * K + (bias ? N : 0) + M * N));
  float* xf = scratch.data();
  float* bf = xf + M * K;
  float* yf = bf + (bias ? N : 0);
  for (int64_t i = 0; i < M * K; ++i) xf[i] = float(x[i]);
  for (int64_t i = 0; bias && i < N; ++i) bf[i] = float(bias[i]);
  gemm_few_rows<bf16>(xf, w, bias ? bf : nullptr, yf, M, N, K);
  for (int64_t i = 0; i < M * N; ++i) y[i] = bf16(yf[i]);
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

// The plain GEMM (f64 and the integers): each output starts from its bias and adds a[m][k] * b[k][n]
// for k in order. Tiles of R rows x C columns keep their sums in registers, a load or two per
// product; a b whose rows are strided (a transposed view) is copied dense first.
template <class A, class T, int64_t R, int64_t C>
void gemm_tile(const T* a, int64_t sa1, int64_t sa2, const T* b, int64_t sb1, const T* bias, int64_t K, T* c, int64_t N) {
  A acc[R][C];
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < C; ++j) acc[r][j] = bias ? A(compute_t<T>(bias[j])) : A(0);
  for (int64_t k = 0; k < K; ++k) {
    const T* brow = b + k * sb1;
    for (int64_t r = 0; r < R; ++r) {
      const A av = A(compute_t<T>(a[r * sa1 + k * sa2]));
      for (int64_t j = 0; j < C; ++j) acc[r][j] += av * A(compute_t<T>(brow[j]));
    }
  }
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < C; ++j) c[r * N + j] = convert<T>(acc[r][j]);
}

// The same sums for the edges: `rows` <= R rows, `cols` <= C columns, b's columns sb2 apart.
template <class A, class T, int64_t C>
void gemm_edge(const T* a, int64_t sa1, int64_t sa2, const T* b, int64_t sb1, int64_t sb2, const T* bias, int64_t K, T* c,
               int64_t N, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    A acc[C];
    for (int64_t j = 0; j < cols; ++j) acc[j] = bias ? A(compute_t<T>(bias[j])) : A(0);
    for (int64_t k = 0; k < K; ++k) {
      const A av = A(compute_t<T>(a[r * sa1 + k * sa2]));
      for (int64_t j = 0; j < cols; ++j) acc[j] += av * A(compute_t<T>(b[k * sb1 + j * sb2]));
    }
    for (int64_t j = 0; j < cols; ++j) c[r * N + j] = convert<T>(acc[j]);
  }
}

template <class T> void gemm_loop(const Tensor& a, const Tensor& b_in, const Tensor& c, const Tensor& bias) {
  using A = std::conditional_t<std::is_floating_point_v<compute_t<T>>, double, int64_t>;
  constexpr int64_t R = 2, C = 8;
  const int64_t B = c.size(0), M = c.size(1), N = c.size(2), K = a.size(2);
  Tensor b = b_in;
  if (b.stride(2) != 1 && N > 1 && M > 1) b = Tensor::empty(b_in.shape(), b_in.dtype()), copy(b_in, b);
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  const T* pbias = bias.defined() ? bias.data<T>() : nullptr;
  T* pc = c.data<T>();
  const int64_t sa0 = a.stride(0), sa1 = a.stride(1), sa2 = a.stride(2);
  const int64_t sb0 = b.stride(0), sb1 = b.stride(1), sb2 = b.stride(2);
  const int64_t blocks = (M + R - 1) / R;
  parallel_for(0, B * blocks, std::max<int64_t>(1, 4096 / std::max<int64_t>(R * N * K, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t bi = t / blocks, m0 = t % blocks * R, rows = std::min(R, M - m0);
      const T* at = pa + bi * sa0 + m0 * sa1;
      T* ct = pc + (bi * M + m0) * N;
      for (int64_t n0 = 0; n0 < N; n0 += C) {
        const T* bt = pb + bi * sb0 + n0 * sb2;
        const T* biast = pbias ? pbias + n0 : nullptr;
        if (rows == R && n0 + C <= N && sb2 == 1) gemm_tile<A, T, R, C>(at, sa1, sa2, bt, sb1, biast, K, ct + n0, N);
        else gemm_edge<A, T, C>(at, sa1, sa2, bt, sb1, sb2, biast, K, ct + n0, N, rows, std::min(C, N - n0));
      }
    }
  });
}

}  // namespace

// Whether one row of x against an f32 weight of N x K goes to Sinter's kernel. Measured on an
// AVX-512 Xeon: 1.1-1.3x a plain read of the weight's bytes, 1.5x oneDNN's GEMV on 283 MB
// (`sinter bench linear`). On AVX2 CPUs the only measurement is of the kernel without its
// software prefetch, at 0.79x oneDNN's GEMV (4096 x 4096, Zen 3): weights past 4 MB stay with oneDNN.
namespace {
bool one_row_ours(int64_t N, int64_t K) {
#if defined(__AVX512F__)
  (void)N, (void)K;
  return true;
#else
  return N * K <= (int64_t(1) << 20);
#endif
}
}  // namespace

bool few_rows_multi(const Tensor& x, std::span<const Tensor> w, std::span<const Tensor> bias, std::span<Tensor> y) {
  const int64_t K = x.size(-1), M = x.numel() / std::max<int64_t>(K, 1);
  if (x.dtype() != DType::f32 || M > 8 || M == 0 || K == 0 || !x.is_contiguous()) return false;
  int64_t total = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    if (w[i].dtype() != DType::f32 || !w[i].is_contiguous() || !y[i].is_contiguous() || (bias[i].defined() && !bias[i].is_contiguous()))
      return false;
    total += w[i].size(0);
  }
  if (M == 1 && !one_row_ours(total, K)) return false;
  // Rows [lo, hi) of the weights stacked.
  few_rows_parallel(total, K, 4, M, [&](int64_t lo, int64_t hi) {
    int64_t at = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      const int64_t N = w[i].size(0), a = std::max(lo, at), b = std::min(hi, at + N);
      if (a < b)
        few_rows_cols(x.data<float>(), w[i].data<float>(), bias[i].defined() ? bias[i].data<float>() : nullptr, y[i].data<float>(), M, N,
                      K, a - at, b - at);
      at += N;
    }
  });
  return true;
}

namespace {

// The GEMM on the path its shapes and dtypes choose; true when that path applied the epilogue too.
bool gemm_core(const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& bias, const GemmEpilogue& ep) {
  if (c.numel() == 0) return false;
  if (a.size(2) == 0) {  // empty inner dimension: just the bias
    if (bias.defined()) copy(bias, c);
    else fill(c, 0.0);
    return false;
  }
  const int64_t M = a.size(1), K = a.size(2), N = b.size(2);
  // A linear's layout, which Sinter's own kernels take: x's rows, and the weight's rows as b's columns.
  const bool rows = a.size(0) == 1 && a.stride(2) == 1 && a.stride(1) == K && b.stride(1) == 1 && b.stride(2) == K &&
                    (!bias.defined() || bias.is_contiguous());
  const bool all_bf16 = a.dtype() == DType::bf16 && b.dtype() == DType::bf16 && c.dtype() == DType::bf16;
  // Decode-sized products (M <= 8) are ours: in cache oneDNN's per-call cost dominates, past it
  // ours streams the weights at memory speed at M = 1 (one_row_ours), and at 2 <= M <= 8 oneDNN
  // runs a GEMM that costs 2-3x ours (4096 x 11008 at M = 2: ~16 ms against ~5; `sinter bench linear`).
  if (a.dtype() == DType::f32 && rows && M <= 8 && (M >= 2 || one_row_ours(N, K))) {
    gemm_few_rows<float>(a.data<float>(), b.data<float>(), bias.defined() ? bias.data<float>() : nullptr, c.data<float>(), M, N, K);
    return false;
  }
  // bf16 decode: ours at every size without a bf16 matmul in oneDNN (the alternative widens the
  // whole weight each call), and at M <= 4 with one: oneDNN 2.6's bf16 GEMV reads at a third of
  // memory speed, and its AMX GEMM at M = 2-4 takes 1.8-2.3x our time (5120 x 13824, Xeon).
  if (all_bf16 && rows && (!dnnl_has_bf16() || M <= 4) && M <= 8 && (!bias.defined() || bias.dtype() == DType::bf16)) {
    gemm_few_rows_bf16(a.data<bf16>(), b.data<bf16>(), bias.defined() ? bias.data<bf16>() : nullptr, c.data<bf16>(), M, N, K);
    return false;
  }
  // bf16 from 5 rows on a weight of 4M values or more: the tile unit (AMX) through the 2:4
  // kernel's tile code on plain rows. Measured against oneDNN 2.6's AMX GEMM (Xeon, 2 threads):
  // 4096 x 4096 1.12-1.47x, 13824 x 5120 0.98-1.28x at M = 5-2048; 3072 x 768 and 1000 x 1000
  // 0.91-1.08x, and 288 x 96 0.33-0.50x (the packing and the threads' start cost more than the
  // product), so smaller weights stay with oneDNN.
  if (all_bf16 && rows && N * K >= (int64_t(1) << 22)) {
    const Tensor b32 = bias.defined() ? contiguous_as(bias, DType::f32) : Tensor();  // the kernel's epilogue adds an f32 bias
    auto u16 = [](const Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data<bf16>()); };
    if (sparse::amx_dense_bf16(u16(a), u16(b), bias.defined() ? b32.data<float>() : nullptr, reinterpret_cast<uint16_t*>(c.data<bf16>()), M,
                               N, K))
      return false;
  }
  if (a.dtype() == DType::f32 || (a.dtype() == DType::bf16 && dnnl_has_bf16())) {
    const bool fuse = !ep.empty() && (!ep.act || dnnl_post_op_pays(*ep.act)) && (!ep.residual.defined() || ep.residual.is_contiguous());
    gemm_dnnl(a, b, c, bias, fuse ? ep : GemmEpilogue{});
    return fuse;
  }
  if (a.dtype() == DType::f16 || a.dtype() == DType::bf16) {  // no f16 matmul in oneDNN 2.6, bf16 needs AVX512: widen
    auto widen = [](const Tensor& t) {
      // Keep the operand's layout when it is a permutation of a dense one (a transposed weight):
      // a layout-changing copy of a large matrix costs more than the GEMM.
      std::vector<int64_t> order(size_t(t.dim()));
      for (int64_t i = 0; i < t.dim(); ++i) order[size_t(i)] = i;
      std::sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return t.stride(x) < t.stride(y); });
      int64_t expect = 1;
      bool dense = true;
      for (int64_t d : order) {
        if (t.size(d) == 1) continue;
        dense = dense && t.stride(d) == expect;
        expect *= t.size(d);
      }
      Tensor w = dense ? Tensor::from_storage(Tensor::empty({t.numel()}, DType::f32).storage(), t.shape(), t.strides(), 0, DType::f32)
                       : Tensor::empty(t.shape(), DType::f32);
      copy(t, w);
      return w;
    };
    Tensor cf = Tensor::empty(c.shape(), DType::f32);
    gemm_dnnl(widen(a), widen(b), cf, bias.defined() ? widen(bias) : Tensor());
    copy(cf, c);
    return false;
  }
  visit_dtype(a.dtype(), [&]<class T>() {
    if constexpr (std::is_same_v<T, bool>) SINTER_THROW(DTypeError, "[matmul] bool tensors are not supported");
    else gemm_loop<T>(a, b, c, bias);
  });
  return false;
}

}  // namespace

void gemm(const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& bias, const GemmEpilogue& ep) {
  SINTER_KERNEL_ENTRY();
  SINTER_ASSERT(a.dim() == 3 && b.dim() == 3 && c.dim() == 3 && c.is_contiguous());
  if (gemm_core(a, b, c, bias, ep) || ep.empty()) return;
  if (ep.act) unary(*ep.act, c, c);
  if (ep.residual.defined()) binary(BinaryOp::Add, c, ep.residual, c);
}

}  // namespace sinter::cpu

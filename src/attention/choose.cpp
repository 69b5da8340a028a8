// The call geometry and the backend choice of sdpa, which every device's kernels share: pure
// functions of the call's metadata and attributes, without the op table (the runtime links them).
// The math reference lives with the op (sdpa.cpp) and registers itself here.
#include "attention/attention.h"

namespace sinter::detail {

Geometry geometry(std::span<const TensorMeta> in, const Attrs& a, const char* op) {
  const Shape &q = in[0].shape, &k = in[1].shape, &v = in[2].shape;
  SINTER_CHECK_SHAPE(q.size() == 4 && k.size() == 4 && v.size() == 4, "[", op, "] q, k, v must be (B, H, L, D), got q", q, " k",
                     k, " v", v);
  SINTER_CHECK_SHAPE(k[0] == q[0] && v[0] == q[0] && k[3] == q[3] && v[1] == k[1] && v[2] == k[2], "[", op,
                     "] inconsistent shapes q", q, " k", k, " v", v);
  SINTER_CHECK_SHAPE(k[1] > 0 && q[1] % k[1] == 0, "[", op, "] ", q[1], " query heads are not a multiple of ", k[1],
                     " key/value heads");
  for (size_t i = 1; i < 3; ++i)
    SINTER_CHECK_DTYPE(in[i].dtype == in[0].dtype, "[", op, "] q, k, v dtypes differ: ", in[0].dtype, ", ", in[1].dtype, ", ",
                       in[2].dtype);
  SINTER_CHECK_DTYPE(in[0].dtype == DType::f32 || in[0].dtype == DType::f64 || in[0].dtype == DType::bf16, "[", op,
                     "] needs f32, bf16 or f64, got ", in[0].dtype);
  const int64_t window = a.i_or("window", 0);
  SINTER_CHECK(window >= 0 && (window == 0 || a.b("causal")), "[", op, "] a sliding window (", window,
               ") needs causal attention and a positive size");
  Geometry g{q[0], q[1], k[1], q[2], k[2], q[3], v[3], a.f("scale"), a.b("causal"), window};
  g.lq = g.ldq = contiguous_rows(g.Hq, g.Lq, g.D);
  g.lk = g.ldk = contiguous_rows(g.Hkv, g.Lkv, g.D);
  g.lv = g.ldv = contiguous_rows(g.Hkv, g.Lkv, g.Dv);
  g.lo = g.ldo = contiguous_rows(g.Hq, g.Lq, g.Dv);
  if (a.has("dropout_p")) {
    g.dropout = a.f("dropout_p");
    SINTER_CHECK(g.dropout >= 0 && g.dropout < 1, "[", op, "] dropout_p must be in [0, 1), got ", g.dropout);
    g.seed = uint64_t(a.i("seed")), g.counter = uint64_t(a.i("counter"));
  }
  return g;
}

namespace {
FlashFastPath g_fast_path[kNumDeviceTypes] = {};
bool g_fast_only[kNumDeviceTypes] = {};
FlashDetail g_detail[kNumDeviceTypes] = {};
}  // namespace

void register_flash_fast_path(DeviceType device, FlashFastPath fn, bool fast_only) {
  g_fast_path[size_t(device)] = fn;
  g_fast_only[size_t(device)] = fast_only;
}
void register_flash_detail(DeviceType device, FlashDetail fn) { g_detail[size_t(device)] = fn; }
std::string flash_detail(std::span<const TensorMeta> in, const Attrs& a) {
  const FlashDetail fn = g_detail[size_t(in[0].device.type)];
  return fn ? fn(in, a) : "";
}

SDPAChoice choose_sdpa(std::span<const TensorMeta> in, const Attrs& a) {
  const std::string& requested = a.str("backend");
  if (requested == "math") return {SDPABackend::math, "math backend requested"};
  const DType dt = in[0].dtype;
  const int64_t D = in[0].shape[3], Dv = in[2].shape[3];
  const std::string dims = std::to_string(D) + "/" + std::to_string(Dv);
  const FlashFastPath fast = g_fast_path[size_t(in[0].device.type)];
  if (requested == "flash") {
    if (g_fast_only[size_t(in[0].device.type)] && (!fast || !fast(dt, D, Dv)))  // the same result, by math
      return {SDPABackend::math, std::string("math: this device's flash kernels do not take ") + dtype_name(dt) + " with head dims " +
                                     dims + " (flash requested)"};
    return {SDPABackend::flash, std::string("flash: ") + dtype_name(dt) + ", head dims " + dims + " (requested)"};
  }
  // Measured (BENCHMARKS.md, `sinter bench attention` and `sweep`, and the masked lengths below):
  // the register-blocked flash kernel (f32 and bf16, any head dims) is faster than math at every
  // length, forward and backward; its generic path (f64) is a slow reference.
  if (!fast || !fast(dt, D, Dv))
    return {SDPABackend::math, std::string("math: flash's fast kernel takes f32 or bf16 (got ") + dtype_name(dt) + ", head dims " + dims + ")"};
  // Masks too: flash adds an additive mask tile by tile as it reads it, math to the score matrix in
  // one pass. Measured (B = 1, H = 8, D = 64, forced flash and forced math alternating in one
  // process, Intel Xeon, 2 threads, best of 15): with an additive mask math takes 1.8-2.3x flash's
  // time at L = 16-64 and 1.04-1.19x at L = 128-640 (and more from there); boolean masks: flash at
  // every length (1.2-1.7x).
  return {SDPABackend::flash, std::string("flash: ") + dtype_name(dt) + ", head dims " + dims};
}

namespace {
SDPAMathFn g_math = nullptr;
}  // namespace

void register_sdpa_math(SDPAMathFn fn) { g_math = fn; }

Tensor sdpa_math_reference(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, int64_t kv_len, const Attrs& a,
                           Tensor* lse) {
  SINTER_CHECK(g_math != nullptr, "[sdpa] this call takes the math reference (",
               choose_sdpa(std::vector<TensorMeta>{{q.shape(), q.dtype(), q.device()}, {k.shape(), k.dtype(), k.device()},
                                                   {v.shape(), v.dtype(), v.device()}}, a).reason,
               "), which runs as ops: the runtime (libsinter_rt) has flash attention only");
  return g_math(q, k, v, mask, kv_len, a, lse);
}

}  // namespace sinter::detail

// cuBLASLt GEMMs (gemm.h). cuBLASLt is column-major: the row-major c = a b is computed as
// c^T = b^T a^T, where a row-major matrix is its transpose in column-major with the same bytes.
// One handle and a 32 MiB workspace per device; plans (descriptors and the heuristic's algorithm)
// cached by everything that shapes them, so a training step's GEMMs are planned once.
#include "cuda/gemm.h"

#include <cublasLt.h>

#include <map>
#include <mutex>
#include <tuple>

#include "cuda/cuda.h"

#define SINTER_CUBLAS_CHECK(expr)                                                                           \
  do {                                                                                                      \
    const cublasStatus_t s_ = (expr);                                                                       \
    if (s_ != CUBLAS_STATUS_SUCCESS)                                                                        \
      SINTER_THROW(Error, "[cuda] ", #expr, " failed: ", cublasLtGetStatusString(s_), " (status ", int(s_), ")"); \
  } while (0)

namespace sinter::cuda {
namespace {

constexpr size_t kWorkspace = size_t(32) << 20;

struct Operand {  // one matrix of the column-major call
  cublasOperation_t op;
  int64_t rows, cols, ld, batch_stride;  // as stored (before op)
};

struct Key {
  int device;
  DType dt;
  bool bias;
  int64_t m, n, k, batch;
  Operand a, b;
  auto tie() const {
    return std::make_tuple(device, int(dt), bias, m, n, k, batch, int(a.op), a.rows, a.cols, a.ld, a.batch_stride, int(b.op), b.rows,
                           b.cols, b.ld, b.batch_stride);
  }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

struct DeviceGemm {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
};

std::mutex g_mu;
std::map<Key, Plan>* g_plans = new std::map<Key, Plan>;  // never destroyed (used until exit)
std::map<int, DeviceGemm>* g_devices = new std::map<int, DeviceGemm>;

DeviceGemm& device_gemm(int device) {
  DeviceGemm& d = (*g_devices)[device];
  if (!d.handle) {
    SINTER_CUBLAS_CHECK(cublasLtCreate(&d.handle));
    SINTER_CUDA_CHECK(cudaMalloc(&d.workspace, kWorkspace));
  }
  return d;
}

cudaDataType_t data_type(DType dt) {
  switch (dt) {
    case DType::f32: return CUDA_R_32F;
    case DType::f64: return CUDA_R_64F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default: SINTER_THROW(DTypeError, "[matmul] cuBLASLt takes f32, f64, bf16 and f16, got ", dt);
  }
}

// A (B, R, C) view as a column-major operand: row-major storage is the transpose.
Operand operand(const char* op, const Tensor& t) {
  const int64_t R = t.size(1), C = t.size(2);
  if (t.stride(2) == 1 || C == 1) return {CUBLAS_OP_N, C, R, std::max<int64_t>(t.stride(1), std::max<int64_t>(C, 1)), t.stride(0)};
  SINTER_CHECK(t.stride(1) == 1 || R == 1, "[", op, "] a GEMM operand needs a unit stride in one of its last two dims, got strides ",
               t.strides());
  return {CUBLAS_OP_T, R, C, std::max<int64_t>(t.stride(2), std::max<int64_t>(R, 1)), t.stride(0)};
}

cublasLtMatrixLayout_t layout(DType dt, int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t batch_stride) {
  cublasLtMatrixLayout_t l = nullptr;
  SINTER_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, data_type(dt), uint64_t(rows), uint64_t(cols), ld));
  const int32_t count = int32_t(batch);
  SINTER_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
  SINTER_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &batch_stride, sizeof batch_stride));
  return l;
}

Plan make_plan(const char* op, const Key& k, cublasLtHandle_t handle) {
  Plan p;
  const cublasComputeType_t compute = k.dt == DType::f64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;  // f32: no TF32
  const cudaDataType_t scale = k.dt == DType::f64 ? CUDA_R_64F : CUDA_R_32F;
  SINTER_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, compute, scale));
  SINTER_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &k.a.op, sizeof k.a.op));
  SINTER_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &k.b.op, sizeof k.b.op));
  if (k.bias) {
    const cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_BIAS;
    SINTER_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e));
  }
  p.a = layout(k.dt, k.a.rows, k.a.cols, k.a.ld, k.batch, k.a.batch_stride);
  p.b = layout(k.dt, k.b.rows, k.b.cols, k.b.ld, k.batch, k.b.batch_stride);
  p.c = layout(k.dt, k.m, k.n, k.m, k.batch, k.m * k.n);
  cublasLtMatmulPreference_t pref = nullptr;
  SINTER_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  SINTER_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kWorkspace, sizeof kWorkspace));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  SINTER_CHECK(s == CUBLAS_STATUS_SUCCESS && found > 0, "[", op, "] cuBLASLt has no algorithm for ", k.dt, " (", k.n, " x ", k.k,
               ") @ (", k.k, " x ", k.m, "), batch ", k.batch, ": ", cublasLtGetStatusString(s));
  p.algo = result.algo;
  return p;
}

}  // namespace

void gemm(const char* op, const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& bias) {
  const int64_t B = c.size(0), M = c.size(1), N = c.size(2), K = a.size(2);
  if (c.numel() == 0) return;
  const int device = c.device().index;
  // Column-major: D (N x M) = op(A) (N x K) op(B) (K x M), A from b, B from a.
  Key k{device, c.dtype(), bias.defined(), N, M, K, B, operand(op, b), operand(op, a)};
  cudaStream_t s = stream(device);
  std::lock_guard lock(g_mu);
  DeviceGemm& d = device_gemm(device);
  auto it = g_plans->find(k);
  if (it == g_plans->end()) it = g_plans->emplace(k, make_plan(op, k, d.handle)).first;
  const Plan& p = it->second;
  if (bias.defined()) {
    const void* ptr = bias.data_ptr();
    SINTER_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ptr, sizeof ptr));
  }
  const double one64 = 1, zero64 = 0;
  const float one32 = 1, zero32 = 0;
  const bool f64 = c.dtype() == DType::f64;
  const void* alpha = f64 ? static_cast<const void*>(&one64) : &one32;
  const void* beta = f64 ? static_cast<const void*>(&zero64) : &zero32;
  SINTER_CUBLAS_CHECK(cublasLtMatmul(d.handle, p.desc, alpha, b.data_ptr(), p.a, a.data_ptr(), p.b, beta, c.data_ptr(), p.c, c.data_ptr(), p.c,
                                     &p.algo, d.workspace, kWorkspace, s));
}

}  // namespace sinter::cuda

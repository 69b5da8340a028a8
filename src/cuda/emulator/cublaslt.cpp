// The emulator's cuBLASLt (src/cuda/emulator/include/cublasLt.h): D = alpha op(A) op(B) + beta C
// (+ bias per row of D), column-major, batched by strides. Shapes are checked as cuBLASLt checks them: op(A) is
// m x k, op(B) k x n, C and D m x n, each leading dimension at least its rows, one dtype throughout.
#include <cublasLt.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "cuda_bf16.h"
#include "cuda_fp16.h"

struct cublasLtContext {};
struct cublasLtMatmulDescOpaque_t {
  cublasComputeType_t compute;
  cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
};
struct cublasLtMatrixLayoutOpaque_t {
  cudaDataType_t type;
  int64_t rows, cols, ld;
  int32_t batch = 1;
  int64_t batch_stride = 0;
};
struct cublasLtMatmulPreferenceOpaque_t {};
using Desc = cublasLtMatmulDescOpaque_t;
using Layout = cublasLtMatrixLayoutOpaque_t;

namespace {

template <class V> bool set(V& field, const void* buf, size_t bytes) {
  if (bytes != sizeof field) return false;
  std::memcpy(&field, buf, bytes);
  return true;
}

double read(cudaDataType_t t, const void* p, int64_t i) {
  switch (t) {
    case CUDA_R_32F: return static_cast<const float*>(p)[i];
    case CUDA_R_64F: return static_cast<const double*>(p)[i];
    case CUDA_R_16F: return __half2float(static_cast<const __half*>(p)[i]);
    case CUDA_R_16BF: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: break;  // refused by `valid`
  }
  return NAN;
}

void write(cudaDataType_t t, void* p, int64_t i, double v) {
  switch (t) {
    case CUDA_R_32F: static_cast<float*>(p)[i] = float(v); return;
    case CUDA_R_64F: static_cast<double*>(p)[i] = v; return;
    case CUDA_R_16F: static_cast<__half*>(p)[i] = __float2half_rn(float(v)); return;
    case CUDA_R_16BF: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(float(v)); return;
    default: return;
  }
}

// op(l) of batch `batch` over the storage at p, as a row-major (rows x cols) matrix of doubles.
std::vector<double> widen(const cublasLtMatrixLayoutOpaque_t& l, cublasOperation_t op, const void* p, int64_t batch) {
  const int64_t rows = op == CUBLAS_OP_N ? l.rows : l.cols, cols = op == CUBLAS_OP_N ? l.cols : l.rows;
  std::vector<double> m(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      m[size_t(r * cols + c)] = read(l.type, p, batch * l.batch_stride + (op == CUBLAS_OP_N ? r + c * l.ld : c + r * l.ld));
  return m;
}

bool valid(const cublasLtMatmulDescOpaque_t& d, const cublasLtMatrixLayoutOpaque_t& a, const cublasLtMatrixLayoutOpaque_t& b,
           const cublasLtMatrixLayoutOpaque_t& c) {
  const int64_t m = c.rows, n = c.cols, k = d.trans_a == CUBLAS_OP_N ? a.cols : a.rows;
  const int64_t am = d.trans_a == CUBLAS_OP_N ? a.rows : a.cols;
  const int64_t bk = d.trans_b == CUBLAS_OP_N ? b.rows : b.cols, bn = d.trans_b == CUBLAS_OP_N ? b.cols : b.rows;
  const bool f64 = a.type == CUDA_R_64F;
  const bool float_type = a.type == CUDA_R_32F || f64 || a.type == CUDA_R_16F || a.type == CUDA_R_16BF;
  return float_type && am == m && bk == k && bn == n && a.type == b.type && b.type == c.type && f64 == (d.compute == CUBLAS_COMPUTE_64F) &&
         a.ld >= std::max<int64_t>(a.rows, 1) && b.ld >= std::max<int64_t>(b.rows, 1) && c.ld >= std::max<int64_t>(c.rows, 1) &&
         a.batch == c.batch && b.batch == c.batch;
}

// D = al op(A) op(B) + be C (+ bias): what the matmul's kernels compute.
void product(const Desc& desc, double al, const void* a, const Layout& la, const void* b, const Layout& lb, double be, const void* c,
             const Layout& lc, void* d, const Layout& ld) {
  const bool bias = desc.epilogue == CUBLASLT_EPILOGUE_BIAS;
  const int64_t m = ld.rows, n = ld.cols, k = desc.trans_a == CUBLAS_OP_N ? la.cols : la.rows;
  for (int64_t p = 0; p < ld.batch; ++p) {
    const cublasOperation_t bt = desc.trans_b == CUBLAS_OP_N ? CUBLAS_OP_T : CUBLAS_OP_N;  // B^T: k contiguous per column
    const std::vector<double> A = widen(la, desc.trans_a, a, p), Bt = widen(lb, bt, b, p);
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < m; ++i) {
        const double *ai = A.data() + i * k, *bj = Bt.data() + j * k;  // k may be 0: no element to index
        double s = 0;
#pragma omp simd reduction(+ : s)
        for (int64_t q = 0; q < k; ++q) s += ai[q] * bj[q];
        s *= al;
        if (be != 0) s += be * read(lc.type, c, p * lc.batch_stride + i + j * lc.ld);
        if (bias) s += read(ld.type, desc.bias, i);
        write(ld.type, d, p * ld.batch_stride + i + j * ld.ld, s);
      }
  }
}

}  // namespace

const char* cublasLtGetStatusString(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  *handle = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute, cudaDataType_t) {
  *desc = new cublasLtMatmulDescOpaque_t{compute};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const void* buf, size_t bytes) {
  bool ok = false;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: ok = set(d->trans_a, buf, bytes); break;
    case CUBLASLT_MATMUL_DESC_TRANSB: ok = set(d->trans_b, buf, bytes); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: ok = set(d->epilogue, buf, bytes); break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: ok = set(d->bias, buf, bytes); break;
  }
  return ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType_t type, uint64_t rows, uint64_t cols, int64_t ld) {
  *layout = new cublasLtMatrixLayoutOpaque_t{type, int64_t(rows), int64_t(cols), ld};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr, const void* buf,
                                                size_t bytes) {
  const bool ok = attr == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT ? set(l->batch, buf, bytes) : set(l->batch_stride, buf, bytes);
  return ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  *pref = new cublasLtMatmulPreferenceOpaque_t;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t, const void*, size_t) {
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t, cublasLtMatmulPreference_t, int requested,
                                              cublasLtMatmulHeuristicResult_t* results, int* found) {
  *found = 0;
  if (!valid(*desc, *a, *b, *c)) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (requested > 0) results[0] = cublasLtMatmulHeuristicResult_t{}, *found = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t desc, const void* alpha, const void* a, cublasLtMatrixLayout_t la,
                              const void* b, cublasLtMatrixLayout_t lb, const void* beta, const void* c, cublasLtMatrixLayout_t lc, void* d,
                              cublasLtMatrixLayout_t ld, const cublasLtMatmulAlgo_t*, void*, size_t, cudaStream_t stream) {
  if (!valid(*desc, *la, *lb, *lc) || lc->rows != ld->rows || lc->cols != ld->cols || lc->type != ld->type)
    return CUBLAS_STATUS_INVALID_VALUE;
  const bool f64 = desc->compute == CUBLAS_COMPUTE_64F;
  const double al = f64 ? *static_cast<const double*>(alpha) : *static_cast<const float*>(alpha);
  const double be = f64 ? *static_cast<const double*>(beta) : *static_cast<const float*>(beta);
  if (desc->epilogue == CUBLASLT_EPILOGUE_BIAS && !desc->bias) return CUBLAS_STATUS_INVALID_VALUE;
  // The descriptors as they are now (a graph's replays keep them so, as the library's do).
  sinter::cuda::emulator::enqueue(stream, [=, d_ = *desc, la_ = *la, lb_ = *lb, lc_ = *lc, ld_ = *ld] {
    product(d_, al, a, la_, b, lb_, be, c, lc_, d, ld_);
  });
  return CUBLAS_STATUS_SUCCESS;
}

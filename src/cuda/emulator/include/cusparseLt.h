#pragma once
// The CUDA emulator's cuSPARSELt (../emulator.h, src/cuda/emulator/cusparselt.cpp): the entry points
// src/cuda/cusparselt.cpp resolves, with cuSPARSELt 0.8's types and values (the real header's
// declarations are checked by nvcc's build of the backend). Built as its own library, which the
// backend opens as it opens cuSPARSELt (SINTER_CUSPARSELT_LIBRARY names it).
#include <cstddef>
#include <cstdint>

#include "cuda_runtime.h"
#include "library_types.h"

#define CUSPARSELT_VER_MAJOR 0
#define CUSPARSELT_VER_MINOR 8

enum cusparseStatus_t {
  CUSPARSE_STATUS_SUCCESS = 0,
  CUSPARSE_STATUS_NOT_INITIALIZED = 1,
  CUSPARSE_STATUS_INVALID_VALUE = 3,
  CUSPARSE_STATUS_EXECUTION_FAILED = 6,
  CUSPARSE_STATUS_NOT_SUPPORTED = 10,
};
enum cusparseOrder_t { CUSPARSE_ORDER_COL = 1, CUSPARSE_ORDER_ROW = 2 };
enum cusparseOperation_t { CUSPARSE_OPERATION_NON_TRANSPOSE = 0, CUSPARSE_OPERATION_TRANSPOSE = 1 };
enum cusparseLtSparsity_t { CUSPARSELT_SPARSITY_50_PERCENT };
enum cusparseComputeType { CUSPARSE_COMPUTE_32I, CUSPARSE_COMPUTE_16F, CUSPARSE_COMPUTE_32F };
enum cusparseLtMatmulAlg_t { CUSPARSELT_MATMUL_ALG_DEFAULT };
enum cusparseLtMatmulAlgAttribute_t {
  CUSPARSELT_MATMUL_ALG_CONFIG_ID = 0,
  CUSPARSELT_MATMUL_ALG_CONFIG_MAX_ID = 1,
  CUSPARSELT_MATMUL_SPLIT_K = 3,
  CUSPARSELT_MATMUL_SPLIT_K_MODE = 4,
};
enum cusparseLtSplitKMode_t { CUSPARSELT_SPLIT_K_MODE_ONE_KERNEL = 1, CUSPARSELT_HEURISTIC = 3, CUSPARSELT_STREAMK = 6 };
enum cusparseLtMatmulDescAttribute_t {  // the real header's values; the emulator takes the ReLU and the bias
  CUSPARSELT_MATMUL_ACTIVATION_RELU = 0,
  CUSPARSELT_MATMUL_ACTIVATION_GELU = 3,
  CUSPARSELT_MATMUL_BIAS_POINTER = 8,
};

typedef struct {
  alignas(16) uint8_t data[512];
} cusparseLtHandle_t;
typedef struct {
  alignas(16) uint8_t data[512];
} cusparseLtMatDescriptor_t;
typedef struct {
  alignas(16) uint8_t data[512];
} cusparseLtMatmulDescriptor_t;
typedef struct {
  alignas(16) uint8_t data[512];
} cusparseLtMatmulAlgSelection_t;
typedef struct {
  alignas(16) uint8_t data[512];
} cusparseLtMatmulPlan_t;

extern "C" {
cusparseStatus_t cusparseLtInit(cusparseLtHandle_t* handle);
cusparseStatus_t cusparseLtGetProperty(libraryPropertyType property, int* value);
const char* cusparseLtGetErrorString(cusparseStatus_t status);
cusparseStatus_t cusparseLtDenseDescriptorInit(const cusparseLtHandle_t* handle, cusparseLtMatDescriptor_t* mat, int64_t rows, int64_t cols,
                                               int64_t ld, uint32_t alignment, cudaDataType type, cusparseOrder_t order);
cusparseStatus_t cusparseLtStructuredDescriptorInit(const cusparseLtHandle_t* handle, cusparseLtMatDescriptor_t* mat, int64_t rows,
                                                    int64_t cols, int64_t ld, uint32_t alignment, cudaDataType type, cusparseOrder_t order,
                                                    cusparseLtSparsity_t sparsity);
cusparseStatus_t cusparseLtMatDescriptorDestroy(const cusparseLtMatDescriptor_t* mat);
cusparseStatus_t cusparseLtMatmulDescriptorInit(const cusparseLtHandle_t* handle, cusparseLtMatmulDescriptor_t* matmul,
                                                cusparseOperation_t op_a, cusparseOperation_t op_b, const cusparseLtMatDescriptor_t* a,
                                                const cusparseLtMatDescriptor_t* b, const cusparseLtMatDescriptor_t* c,
                                                const cusparseLtMatDescriptor_t* d, cusparseComputeType compute);
cusparseStatus_t cusparseLtMatmulDescSetAttribute(const cusparseLtHandle_t* handle, cusparseLtMatmulDescriptor_t* matmul,
                                                 cusparseLtMatmulDescAttribute_t attribute, const void* data, size_t bytes);
cusparseStatus_t cusparseLtMatmulAlgSelectionInit(const cusparseLtHandle_t* handle, cusparseLtMatmulAlgSelection_t* alg,
                                                  const cusparseLtMatmulDescriptor_t* matmul, cusparseLtMatmulAlg_t which);
cusparseStatus_t cusparseLtMatmulAlgSelectionDestroy(const cusparseLtMatmulAlgSelection_t* alg);
cusparseStatus_t cusparseLtMatmulAlgSetAttribute(const cusparseLtHandle_t* handle, cusparseLtMatmulAlgSelection_t* alg,
                                                 cusparseLtMatmulAlgAttribute_t attribute, const void* data, size_t bytes);
cusparseStatus_t cusparseLtMatmulAlgGetAttribute(const cusparseLtHandle_t* handle, const cusparseLtMatmulAlgSelection_t* alg,
                                                 cusparseLtMatmulAlgAttribute_t attribute, void* data, size_t bytes);
cusparseStatus_t cusparseLtMatmulPlanInit(const cusparseLtHandle_t* handle, cusparseLtMatmulPlan_t* plan,
                                          const cusparseLtMatmulDescriptor_t* matmul, const cusparseLtMatmulAlgSelection_t* alg);
cusparseStatus_t cusparseLtMatmulPlanDestroy(const cusparseLtMatmulPlan_t* plan);
cusparseStatus_t cusparseLtMatmulGetWorkspace(const cusparseLtHandle_t* handle, const cusparseLtMatmulPlan_t* plan, size_t* bytes);
cusparseStatus_t cusparseLtMatmul(const cusparseLtHandle_t* handle, const cusparseLtMatmulPlan_t* plan, const void* alpha, const void* a,
                                  const void* b, const void* beta, const void* c, void* d, void* workspace, cudaStream_t* streams,
                                  int32_t num_streams);
cusparseStatus_t cusparseLtMatmulSearch(const cusparseLtHandle_t* handle, cusparseLtMatmulPlan_t* plan, const void* alpha, const void* a,
                                        const void* b, const void* beta, const void* c, void* d, void* workspace, cudaStream_t* streams,
                                        int32_t num_streams);
cusparseStatus_t cusparseLtSpMMACompressedSize2(const cusparseLtHandle_t* handle, const cusparseLtMatDescriptor_t* sparse,
                                                size_t* compressed_bytes, size_t* buffer_bytes);
cusparseStatus_t cusparseLtSpMMACompress2(const cusparseLtHandle_t* handle, const cusparseLtMatDescriptor_t* sparse, int is_sparse_a,
                                          cusparseOperation_t op, const void* dense, void* compressed, void* buffer, cudaStream_t stream);
int64_t sinter_emulated_cusparselt_searches();  // the emulator's own: searches run in this process
int64_t sinter_emulated_cusparselt_plans();     // the emulator's own: plans alive
int64_t sinter_emulated_cusparselt_plans_made();  // the emulator's own: plans made
}

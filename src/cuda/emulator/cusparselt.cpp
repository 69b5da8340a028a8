// The emulator's cuSPARSELt (its cusparseLt.h), libsinter_cusparselt_emulated.so, opened by
// src/cuda/cusparselt.cpp as it opens the real one: D = act(alpha op(A) op(B) + beta C + bias), A
// structured (2:4), bf16 in and out, f32 sums, act ReLU or none, bias over D's rows (read through
// the plan's matmul descriptor at each product). It refuses what cuSPARSELt refuses: bf16
// structured dims not multiples of 16, dense ones not multiples of 8, short leading dims, pointers
// off the descriptors' alignment, shapes that do not chain; and more where the library is
// undefined: a group of three nonzeros, a compressed weight of another shape, a workspace smaller
// than the plan asks (written over), a bias or activation switched on or off after the plan.
#include <cusparseLt.h>

#include <cstring>
#include <string>
#include <vector>

#include "cuda_bf16.h"

namespace {

constexpr uint32_t kTag = 0x53504c54;  // a descriptor made by this library ("SPLT")

struct Mat {
  uint32_t tag = 0;
  bool structured = false;
  int64_t rows = 0, cols = 0, ld = 0;
  uint32_t alignment = 0;
  cudaDataType type = CUDA_R_16BF;
  cusparseOrder_t order = CUSPARSE_ORDER_ROW;
};
struct Matmul {
  uint32_t tag = 0;
  cusparseOperation_t op_a{}, op_b{};
  Mat a, b, c;
  int64_t m = 0, n = 0, k = 0;
  const void* bias = nullptr;  // bf16, m of them (D's rows)
  int relu = 0;
};
// Algorithms 0 (the default) and, where D's columns are a multiple of 16, 1 (larger workspace): as
// in the library, which algorithms exist depends on the shape, and a search keeps the last.
struct Alg {
  uint32_t tag = 0;
  int id = 0, max_id = 0, split_k = 1, split_k_mode = CUSPARSELT_HEURISTIC;
};
struct Plan {
  uint32_t tag = 0;
  Matmul mm;  // as the plan was made
  const cusparseLtMatmulDescriptor_t* desc = nullptr;
  cusparseLtMatmulAlgSelection_t* alg = nullptr;  // where a search writes its choice
  size_t workspace = 0;
};
constexpr size_t kWorkspace[2] = {1024, 8192};  // by algorithm
int64_t g_searches = 0, g_plans = 0, g_plans_made = 0;  // searches run, plans alive, plans made
struct Compressed {  // the head of a compressed matrix: what it was made for
  uint64_t tag;
  int64_t m, k;
};

thread_local std::string g_reason;  // why the last call failed, for cusparseLtGetErrorString

cusparseStatus_t fail(cusparseStatus_t s, std::string why) {
  g_reason = std::move(why);
  return s;
}

template <class T, class Opaque> void put(Opaque* o, const T& v) {
  static_assert(sizeof(T) <= sizeof(o->data));
  std::memcpy(o->data, &v, sizeof v);
}
template <class T, class Opaque> T get(const Opaque* o) {
  T v;
  std::memcpy(&v, o->data, sizeof v);
  return v;
}
bool made(const cusparseLtHandle_t* h) { return h && get<uint32_t>(h) == kTag; }
cusparseStatus_t no_handle() { return fail(CUSPARSE_STATUS_NOT_INITIALIZED, "the handle was not made by cusparseLtInit"); }

// op(m)'s rows and columns, and the offset of its element (r, c) in m's storage.
int64_t op_rows(const Mat& m, cusparseOperation_t op) { return op == CUSPARSE_OPERATION_NON_TRANSPOSE ? m.rows : m.cols; }
int64_t op_cols(const Mat& m, cusparseOperation_t op) { return op == CUSPARSE_OPERATION_NON_TRANSPOSE ? m.cols : m.rows; }
int64_t offset(const Mat& m, cusparseOperation_t op, int64_t r, int64_t c) {
  if (op == CUSPARSE_OPERATION_TRANSPOSE) std::swap(r, c);
  return m.order == CUSPARSE_ORDER_ROW ? r * m.ld + c : r + c * m.ld;
}

cusparseStatus_t describe(const cusparseLtHandle_t* h, cusparseLtMatDescriptor_t* out, Mat m, const char* what) {
  if (!made(h)) return no_handle();
  if (m.type != CUDA_R_16BF) return fail(CUSPARSE_STATUS_NOT_SUPPORTED, std::string(what) + ": the emulator takes bf16 only");
  const int64_t multiple = m.structured ? 16 : 8;
  const int64_t min_ld = m.order == CUSPARSE_ORDER_ROW ? m.cols : m.rows;
  const std::string shape =
      std::string(what) + " " + std::to_string(m.rows) + " x " + std::to_string(m.cols) + " ld " + std::to_string(m.ld);
  if (m.rows <= 0 || m.cols <= 0 || m.rows % multiple || m.cols % multiple || m.ld % multiple)
    return fail(CUSPARSE_STATUS_INVALID_VALUE, shape + ": dimensions must be multiples of " + std::to_string(multiple));
  if (m.ld < min_ld) return fail(CUSPARSE_STATUS_INVALID_VALUE, shape + ": leading dimension too small");
  if (m.alignment == 0 || m.alignment % 16)
    return fail(CUSPARSE_STATUS_INVALID_VALUE, shape + ": alignment " + std::to_string(m.alignment) + " is not a multiple of 16");
  m.tag = kTag;
  put(out, m);
  return CUSPARSE_STATUS_SUCCESS;
}

bool aligned(const void* p, uint32_t alignment) { return reinterpret_cast<uintptr_t>(p) % alignment == 0; }

size_t compressed_bytes(int64_t m, int64_t k) { return sizeof(Compressed) + size_t(m * k / 2) * 2 + size_t(m * k / 4); }

// D = alpha op(A) op(B) + beta C; C is read only where beta is not zero (as in BLAS).
void product(const Matmul& mm, float al, const void* a, const void* b, float be, const void* c, void* d, void* workspace, size_t ws);

cusparseStatus_t run(const Plan& plan, const void* alpha, const void* a, const void* b, const void* beta, const void* c, void* d,
                     void* workspace, cudaStream_t* streams, int32_t num_streams) {
  const Matmul mm = get<Matmul>(plan.desc);
  if (mm.tag != kTag) return fail(CUSPARSE_STATUS_INVALID_VALUE, "the plan's matmul descriptor is gone");
  if ((mm.bias != nullptr) != (plan.mm.bias != nullptr) || mm.relu != plan.mm.relu)
    return fail(CUSPARSE_STATUS_INVALID_VALUE, "the bias or the activation was switched on or off after the plan was made");
  Compressed head;
  std::memcpy(&head, a, sizeof head);
  if (head.tag != kTag || head.m != mm.m || head.k != mm.k)
    return fail(CUSPARSE_STATUS_INVALID_VALUE, "A is not a matrix compressed for this plan's " + std::to_string(mm.m) + " x " +
                                                   std::to_string(mm.k) + " structured operand");
  if (!aligned(b, mm.b.alignment) || !aligned(c, mm.c.alignment) || !aligned(d, mm.c.alignment))
    return fail(CUSPARSE_STATUS_INVALID_VALUE, "B, C or D is not aligned as its descriptor says");
  if (plan.workspace && !workspace) return fail(CUSPARSE_STATUS_INVALID_VALUE, "the plan needs a workspace");
  if (num_streams < 0 || (num_streams > 0 && !streams)) return fail(CUSPARSE_STATUS_INVALID_VALUE, "streams");
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  const size_t ws = plan.workspace;
  sinter::cuda::emulator::enqueue(num_streams > 0 ? streams[0] : nullptr, [=] { product(mm, al, a, b, be, c, d, workspace, ws); });
  return CUSPARSE_STATUS_SUCCESS;
}

// D = al op(A) op(B) + be C (+ bias, ReLU) for a checked plan: what the matmul's kernels compute.
void product(const Matmul& mm, float al, const void* a, const void* b, float be, const void* c, void* d, void* workspace, size_t ws) {
  if (ws) std::memset(workspace, 0xa5, ws);  // all of it, as the kernels may
  const auto* values = reinterpret_cast<const __nv_bfloat16*>(static_cast<const char*>(a) + sizeof(Compressed));
  const auto* index = reinterpret_cast<const uint8_t*>(values + mm.m * mm.k / 2);
  const auto* bb = static_cast<const __nv_bfloat16*>(b);
  const auto* bias = static_cast<const __nv_bfloat16*>(mm.bias);
  std::vector<float> bt(size_t(mm.n * mm.k));  // op(B)^T: k contiguous for each column of D
  for (int64_t j = 0; j < mm.n; ++j)
    for (int64_t q = 0; q < mm.k; ++q) bt[size_t(j * mm.k + q)] = __bfloat162float(bb[offset(mm.b, mm.op_b, q, j)]);
  for (int64_t i = 0; i < mm.m; ++i)
    for (int64_t j = 0; j < mm.n; ++j) {
      float s = 0;
      for (int64_t g = 0; g < mm.k / 4; ++g) {
        const int64_t e = i * (mm.k / 4) + g;
        for (int t = 0; t < 2; ++t) s += __bfloat162float(values[2 * e + t]) * bt[size_t(j * mm.k + 4 * g + ((index[e] >> (2 * t)) & 3))];
      }
      s *= al;
      const int64_t at = offset(mm.c, CUSPARSE_OPERATION_NON_TRANSPOSE, i, j);
      if (be != 0) s += be * __bfloat162float(static_cast<const __nv_bfloat16*>(c)[at]);
      if (bias) s += __bfloat162float(bias[i]);
      if (mm.relu) s = s > 0 ? s : 0;
      static_cast<__nv_bfloat16*>(d)[at] = __float2bfloat16_rn(s);
    }
}

}  // namespace

extern "C" {

cusparseStatus_t cusparseLtInit(cusparseLtHandle_t* handle) {
  put(handle, kTag);
  return CUSPARSE_STATUS_SUCCESS;
}

cusparseStatus_t cusparseLtGetProperty(libraryPropertyType property, int* value) {
  *value = property == MAJOR_VERSION ? CUSPARSELT_VER_MAJOR : property == MINOR_VERSION ? CUSPARSELT_VER_MINOR : 0;
  return CUSPARSE_STATUS_SUCCESS;
}

const char* cusparseLtGetErrorString(cusparseStatus_t status) {
  static thread_local std::string text;
  const char* name = status == CUSPARSE_STATUS_SUCCESS           ? "success"
                     : status == CUSPARSE_STATUS_NOT_INITIALIZED ? "not initialized"
                     : status == CUSPARSE_STATUS_INVALID_VALUE   ? "invalid value"
                     : status == CUSPARSE_STATUS_NOT_SUPPORTED   ? "not supported"
                                                                 : "execution failed";
  text = std::string(name) + (g_reason.empty() ? "" : " (emulated cuSPARSELt: " + g_reason + ")");
  return text.c_str();
}

cusparseStatus_t cusparseLtDenseDescriptorInit(const cusparseLtHandle_t* h, cusparseLtMatDescriptor_t* mat, int64_t rows, int64_t cols,
                                               int64_t ld, uint32_t alignment, cudaDataType type, cusparseOrder_t order) {
  return describe(h, mat, Mat{0, false, rows, cols, ld, alignment, type, order}, "dense matrix");
}

cusparseStatus_t cusparseLtStructuredDescriptorInit(const cusparseLtHandle_t* h, cusparseLtMatDescriptor_t* mat, int64_t rows,
                                                    int64_t cols, int64_t ld, uint32_t alignment, cudaDataType type, cusparseOrder_t order,
                                                    cusparseLtSparsity_t) {
  return describe(h, mat, Mat{0, true, rows, cols, ld, alignment, type, order}, "structured matrix");
}

cusparseStatus_t cusparseLtMatDescriptorDestroy(const cusparseLtMatDescriptor_t* mat) {
  if (get<Mat>(mat).tag != kTag) return fail(CUSPARSE_STATUS_INVALID_VALUE, "destroying a matrix descriptor not made (or destroyed twice)");
  put(const_cast<cusparseLtMatDescriptor_t*>(mat), Mat{});
  return CUSPARSE_STATUS_SUCCESS;
}

cusparseStatus_t cusparseLtMatmulDescriptorInit(const cusparseLtHandle_t* h, cusparseLtMatmulDescriptor_t* out, cusparseOperation_t op_a,
                                                cusparseOperation_t op_b, const cusparseLtMatDescriptor_t* a,
                                                const cusparseLtMatDescriptor_t* b, const cusparseLtMatDescriptor_t* c,
                                                const cusparseLtMatDescriptor_t* d, cusparseComputeType compute) {
  if (!made(h)) return no_handle();
  Matmul mm{kTag, op_a, op_b, get<Mat>(a), get<Mat>(b), get<Mat>(c)};
  const Mat md = get<Mat>(d);
  if (mm.a.tag != kTag || mm.b.tag != kTag || mm.c.tag != kTag || md.tag != kTag)
    return fail(CUSPARSE_STATUS_INVALID_VALUE, "a matrix descriptor was not made (or was destroyed)");
  if (!mm.a.structured || mm.b.structured || mm.c.structured)
    return fail(CUSPARSE_STATUS_NOT_SUPPORTED, "the emulator takes A structured, B, C and D dense");
  if (compute != CUSPARSE_COMPUTE_32F) return fail(CUSPARSE_STATUS_NOT_SUPPORTED, "bf16 operands compute in CUSPARSE_COMPUTE_32F");
  mm.m = op_rows(mm.a, op_a), mm.k = op_cols(mm.a, op_a), mm.n = op_cols(mm.b, op_b);
  if (op_rows(mm.b, op_b) != mm.k || mm.c.rows != mm.m || mm.c.cols != mm.n)
    return fail(CUSPARSE_STATUS_INVALID_VALUE, "op(A) is " + std::to_string(mm.m) + " x " + std::to_string(mm.k) + ", op(B) " +
                                                   std::to_string(op_rows(mm.b, op_b)) + " x " + std::to_string(mm.n) + ", C " +
                                                   std::to_string(mm.c.rows) + " x " + std::to_string(mm.c.cols) + ": they do not chain");
  if (md.rows != mm.c.rows || md.cols != mm.c.cols || md.ld != mm.c.ld || md.order != mm.c.order)
    return fail(CUSPARSE_STATUS_INVALID_VALUE, "D is not laid out as C");
  put(out, mm);
  return CUSPARSE_STATUS_SUCCESS;
}

cusparseStatus_t cusparseLtMatmulDescSetAttribute(const cusparseLtHandle_t* h, cusparseLtMatmulDescriptor_t* matmul,
                                                 cusparseLtMatmulDescAttribute_t attribute, const void* data, size_t bytes) {
  if (!made(h)) return no_handle();
  Matmul mm = get<Matmul>(matmul);
  if (mm.tag != kTag) return fail(CUSPARSE_STATUS_INVALID_VALUE, "the matmul descriptor was not made");
  if (attribute == CUSPARSELT_MATMUL_ACTIVATION_RELU && bytes == sizeof mm.relu) {
    std::memcpy(&mm.relu, data, bytes);
  } else if (attribute == CUSPARSELT_MATMUL_BIAS_POINTER && bytes == sizeof mm.bias) {
    std::memcpy(&mm.bias, data, bytes);
    if (!aligned(mm.bias, 16)) return fail(CUSPARSE_STATUS_INVALID_VALUE, "the bias pointer is not 16-byte aligned");
  } else {
    return fail(CUSPARSE_STATUS_NOT_SUPPORTED, "attribute " + std::to_string(int(attribute)) + " of " + std::to_string(bytes) +
                                                   " bytes (the emulator takes the ReLU as an int and the bias pointer)");
  }
  put(matmul, mm);
  return CUSPARSE_STATUS_SUCCESS;
}

cusparseStatus_t cusparseLtMatmulAlgSelectionInit(const cusparseLtHandle_t* h, cusparseLtMatmulAlgSelection_t* alg,
                                                  const cusparseLtMatmulDescriptor_t* matmul, cusparseLtMatmulAlg_t) {
  if (!made(h)) return no_handle();
  const Matmul mm = get<Matmul>(matmul);
  if (mm.tag != kTag) return fail(CUSPARSE_STATUS_INVALID_VALUE, "the matmul descriptor was not made");
  put(alg, Alg{kTag, 0, mm.n % 16 == 0 ? 1 : 0});
  return CUSPARSE_STATUS_SUCCESS;
}

cusparseStatus_t cusparseLtMatmulAlgSelectionDestroy(const cusparseLtMatmulAlgSelection_t* alg) {
  if (get<uint32_t>(alg) != kTag) return fail(CUSPARSE_STATUS_INVALID_VALUE, "destroying an algorithm selection not made");
  put(const_cast<cusparseLtMatmulAlgSelection_t*>(alg), Alg{});
  return CUSPARSE_STATUS_SUCCESS;
}

cusparseStatus_t cusparseLtMatmulAlgSetAttribute(const cusparseLtHandle_t* h, cusparseLtMatmulAlgSelection_t* alg,
                                                 cusparseLtMatmulAlgAttribute_t attribute, const void* data, size_t bytes) {
  Alg a = get<Alg>(alg);
  if (!made(h) || a.tag != kTag) return fail(CUSPARSE_STATUS_INVALID_VALUE, "the handle or algorithm selection was not made");
  int v = 0;
  if (bytes != sizeof v) return fail(CUSPARSE_STATUS_INVALID_VALUE, "an algorithm attribute is an int");
  std::memcpy(&v, data, sizeof v);
  if (attribute == CUSPARSELT_MATMUL_ALG_CONFIG_ID && v >= 0 && v <= a.max_id) a.id = v;
  else if (attribute == CUSPARSELT_MATMUL_SPLIT_K && v >= 1) a.split_k = v;
  else if (attribute == CUSPARSELT_MATMUL_SPLIT_K_MODE && v >= CUSPARSELT_SPLIT_K_MODE_ONE_KERNEL && v <= CUSPARSELT_STREAMK) a.split_k_mode = v;
  else return fail(CUSPARSE_STATUS_INVALID_VALUE, "algorithm attribute " + std::to_string(int(attribute)) + " = " + std::to_string(v));
  put(alg, a);
  return CUSPARSE_STATUS_SUCCESS;
}

cusparseStatus_t cusparseLtMatmulAlgGetAttribute(const cusparseLtHandle_t* h, const cusparseLtMatmulAlgSelection_t* alg,
                                                 cusparseLtMatmulAlgAttribute_t attribute, void* data, size_t bytes) {
  const Alg a = get<Alg>(alg);
  if (!made(h) || a.tag != kTag) return fail(CUSPARSE_STATUS_INVALID_VALUE, "the handle or algorithm selection was not made");
  const int v = attribute == CUSPARSELT_MATMUL_ALG_CONFIG_ID       ? a.id
                : attribute == CUSPARSELT_MATMUL_ALG_CONFIG_MAX_ID ? a.max_id
                : attribute == CUSPARSELT_MATMUL_SPLIT_K           ? a.split_k
                : attribute == CUSPARSELT_MATMUL_SPLIT_K_MODE      ? a.split_k_mode
                                                                   : -1;
  if (v < 0 || bytes != sizeof v) return fail(CUSPARSE_STATUS_INVALID_VALUE, "algorithm attribute " + std::to_string(int(attribute)));
  std::memcpy(data, &v, sizeof v);
  return CUSPARSE_STATUS_SUCCESS;
}

cusparseStatus_t cusparseLtMatmulPlanInit(const cusparseLtHandle_t* h, cusparseLtMatmulPlan_t* plan,
                                          const cusparseLtMatmulDescriptor_t* matmul, const cusparseLtMatmulAlgSelection_t* alg) {
  if (!made(h)) return no_handle();
  const Matmul mm = get<Matmul>(matmul);
  if (mm.tag != kTag || get<uint32_t>(alg) != kTag) return fail(CUSPARSE_STATUS_INVALID_VALUE, "the matmul or algorithm was not made");
  put(plan, Plan{kTag, mm, matmul, const_cast<cusparseLtMatmulAlgSelection_t*>(alg), kWorkspace[get<Alg>(alg).id]});
  ++g_plans, ++g_plans_made;
  return CUSPARSE_STATUS_SUCCESS;
}

cusparseStatus_t cusparseLtMatmulPlanDestroy(const cusparseLtMatmulPlan_t* plan) {
  if (get<uint32_t>(plan) != kTag) return fail(CUSPARSE_STATUS_INVALID_VALUE, "destroying a plan not made (or destroyed twice)");
  put(const_cast<cusparseLtMatmulPlan_t*>(plan), Plan{});
  --g_plans;
  return CUSPARSE_STATUS_SUCCESS;
}

cusparseStatus_t cusparseLtMatmulGetWorkspace(const cusparseLtHandle_t* h, const cusparseLtMatmulPlan_t* plan, size_t* bytes) {
  if (!made(h) || get<uint32_t>(plan) != kTag) return fail(CUSPARSE_STATUS_INVALID_VALUE, "the handle or plan was not made");
  *bytes = get<Plan>(plan).workspace;
  return CUSPARSE_STATUS_SUCCESS;
}

cusparseStatus_t cusparseLtMatmul(const cusparseLtHandle_t* h, const cusparseLtMatmulPlan_t* plan, const void* alpha, const void* a,
                                  const void* b, const void* beta, const void* c, void* d, void* workspace, cudaStream_t* streams,
                                  int32_t num_streams) {
  if (!made(h) || get<uint32_t>(plan) != kTag) return fail(CUSPARSE_STATUS_INVALID_VALUE, "the handle or plan was not made");
  return run(get<Plan>(plan), alpha, a, b, beta, c, d, workspace, streams, num_streams);
}

// Runs the product, then keeps the "fastest" algorithm in the plan and its algorithm selection;
// it needs a larger workspace: a caller must ask for the workspace again after a search.
cusparseStatus_t cusparseLtMatmulSearch(const cusparseLtHandle_t* h, cusparseLtMatmulPlan_t* plan, const void* alpha, const void* a,
                                        const void* b, const void* beta, const void* c, void* d, void* workspace, cudaStream_t* streams,
                                        int32_t num_streams) {
  if (!made(h) || get<uint32_t>(plan) != kTag) return fail(CUSPARSE_STATUS_INVALID_VALUE, "the handle or plan was not made");
  if (num_streams > 0 && streams[0] && streams[0]->capturing) {  // it times its algorithms: a graph cannot hold it
    streams[0]->invalidated = true;
    return fail(CUSPARSE_STATUS_NOT_SUPPORTED, "an algorithm search while the stream captures a graph");
  }
  Plan p = get<Plan>(plan);
  if (const cusparseStatus_t s = run(p, alpha, a, b, beta, c, d, workspace, streams, num_streams); s != CUSPARSE_STATUS_SUCCESS) return s;
  Alg chosen = get<Alg>(p.alg);
  chosen.id = chosen.max_id;
  put(p.alg, chosen);
  p.workspace = kWorkspace[chosen.id];
  put(plan, p);
  ++g_searches;
  return CUSPARSE_STATUS_SUCCESS;
}

// Not cuSPARSELt's: how many searches this process ran, how many plans it holds and has made, for
// the backend's tests.
int64_t sinter_emulated_cusparselt_searches() { return g_searches; }
int64_t sinter_emulated_cusparselt_plans() { return g_plans; }
int64_t sinter_emulated_cusparselt_plans_made() { return g_plans_made; }

cusparseStatus_t cusparseLtSpMMACompressedSize2(const cusparseLtHandle_t* h, const cusparseLtMatDescriptor_t* sparse,
                                                size_t* compressed, size_t* buffer) {
  const Mat m = get<Mat>(sparse);
  if (!made(h) || m.tag != kTag || !m.structured) return fail(CUSPARSE_STATUS_INVALID_VALUE, "not a structured matrix descriptor");
  *compressed = compressed_bytes(m.rows, m.cols), *buffer = 4096;
  return CUSPARSE_STATUS_SUCCESS;
}

// Keeps the two nonzeros of each group of four along op(A)'s k, and their positions.
cusparseStatus_t cusparseLtSpMMACompress2(const cusparseLtHandle_t* h, const cusparseLtMatDescriptor_t* sparse, int is_sparse_a,
                                          cusparseOperation_t op, const void* dense, void* compressed, void* buffer, cudaStream_t) {
  const Mat s = get<Mat>(sparse);
  if (!made(h) || s.tag != kTag || !s.structured) return fail(CUSPARSE_STATUS_INVALID_VALUE, "not a structured matrix descriptor");
  if (!is_sparse_a) return fail(CUSPARSE_STATUS_NOT_SUPPORTED, "the emulator takes A structured");
  if (!aligned(dense, s.alignment) || !aligned(compressed, 16)) return fail(CUSPARSE_STATUS_INVALID_VALUE, "a pointer is not aligned");
  std::memset(buffer, 0xa5, 4096);
  const int64_t m = op_rows(s, op), k = op_cols(s, op);
  const Compressed head{kTag, m, k};
  std::memcpy(compressed, &head, sizeof head);
  auto* values = reinterpret_cast<__nv_bfloat16*>(static_cast<char*>(compressed) + sizeof head);
  auto* index = reinterpret_cast<uint8_t*>(values + m * k / 2);
  const auto* in = static_cast<const __nv_bfloat16*>(dense);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t g = 0; g < k / 4; ++g) {
      const int64_t e = i * (k / 4) + g;
      int kept = 0;
      uint8_t where[2] = {0, 1};  // a group with fewer nonzeros keeps zeros in the free places
      for (int t = 0; t < 4; ++t) {
        if ((in[offset(s, op, i, 4 * g + t)].bits & 0x7fff) == 0) continue;
        if (kept == 2)
          return fail(CUSPARSE_STATUS_INVALID_VALUE, "row " + std::to_string(i) + " of op(A) holds more than two nonzeros in columns " +
                                                         std::to_string(4 * g) + ".." + std::to_string(4 * g + 3) + ": not 2:4 along k");
        where[kept++] = uint8_t(t);
      }
      if (kept == 1 && where[0] == 1) where[1] = 0;  // the lone nonzero at position 1: a zero at 0 beside it
      for (int t = 0; t < 2; ++t) values[2 * e + t] = in[offset(s, op, i, 4 * g + where[t])];
      index[e] = uint8_t(where[0] | where[1] << 2);
    }
  return CUSPARSE_STATUS_SUCCESS;
}

}  // extern "C"

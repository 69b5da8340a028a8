// cuSPARSELt behind cusparselt.h: the library opened once by dlopen, its entry points resolved by
// name (libsinter_cuda links no cuSPARSELt), a handle per device bound to the device's stream.
// y (M, N) = x (M, K) w^T runs as cuSPARSELt's op(A) op(B) with A = w (N x K, row-major, the
// structured operand, 2:4 along K), B = x (M x K, row-major) transposed and D = y^T (N x M,
// column-major: y's memory), so no operand is copied: the layouts PyTorch's 2:4 linear layers
// give cuSPARSELt (_cslt_sparse_mm with the result transposed). A bias over y's columns is a bias
// over D's rows, as cuSPARSELt's epilogue takes it; the plan reads its pointer from the matmul
// descriptor, set before each product (the descriptor lives as long as its plan, at one address).
#include "cuda/cusparselt.h"

#include <cusparseLt.h>
#include <dlfcn.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>
#include <vector>

#include "cuda/cuda.h"

namespace sinter::cuda {
namespace {

#define SINTER_CUSPARSELT_FUNCTIONS(X)                                                                                             \
  X(cusparseLtInit) X(cusparseLtGetProperty) X(cusparseLtGetErrorString) X(cusparseLtDenseDescriptorInit)                          \
  X(cusparseLtStructuredDescriptorInit) X(cusparseLtMatDescriptorDestroy) X(cusparseLtMatmulDescriptorInit)                         \
  X(cusparseLtMatmulAlgSelectionInit) X(cusparseLtMatmulAlgSelectionDestroy) X(cusparseLtMatmulPlanInit)                            \
  X(cusparseLtMatmulPlanDestroy) X(cusparseLtMatmulGetWorkspace) X(cusparseLtMatmul) X(cusparseLtMatmulSearch)                      \
  X(cusparseLtSpMMACompressedSize2) X(cusparseLtSpMMACompress2) X(cusparseLtMatmulDescSetAttribute)                               \
  X(cusparseLtMatmulAlgSetAttribute) X(cusparseLtMatmulAlgGetAttribute)

struct Api {
#define SINTER_DECLARE(f) decltype(&::f) f = nullptr;
  SINTER_CUSPARSELT_FUNCTIONS(SINTER_DECLARE)
#undef SINTER_DECLARE
  std::string error;  // why the library cannot be used ("" when it can)
};

// Opens the first library that loads; its version must be the header's (the handles' layout).
Api load() {
  Api a;
  std::vector<std::string> names;
  if (const char* env = std::getenv("SINTER_CUSPARSELT_LIBRARY"); env && *env) names.push_back(env);
  names.insert(names.end(), {"libcusparseLt.so.0", "/usr/local/cuda/lib64/libcusparseLt.so.0"});
  std::string tried;
  for (const std::string& n : names) {
    void* h = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* e = dlerror();
      tried += (tried.empty() ? "" : "; ") + n + ": " + (e ? e : "not found");
      continue;
    }
#define SINTER_RESOLVE(f)                                                                  \
  if (!(a.f = reinterpret_cast<decltype(&::f)>(dlsym(h, #f)))) {                          \
    a.error = n + " lacks " #f;                                                            \
    return a;                                                                              \
  }
    SINTER_CUSPARSELT_FUNCTIONS(SINTER_RESOLVE)
#undef SINTER_RESOLVE
    int major = -1, minor = -1;
    a.cusparseLtGetProperty(MAJOR_VERSION, &major), a.cusparseLtGetProperty(MINOR_VERSION, &minor);
    if (major != CUSPARSELT_VER_MAJOR || minor != CUSPARSELT_VER_MINOR)
      a.error = n + " is cuSPARSELt " + std::to_string(major) + "." + std::to_string(minor) + "; this build's header is " +
                std::to_string(CUSPARSELT_VER_MAJOR) + "." + std::to_string(CUSPARSELT_VER_MINOR);
    return a;
  }
  a.error = "cuSPARSELt not found (tried " + tried + "; SINTER_CUSPARSELT_LIBRARY names the file)";
  return a;
}

const Api& api() {
  static const Api a = load();
  return a;
}

void check(cusparseStatus_t s, const char* what) {
  SINTER_CHECK(s == CUSPARSE_STATUS_SUCCESS, "[sparse24_linear] cuSPARSELt ", what, " failed: ", api().cusparseLtGetErrorString(s));
}

std::mutex g_mutex;  // the handles, and each weight's plans

const cusparseLtHandle_t* handle(int device) {
  static std::map<int, std::unique_ptr<cusparseLtHandle_t>> handles;
  auto it = handles.find(device);
  if (it != handles.end()) return it->second.get();
  (void)stream(device);  // makes the device current
  auto h = std::make_unique<cusparseLtHandle_t>();
  check(api().cusparseLtInit(h.get()), "cusparseLtInit");
  return handles.emplace(device, std::move(h)).first->second.get();
}

struct Plan {
  cusparseLtMatDescriptor_t b{}, c{};
  cusparseLtMatmulDescriptor_t mm{};
  cusparseLtMatmulAlgSelection_t alg{};
  cusparseLtMatmulPlan_t plan{};
  size_t workspace = 0;
  uint64_t used = 0;  // when last used, on its weight's clock
  bool searched = false;
  int made = 0;  // how many of b, c, alg, plan were made (a failed plan destroys only those)
  ~Plan() {
    const Api& a = api();
    if (made >= 4) a.cusparseLtMatmulPlanDestroy(&plan);
    if (made >= 3) a.cusparseLtMatmulAlgSelectionDestroy(&alg);
    if (made >= 2) a.cusparseLtMatDescriptorDestroy(&c);
    if (made >= 1) a.cusparseLtMatDescriptorDestroy(&b);
  }
};

}  // namespace

using PlanKey = std::tuple<int64_t, bool, bool>;  // M (or its bucket), bias, ReLU

struct Choice {  // the algorithm a search kept
  int id = 0, split_k = 1, split_k_mode = 0;
};

struct SparseGemm {
  int device = 0;
  int64_t N = 0, K = 0;
  cusparseLtMatDescriptor_t a{};
  Tensor compressed;
  std::map<PlanKey, std::unique_ptr<Plan>> plans;  // by M, bias, ReLU; at most kCusparseltPlansPerWeight
  uint64_t clock = 0;                              // counts plan_for's calls, for the plans' `used`
  std::map<PlanKey, Choice> chosen;                // by M's bucket, bias, ReLU: what the bucket's first search kept
  bool made = false;                               // whether `a` was made
  ~SparseGemm() {
    plans.clear();
    if (made) api().cusparseLtMatDescriptorDestroy(&a);
  }
};

namespace {

void set_bias(const cusparseLtHandle_t* h, Plan& p, const Tensor& bias) {
  const void* at = bias.data_ptr();
  check(api().cusparseLtMatmulDescSetAttribute(h, &p.mm, CUSPARSELT_MATMUL_BIAS_POINTER, &at, sizeof at), "bias pointer");
}

// Gives a new plan's algorithm selection the algorithm its bucket's search kept (false where refused).
bool reuse(const cusparseLtHandle_t* h, cusparseLtMatmulAlgSelection_t* alg, const Choice& c) {
  auto set = [&](cusparseLtMatmulAlgAttribute_t at, int v) {
    return api().cusparseLtMatmulAlgSetAttribute(h, alg, at, &v, sizeof v) == CUSPARSE_STATUS_SUCCESS;
  };
  return set(CUSPARSELT_MATMUL_ALG_CONFIG_ID, c.id) &&
         (c.split_k == 1 || (set(CUSPARSELT_MATMUL_SPLIT_K, c.split_k) && set(CUSPARSELT_MATMUL_SPLIT_K_MODE, c.split_k_mode)));
}

// The choice a search left in a plan's algorithm selection (nothing where cuSPARSELt does not say).
std::optional<Choice> chosen_by_search(const cusparseLtHandle_t* h, const Plan& p) {
  Choice c;
  auto get = [&](cusparseLtMatmulAlgAttribute_t at, int& v) {
    return api().cusparseLtMatmulAlgGetAttribute(h, &p.alg, at, &v, sizeof v) == CUSPARSE_STATUS_SUCCESS;
  };
  if (!get(CUSPARSELT_MATMUL_ALG_CONFIG_ID, c.id) || !get(CUSPARSELT_MATMUL_SPLIT_K, c.split_k)) return std::nullopt;
  if (c.split_k != 1 && !get(CUSPARSELT_MATMUL_SPLIT_K_MODE, c.split_k_mode)) return std::nullopt;
  return c;
}

// Destroys the weight's least recently used plan. Safe with products in flight: a plan is host
// state that a launch has read (PyTorch's 2:4 layers destroy theirs right after each launch); the
// bucket's choice outlives it, so its M's next plan searches nothing.
void forget_oldest_plan(SparseGemm& w) {
  auto oldest = std::min_element(w.plans.begin(), w.plans.end(), [](const auto& a, const auto& b) { return a.second->used < b.second->used; });
  if (oldest != w.plans.end()) w.plans.erase(oldest);
}

Plan& plan_for(SparseGemm& w, int64_t M, const Tensor& bias, bool relu) {
  const PlanKey key{M, bias.defined(), relu};
  auto it = w.plans.find(key);
  if (it != w.plans.end()) {
    it->second->used = ++w.clock;
    return *it->second;
  }
  if (w.plans.size() >= kCusparseltPlansPerWeight) forget_oldest_plan(w);
  const Api& a = api();
  const cusparseLtHandle_t* h = handle(w.device);
  auto p = std::make_unique<Plan>();
  check(a.cusparseLtDenseDescriptorInit(h, &p->b, M, w.K, w.K, kCusparseltAlignment, CUDA_R_16BF, CUSPARSE_ORDER_ROW),
        "dense descriptor (x)");
  p->made = 1;
  check(a.cusparseLtDenseDescriptorInit(h, &p->c, w.N, M, w.N, kCusparseltAlignment, CUDA_R_16BF, CUSPARSE_ORDER_COL),
        "dense descriptor (y)");
  p->made = 2;
  check(a.cusparseLtMatmulDescriptorInit(h, &p->mm, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_TRANSPOSE, &w.a, &p->b,
                                         &p->c, &p->c, CUSPARSE_COMPUTE_32F),
        "matmul descriptor");
  if (relu) {
    const int on = 1;
    check(a.cusparseLtMatmulDescSetAttribute(h, &p->mm, CUSPARSELT_MATMUL_ACTIVATION_RELU, &on, sizeof on), "ReLU epilogue");
  }
  if (bias.defined()) set_bias(h, *p, bias);
  check(a.cusparseLtMatmulAlgSelectionInit(h, &p->alg, &p->mm, CUSPARSELT_MATMUL_ALG_DEFAULT), "algorithm selection");
  p->made = 3;
  auto fresh = [&] {  // the default selection, searched at the first product
    p->made = 2, p->searched = false;
    a.cusparseLtMatmulAlgSelectionDestroy(&p->alg);
    check(a.cusparseLtMatmulAlgSelectionInit(h, &p->alg, &p->mm, CUSPARSELT_MATMUL_ALG_DEFAULT), "algorithm selection");
    p->made = 3;
  };
  if (auto c = w.chosen.find({cusparselt_bucket(M), bias.defined(), relu}); c != w.chosen.end()) {
    p->searched = reuse(h, &p->alg, c->second);  // refused where this M's shape lacks that algorithm
    if (!p->searched) fresh();
  }
  cusparseStatus_t planned = a.cusparseLtMatmulPlanInit(h, &p->plan, &p->mm, &p->alg);
  if (planned != CUSPARSE_STATUS_SUCCESS && p->searched) {
    fresh();
    planned = a.cusparseLtMatmulPlanInit(h, &p->plan, &p->mm, &p->alg);
  }
  check(planned, "plan");
  p->made = 4;
  check(a.cusparseLtMatmulGetWorkspace(h, &p->plan, &p->workspace), "workspace size");
  p->used = ++w.clock;
  return *w.plans.emplace(key, std::move(p)).first->second;
}

}  // namespace

std::string cusparselt_why_not() { return api().error; }

int64_t cusparselt_bucket(int64_t M) { return std::bit_ceil(uint64_t(std::max(M, kDenseRows))); }

std::shared_ptr<SparseGemm> cusparselt_compress(const Tensor& w) {
  SINTER_CHECK(api().error.empty(), "[sparse24_linear] ", api().error);
  SINTER_CHECK_DTYPE(w.dtype() == DType::bf16 && w.dim() == 2 && w.is_contiguous(), "[sparse24_linear] cuSPARSELt compresses a ",
                     "contiguous (N, K) bf16 weight, got ", w.dtype(), w.shape());
  std::lock_guard lock(g_mutex);
  const Api& a = api();
  auto g = std::make_shared<SparseGemm>();
  g->device = w.device().index, g->N = w.size(0), g->K = w.size(1);
  const cusparseLtHandle_t* h = handle(g->device);
  check(a.cusparseLtStructuredDescriptorInit(h, &g->a, g->N, g->K, g->K, kCusparseltAlignment, CUDA_R_16BF, CUSPARSE_ORDER_ROW,
                                             CUSPARSELT_SPARSITY_50_PERCENT),
        "structured descriptor (the weight)");
  g->made = true;
  size_t bytes = 0, scratch = 0;
  check(a.cusparseLtSpMMACompressedSize2(h, &g->a, &bytes, &scratch), "compressed size");
  g->compressed = Tensor::empty({int64_t(bytes)}, DType::u8, w.device());
  const Tensor buffer = Tensor::empty({int64_t(scratch) + 1}, DType::u8, w.device());  // freed in stream order
  check(a.cusparseLtSpMMACompress2(h, &g->a, 1, CUSPARSE_OPERATION_NON_TRANSPOSE, w.data_ptr(), g->compressed.data_ptr(),
                                   buffer.data_ptr(), stream(g->device)),
        "compress");
  return g;
}

namespace {

// y = x w^T (+ bias, ReLU) where x, y and bias suit cuSPARSELt: M a multiple of kDenseRows, aligned.
void matmul_suited(SparseGemm& w, const Tensor& x, const Tensor& y, const Tensor& bias, bool relu) {
  std::lock_guard lock(g_mutex);
  const Api& a = api();
  const cusparseLtHandle_t* h = handle(w.device);
  Plan& p = plan_for(w, x.size(0), bias, relu);
  if (bias.defined()) set_bias(h, p, bias);
  cudaStream_t s = stream(w.device);
  const float alpha = 1.0f, beta = 0.0f;
  Tensor ws = Tensor::empty({int64_t(p.workspace) + 1}, DType::u8, x.device());
  if (!p.searched) {  // once per bucket (and per M refusing its choice): cuSPARSELt keeps its fastest in the plan
    check(a.cusparseLtMatmulSearch(h, &p.plan, &alpha, w.compressed.data_ptr(), x.data_ptr(), &beta, y.data_ptr(), y.data_ptr(),
                                   ws.data_ptr(), &s, 1),
          "algorithm search");
    check(a.cusparseLtMatmulGetWorkspace(h, &p.plan, &p.workspace), "workspace size");
    p.searched = true;
    if (const auto c = chosen_by_search(h, p)) w.chosen.try_emplace({cusparselt_bucket(x.size(0)), bias.defined(), relu}, *c);
    ws = Tensor::empty({int64_t(p.workspace) + 1}, DType::u8, x.device());
  }
  check(a.cusparseLtMatmul(h, &p.plan, &alpha, w.compressed.data_ptr(), x.data_ptr(), &beta, y.data_ptr(), y.data_ptr(), ws.data_ptr(),
                           &s, 1),
        "matmul");
}

bool aligned(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % kCusparseltAlignment == 0; }

}  // namespace

void cusparselt_matmul(SparseGemm& w, const Tensor& x, const Tensor& y, const Tensor& bias, bool relu) {
  const int64_t M = x.size(0);
  SINTER_CHECK_SHAPE(x.dim() == 2 && x.size(1) == w.K && y.dim() == 2 && y.size(0) == M && y.size(1) == w.N && x.is_contiguous() &&
                         y.is_contiguous() && x.dtype() == DType::bf16 && y.dtype() == DType::bf16,
                     "[sparse24_linear] cuSPARSELt takes contiguous bf16 x (M, ", w.K, ") and y (M, ", w.N, "), got x", x.shape(), " y",
                     y.shape());
  SINTER_CHECK_SHAPE(!bias.defined() || (bias.dtype() == DType::bf16 && bias.shape() == Shape{w.N}),
                     "[sparse24_linear] cuSPARSELt's bias is bf16 (", w.N, "), got ", bias.dtype(), bias.shape());
  Tensor b = bias;
  if (b.defined() && !(b.is_contiguous() && aligned(b))) {  // a view: its own aligned copy
    b = Tensor::empty({w.N}, DType::bf16, bias.device());
    copy_convert("sparse24_linear", bias, b);
  }
  const int64_t padded = (M + kDenseRows - 1) / kDenseRows * kDenseRows;
  if (padded == M && aligned(x) && aligned(y)) return matmul_suited(w, x, y, b, relu);
  // As PyTorch pads its 2:4 layers' inputs: x in zero rows up to the next multiple, y through a copy.
  const Tensor xp = zeros({padded, w.K}, DType::bf16, x.device()), yp = Tensor::empty({padded, w.N}, DType::bf16, y.device());
  copy_convert("sparse24_linear", x, xp.narrow(0, 0, M));
  matmul_suited(w, xp, yp, b, relu);
  copy_convert("sparse24_linear", yp.narrow(0, 0, M), y);
}

}  // namespace sinter::cuda

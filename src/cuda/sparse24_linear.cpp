// The sparse24_linear op's CUDA kernel: y = act(x W^T + b) for a 2:4 weight. Each weight keeps on
// the device a dense copy in x's dtype (remade when values, meta or scales change) and, for bf16 x,
// its cuSPARSELt form (cusparselt.h; int8 and f32 values become bf16, scales applied). The first call
// in each bucket of M times cuSPARSELt against cuBLASLt on the dense copy and keeps the faster for
// the bucket: never slower than dense, and a new M costs no timing. SINTER_SPARSE24_CUDA=dense|sparse
// overrides it (sparse: cuSPARSELt at every M, an error where it cannot). f32 x runs the dense copy
// (cuSPARSELt's f32 is TF32). The bias is in the GEMM's epilogue on both paths, a ReLU too on
// cuSPARSELt's; silu and gelu (erf; cuSPARSELt's GELU is the tanh form) follow the GEMM.
#include <map>
#include <memory>
#include <mutex>

#include "cuda/cuda.h"
#include "cuda/cusparselt.h"
#include "cuda/gemm.h"
#include "sinter/autograd.h"
#include "sinter/op.h"
#include "sinter/ops.h"
#include "sinter/sparse.h"

namespace sinter::cuda {
namespace {

using Source = SemiStructuredSparse::Source;  // what a copy was made from (weakly held storage, data, version)

struct Weight {
  Source from[3];
  Tensor dense;                         // (N, K) in x's dtype
  std::shared_ptr<SparseGemm> sparse;   // bf16 only; null where cuSPARSELt cannot run it, `why_not` says why
  std::string why_not;
  std::map<int64_t, bool> use_sparse;   // by M's bucket: the timed choice (false also where cuSPARSELt refused M)
};

std::mutex g_mutex;
std::map<std::pair<const Storage*, DType>, Weight>& weights() {
  static auto* w = new std::map<std::pair<const Storage*, DType>, Weight>;  // never destroyed: weights freed at exit find it
  return *w;
}

Weight& weight_for(const Tensor& values, const Tensor& meta, const Tensor& scales, DType dtype) {
  auto& all = weights();
  const std::pair<const Storage*, DType> key{values.storage().get(), dtype};
  const Tensor* parts[3] = {&values, &meta, &scales};
  if (auto it = all.find(key); it != all.end()) {
    bool same = true;
    for (int i = 0; i < 3 && same; ++i) same = it->second.from[i].same(*parts[i]);
    if (same) return it->second;
  }
  for (auto it = all.begin(); it != all.end();)  // before a new copy: those whose weights are gone (a hit needs no purge)
    it = it->second.from[0].storage.expired() ? all.erase(it) : std::next(it);
  static const OpDef& to_dense = get_op("sparse24_to_dense");
  Weight& w = all[key] = Weight{};
  // Scaled bf16 values round to bf16 only where x is bf16: f32 and f64 x see them as the CPU does.
  const bool widen = values.dtype() == DType::bf16 && dtype != DType::bf16;
  w.dense = call1(to_dense, {widen ? cast(values, DType::f32) : values, meta, scales});
  if (w.dense.dtype() != dtype) w.dense = cast(w.dense, dtype);
  w.why_not = dtype != DType::bf16 ? std::string("x is ") + dtype_name(dtype) + " (cuSPARSELt serves bf16 here)" : cusparselt_why_not();
  if (w.why_not.empty()) {
    try {
      w.sparse = cusparselt_compress(w.dense);
    } catch (const Error& e) {  // a shape cuSPARSELt does not take (its dims' multiples): the dense copy serves
      w.why_not = e.what();
    }
  }
  for (int i = 0; i < 3; ++i) w.from[i] = {parts[i]->storage(), parts[i]->data_ptr(), parts[i]->version()};
  return w;
}

// What follows the product: the bias and the activation ("none", "relu", "silu", "gelu").
struct Epilogue {
  Tensor bias;
  std::string act;
};

void activate(const Tensor& y, const std::string& act) {
  if (act == "relu") copy_convert("sparse24_linear", relu(y), y);
  if (act == "silu") copy_convert("sparse24_linear", silu(y), y);
  if (act == "gelu") copy_convert("sparse24_linear", gelu(y), y);
}

void run_dense(const Weight& w, const Tensor& x, const Tensor& y, const Epilogue& e) {
  gemm("sparse24_linear", x.unsqueeze(0), w.dense.t().unsqueeze(0), y.unsqueeze(0), e.bias);  // the bias in cuBLASLt's epilogue
  activate(y, e.act);
}

void run_sparse(Weight& w, const Tensor& x, const Tensor& y, const Epilogue& e) {
  const bool relu = e.act == "relu";
  cusparselt_matmul(*w.sparse, x, y, e.bias, relu);
  if (!relu) activate(y, e.act);
}

// Milliseconds of three runs of f on the device's stream (one host wait).
template <class F> float time_three(int device, F&& f) {
  cudaEvent_t start, stop;
  SINTER_CUDA_CHECK(cudaEventCreate(&start));
  SINTER_CUDA_CHECK(cudaEventCreate(&stop));
  SINTER_CUDA_CHECK(cudaEventRecord(start, stream(device)));
  for (int i = 0; i < 3; ++i) f();
  SINTER_CUDA_CHECK(cudaEventRecord(stop, stream(device)));
  wait(device);
  float ms = 0;
  SINTER_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start), cudaEventDestroy(stop);
  return ms;
}

bool choose_sparse(Weight& w, const Tensor& x, const Tensor& y, const Epilogue& e) {
  const char* env = std::getenv("SINTER_SPARSE24_CUDA");
  const std::string force = env ? env : "";
  if (force == "dense") return false;
  SINTER_CHECK(w.sparse || force != "sparse", "[sparse24_linear] SINTER_SPARSE24_CUDA=sparse, but cuSPARSELt cannot run this weight: ",
               w.why_not);
  if (!w.sparse) return false;
  if (force == "sparse") return true;  // cuSPARSELt's own error, if it fails, is the op's
  const int64_t M = cusparselt_bucket(x.size(0));
  if (auto it = w.use_sparse.find(M); it != w.use_sparse.end()) return it->second;
  try {
    run_sparse(w, x, y, e);  // the plan and cuSPARSELt's algorithm search, once per bucket
  } catch (const Error&) {
    return w.use_sparse[M] = false;  // a plan cuSPARSELt refuses: the dense copy serves this bucket
  }
  const int device = x.device().index;
  run_dense(w, x, y, e);
  const float sparse_ms = time_three(device, [&] { run_sparse(w, x, y, e); });
  const float dense_ms = time_three(device, [&] { run_dense(w, x, y, e); });
  return w.use_sparse[M] = sparse_ms < dense_ms;
}

void sparse24_linear_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  NoGradGuard no_grad;  // the ops this kernel calls (the dense copy, the activation) record nothing
  SINTER_CHECK(!a.b_or("packed_only", false), "[sparse24_linear] a weight held only prepacked is in the CPU's layout: unpack() it "
                                              "before moving it to ", in[0].device());
  const Epilogue e{a.b("bias") ? in[4] : Tensor(), a.str("activation")};
  const int64_t N = in[1].size(0), K = in[1].size(1) * 2, M = in[0].numel() / std::max<int64_t>(K, 1);
  const DType dt = in[0].dtype();
  const Tensor x = in[0].contiguous().reshape({M, K});
  const Tensor y = out[0].reshape({M, N});
  std::lock_guard lock(g_mutex);
  Weight& w = weight_for(in[1], in[2], in[3], dt);
  if (dt == DType::f64) {
    copy_convert("sparse24_linear", e.bias.defined() ? matmul(x, w.dense.t()) + e.bias : matmul(x, w.dense.t()), y);
    activate(y, e.act);
  } else if (choose_sparse(w, x, y, e)) {
    run_sparse(w, x, y, e);
  } else {
    run_dense(w, x, y, e);
  }
}

}  // namespace

void register_sparse24_linear_kernel() { register_kernel("sparse24_linear", DeviceType::cuda, sparse24_linear_kernel); }

}  // namespace sinter::cuda

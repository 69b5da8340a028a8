// The sparse24_linear op's CUDA kernel: y = act(x W^T + b) for a 2:4 weight. Each weight keeps on
// the device a dense copy in x's dtype (remade when values, meta or scales change) and, for bf16 x,
// its cuSPARSELt form (cusparselt.h; int8 and f32 values become bf16, scales applied). The first
// call at each M times cuSPARSELt (after its algorithm search) against cuBLASLt on the dense copy
// and keeps the faster, so a 2:4 layer is never slower than dense. SINTER_SPARSE24_CUDA=dense|sparse
// overrides it (sparse: cuSPARSELt at every M, an error where it cannot run the weight).
// f32 x runs the dense copy (cuSPARSELt's f32 is TF32); bias and activation follow the GEMM.
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
  std::map<int64_t, bool> use_sparse;   // by M: the timed choice (false also where cuSPARSELt refused M)
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

void dense_gemm(const Weight& w, const Tensor& x, const Tensor& y, const Tensor& bias) {
  gemm("sparse24_linear", x.unsqueeze(0), w.dense.t().unsqueeze(0), y.unsqueeze(0), bias);
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

bool choose_sparse(Weight& w, const Tensor& x, const Tensor& y) {
  const char* env = std::getenv("SINTER_SPARSE24_CUDA");
  const std::string force = env ? env : "";
  if (force == "dense") return false;
  SINTER_CHECK(w.sparse || force != "sparse", "[sparse24_linear] SINTER_SPARSE24_CUDA=sparse, but cuSPARSELt cannot run this weight: ",
               w.why_not);
  if (!w.sparse) return false;
  if (force == "sparse") return true;  // cuSPARSELt's own error, if it fails, is the op's
  const int64_t M = x.size(0);
  if (auto it = w.use_sparse.find(M); it != w.use_sparse.end()) return it->second;
  try {
    cusparselt_matmul(*w.sparse, x, y);  // the plan and cuSPARSELt's algorithm search, once per M
  } catch (const Error&) {
    return w.use_sparse[M] = false;  // a plan cuSPARSELt refuses: the dense copy serves this M
  }
  const int device = x.device().index;
  dense_gemm(w, x, y, {});
  const float sparse_ms = time_three(device, [&] { cusparselt_matmul(*w.sparse, x, y); });
  const float dense_ms = time_three(device, [&] { dense_gemm(w, x, y, {}); });
  return w.use_sparse[M] = sparse_ms < dense_ms;
}

Tensor activate(const Tensor& y, const std::string& act) {
  if (act == "relu") return relu(y);
  if (act == "silu") return silu(y);
  if (act == "gelu") return gelu(y);
  return y;
}

void sparse24_linear_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  NoGradGuard no_grad;  // the ops this kernel calls (the dense copy, the activation) record nothing
  SINTER_CHECK(!a.b_or("packed_only", false), "[sparse24_linear] a weight held only prepacked is in the CPU's layout: unpack() it "
                                              "before moving it to ", in[0].device());
  const Tensor bias = a.b("bias") ? in[4] : Tensor();
  const int64_t N = in[1].size(0), K = in[1].size(1) * 2, M = in[0].numel() / std::max<int64_t>(K, 1);
  const DType dt = in[0].dtype();
  const Tensor x = in[0].contiguous().reshape({M, K});
  const Tensor y = out[0].reshape({M, N});
  {
    std::lock_guard lock(g_mutex);
    Weight& w = weight_for(in[1], in[2], in[3], dt);
    if (dt == DType::f64) {
      copy_convert("sparse24_linear", bias.defined() ? matmul(x, w.dense.t()) + bias : matmul(x, w.dense.t()), y);
    } else if (choose_sparse(w, x, y)) {
      cusparselt_matmul(*w.sparse, x, y);
      if (bias.defined()) add_into("sparse24_linear", y, bias);
    } else {
      dense_gemm(w, x, y, bias);  // the bias in cuBLASLt's epilogue
    }
  }
  const std::string& act = a.str("activation");
  if (act != "none") copy_convert("sparse24_linear", activate(y, act), y);
}

}  // namespace

void register_sparse24_linear_kernel() { register_kernel("sparse24_linear", DeviceType::cuda, sparse24_linear_kernel); }

}  // namespace sinter::cuda

// cuDNN's fused attention (cudnn_sdpa.h) through cudnn-frontend's graph API, built for dynamic
// loading: libcudnn.so.9 is opened on first use ($SINTER_CUDNN_LIBRARY, then the loader's path,
// then the toolkit's), so libsinter_cuda links no cuDNN. A graph is built once per shape, layout,
// causal rule, bias and scale, and cached with its workspace size; a call cuDNN refuses is cached
// as refused, with cuDNN's reason. cuDNN's Stats output is the rows' natural-log log-sum-exp, the
// flash kernels' lse, so either backward takes either forward's.
#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#include <cudnn_frontend.h>
#include <dlfcn.h>

#include <bit>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "cuda/cuda.h"
#include "cuda/cudnn_sdpa.h"

namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;  // the frontend's calls into cuDNN go through this handle
}

namespace sinter::cuda {
namespace {

namespace fe = cudnn_frontend;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

constexpr size_t kMinVersion = 90500;  // SDPA backward with a bias and GQA

// libcudnn, opened once; `error` says why not.
struct Library {
  bool ok = false;
  std::string error;
};

const Library& library() {
  static const Library lib = [] {
    std::vector<std::string> names;
    if (const char* env = std::getenv("SINTER_CUDNN_LIBRARY"); env && *env) names.push_back(env);
    names.insert(names.end(), {"libcudnn.so.9", "/usr/local/cuda/lib64/libcudnn.so.9", "/usr/lib/x86_64-linux-gnu/libcudnn.so.9"});
    std::string tried;
    for (const std::string& n : names) {
      if (void* h = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL)) {
        fe::cudnn_dlhandle = h;
        const size_t v = fe::detail::get_backend_version();
        if (v < kMinVersion) return Library{false, "cuDNN " + std::to_string(v) + " (" + n + ") is older than 9.5"};
        return Library{true, ""};
      }
      const char* e = dlerror();
      tried += (tried.empty() ? "" : "; ") + n + ": " + (e ? e : "not found");
    }
    return Library{false, "cuDNN not found (tried " + tried + "; SINTER_CUDNN_LIBRARY names the file)"};
  }();
  return lib;
}

std::mutex g_mutex;  // guards the handles and the graph cache

cudnnHandle_t handle(int device) {
  static std::map<int, cudnnHandle_t> handles;
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  const cudaStream_t s = stream(device);
  cudnnHandle_t h = nullptr;
  cudnnStatus_t st = fe::detail::create_handle(&h);
  if (st == CUDNN_STATUS_SUCCESS) st = fe::detail::set_stream(h, s);
  SINTER_CHECK(st == CUDNN_STATUS_SUCCESS, "[cuda] cuDNN: cudnnCreate/cudnnSetStream failed: ", fe::detail::get_error_string(st));
  return handles.emplace(device, h).first->second;
}

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kBias, kDO, kDQ, kDK, kDV };

struct Graph {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
  std::string refused;  // why cuDNN would not build it ("" when built)
};

// Dims and strides of t (any rank, 4-D for the operands): the key and the graph's tensors use both.
std::vector<int64_t> dims_of(const Tensor& t) { return {t.shape().begin(), t.shape().end()}; }
std::vector<int64_t> strides_of(const Tensor& t) {
  std::vector<int64_t> s;
  for (int64_t i = 0; i < t.dim(); ++i) s.push_back(t.size(i) == 1 ? 1 : t.stride(i));
  return s;
}

TensorPtr operand(fe::graph::Graph& gr, const char* name, Uid uid, const Tensor& t) {
  return gr.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims_of(t)).set_stride(strides_of(t)));
}
void set_output(const TensorPtr& p, Uid uid, const Tensor& t) {
  p->set_output(true).set_uid(uid).set_dim(dims_of(t)).set_stride(strides_of(t));
}

std::shared_ptr<fe::graph::Graph> new_graph(int device) {
  auto gr = std::make_shared<fe::graph::Graph>();
  gr->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  cudaDeviceProp p{};
  SINTER_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  gr->set_sm_version(p.major * 10 + p.minor);  // told, so the frontend need not ask a CUDA runtime of its own
  return gr;
}

// Builds (or finds) the graph for `key`; `make` declares its tensors and operation.
template <class Make> const Graph& cached(std::vector<int64_t> key, int device, Make&& make) {
  static std::map<std::vector<int64_t>, Graph> cache;
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  Graph g;
  try {
    g.graph = new_graph(device);
    make(*g.graph);
    fe::error_t st = g.graph->build(handle(device), {fe::HeurMode_t::A});
    if (st.is_bad()) g.refused = "cuDNN refused the graph: " + st.get_message();
    else if (g.graph->get_workspace_size(g.workspace).is_bad()) g.refused = "cuDNN gave no workspace size";
  } catch (const std::exception& e) {
    g.refused = std::string("cuDNN failed: ") + e.what();
  }
  if (!g.refused.empty()) g.graph.reset();
  return cache.emplace(std::move(key), std::move(g)).first->second;
}

std::vector<int64_t> key_of(bool backward, const detail::Geometry& g, int device, std::initializer_list<const Tensor*> ts) {
  std::vector<int64_t> k{backward, device, g.causal, int64_t(std::bit_cast<uint64_t>(g.scale))};
  for (const Tensor* t : ts) {
    k.push_back(t->defined() ? t->dim() : -1);
    if (!t->defined()) continue;
    for (int64_t v : dims_of(*t)) k.push_back(v);
    for (int64_t v : strides_of(*t)) k.push_back(v);
  }
  return k;
}

// A layout cuDNN reads: last dim contiguous, 16-byte aligned rows and base.
bool aligned(const Tensor& t) {
  if (!t.defined()) return true;
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0 || (t.dim() && t.size(-1) > 1 && t.stride(-1) != 1)) return false;
  for (int64_t i = 0; i + 1 < t.dim(); ++i)
    if (t.size(i) > 1 && t.stride(i) % 8 != 0) return false;
  return true;
}

TensorPtr stats_tensor(fe::graph::Graph& gr, const detail::Geometry& g) {
  return gr.tensor(fe::graph::Tensor_attributes()
                       .set_name("stats")
                       .set_uid(kStats)
                       .set_dim({g.B, g.Hq, g.Lq, 1})
                       .set_stride({g.Hq * g.Lq, g.Lq, 1, 1})
                       .set_data_type(fe::DataType_t::FLOAT));
}

// Sinter's causal rule is bottom-right (query i sees keys j <= i + Lkv - Lq). Where Lq == Lkv that is
// cuDNN's top-left mask, which cuDNN also takes with a bias (its bottom-right mask takes none).
template <class Attributes> void set_causal(Attributes& opts, const detail::Geometry& g) {
  if (!g.causal) return;
  if (g.Lq == g.Lkv) opts.set_causal_mask(true);
  else opts.set_causal_mask_bottom_right(true);
}

void* workspace(const Graph& gr, int device, Tensor& holder) {
  if (gr.workspace == 0) return nullptr;
  holder = Tensor::empty({gr.workspace}, DType::u8, Device::cuda(device));  // freed in stream order
  return holder.data_ptr();
}

// Runs a built graph on the device's stream; a failure (cuDNN's status, or the frontend's
// exception) is an error naming the op.
void run(const Graph& gr, int device, std::unordered_map<int64_t, void*>& pack, const char* op) {
  Tensor ws;
  std::string why;
  try {
    fe::error_t st = gr.graph->execute(handle(device), pack, workspace(gr, device, ws));
    if (st.is_bad()) why = st.get_message();
  } catch (const std::exception& e) {
    why = e.what();
  }
  SINTER_CHECK(why.empty(), "[", op, "] cuDNN's attention failed to run: ", why);
}

}  // namespace

std::string cudnn_sdpa_why_not(const detail::Geometry& g, DType dtype) {
  if (dtype != DType::bf16) return std::string("cuDNN's attention here takes bf16 (got ") + dtype_name(dtype) + ")";
  if (g.D > 256 || g.Dv > 256 || g.D % 8 || g.Dv % 8) return "cuDNN takes head dims that are multiples of 8 up to 256";
  if (g.dropout > 0) return "dropout draws Sinter's Philox stream, not cuDNN's";
  if (g.window > 0) return "a sliding window";
  if (g.causal && g.Lq > g.Lkv) return "a causal call with more queries than keys";
  if (g.Lq == 1) return "one query row: the split-K decode kernel reads the cache on every SM";
  if (const char* env = std::getenv("SINTER_CUDNN_ATTENTION"); env && std::string(env) == "0") return "SINTER_CUDNN_ATTENTION=0";
  const Library& lib = library();
  return lib.ok ? "" : lib.error;
}

bool cudnn_sdpa_forward(const detail::Geometry& g, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                        const Tensor& o, const Tensor& lse) {
  if (!cudnn_sdpa_why_not(g, q.dtype()).empty()) return false;
  for (const Tensor* t : {&q, &k, &v, &bias, &o})
    if (!aligned(*t)) return false;
  const int device = q.device().index;
  std::lock_guard lock(g_mutex);
  const Graph& gr = cached(key_of(false, g, device, {&q, &k, &v, &bias, &o}), device, [&](fe::graph::Graph& graph) {
    auto opts = fe::graph::SDPA_attributes().set_name("sinter_sdpa").set_generate_stats(true).set_attn_scale(float(g.scale));
    set_causal(opts, g);
    if (bias.defined()) opts.set_bias(operand(graph, "bias", kBias, bias));
    auto [O, stats] = graph.sdpa(operand(graph, "q", kQ, q), operand(graph, "k", kK, k), operand(graph, "v", kV, v), opts);
    set_output(O, kO, o);
    stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT).set_dim({g.B, g.Hq, g.Lq, 1}).set_stride(
        {g.Hq * g.Lq, g.Lq, 1, 1});
  });
  if (!gr.graph) return false;
  std::unordered_map<int64_t, void*> pack{{kQ, q.data_ptr()}, {kK, k.data_ptr()}, {kV, v.data_ptr()}, {kO, o.data_ptr()},
                                          {kStats, lse.data_ptr()}};
  if (bias.defined()) pack[kBias] = bias.data_ptr();
  run(gr, device, pack, "sdpa");
  return true;
}

bool cudnn_sdpa_backward(const detail::Geometry& g, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                         const Tensor& lse, const Tensor& dout, const Tensor& bias, std::span<Tensor> grads) {
  if (!cudnn_sdpa_why_not(g, q.dtype()).empty()) return false;
  const Tensor *dq = &grads[0], *dk = &grads[1], *dv = &grads[2];
  for (const Tensor* t : {&q, &k, &v, &o, &dout, &bias, dq, dk, dv})
    if (!aligned(*t)) return false;
  const int device = q.device().index;
  std::lock_guard lock(g_mutex);
  const Graph& gr = cached(key_of(true, g, device, {&q, &k, &v, &o, &dout, &bias, dq, dk, dv}), device,
                           [&](fe::graph::Graph& graph) {
                             auto opts = fe::graph::SDPA_backward_attributes().set_name("sinter_sdpa_backward").set_attn_scale(float(g.scale));
                             set_causal(opts, g);
                             if (bias.defined()) opts.set_bias(operand(graph, "bias", kBias, bias));
                             auto [dq, dk, dv] = graph.sdpa_backward(operand(graph, "q", kQ, q), operand(graph, "k", kK, k),
                                                                     operand(graph, "v", kV, v), operand(graph, "o", kO, o),
                                                                     operand(graph, "do", kDO, dout), stats_tensor(graph, g), opts);
                             set_output(dq, kDQ, grads[0]), set_output(dk, kDK, grads[1]), set_output(dv, kDV, grads[2]);
                           });
  if (!gr.graph) return false;
  std::unordered_map<int64_t, void*> pack{{kQ, q.data_ptr()},      {kK, k.data_ptr()},        {kV, v.data_ptr()},
                                          {kO, o.data_ptr()},      {kStats, lse.data_ptr()},  {kDO, dout.data_ptr()},
                                          {kDQ, grads[0].data_ptr()}, {kDK, grads[1].data_ptr()}, {kDV, grads[2].data_ptr()}};
  if (bias.defined()) pack[kBias] = bias.data_ptr();
  run(gr, device, pack, "sdpa_flash_backward");
  return true;
}

}  // namespace sinter::cuda

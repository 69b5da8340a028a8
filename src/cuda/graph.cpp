// CUDA graphs behind include/sinter/cuda.h's Graph: the device's stream captures what fn queues
// (thread-local mode: only this thread's calls that a graph cannot hold fail the capture), the
// allocator serves the capture from a pool of the graph's own (caching_allocator.h), and the
// instantiated graph is launched on the stream. Freeing a graph gives its pool to the stream,
// whose order puts any later use of those blocks after the graph's last replay.
#include <atomic>
#include <memory>

#include "cuda/caching_allocator.h"
#include "cuda/cuda.h"

namespace sinter::cuda {
namespace {

struct Graph {
  int device = 0;
  uintptr_t pool = 0;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
};

thread_local int t_capturing = -1;  // the device this thread captures on
std::atomic<uintptr_t> g_pools{0};  // pools made so far

// Ends a capture that fn or the runtime failed: nothing it recorded will run, so its blocks go to the stream.
void abandon(Graph& g, cudaStream_t s) {
  if (g.graph) (void)cudaGraphDestroy(g.graph);
  (void)cudaGetLastError();
  memory(g.device).retire_pool(g.pool, uintptr_t(s));
}

}  // namespace

bool capturing(int device) { return t_capturing == device; }

void* graph_capture(int device, const std::function<void()>& fn) {
  SINTER_CHECK(t_capturing < 0, "[cuda] this thread is already capturing a graph on cuda:", t_capturing);
  cudaStream_t s = stream(device);
  auto g = std::make_unique<Graph>();
  g->device = device;
  g->pool = (++g_pools << 1) | 1;  // odd: never a stream's address
  memory(device).begin_pool(g->pool);
  cudaError_t e = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  std::exception_ptr failed;
  if (e == cudaSuccess) {
    t_capturing = device;
    try {
      fn();
    } catch (...) {
      failed = std::current_exception();
    }
    t_capturing = -1;
    e = cudaStreamEndCapture(s, &g->graph);
  }
  memory(device).end_pool();
  if (!failed && e == cudaSuccess) e = cudaGraphInstantiate(&g->exec, g->graph, 0);
  if (failed || e != cudaSuccess) {
    abandon(*g, s);
    if (failed) std::rethrow_exception(failed);
    SINTER_THROW(Error, "[cuda] capturing a graph on cuda:", device, " failed: ", cudaGetErrorString(e), " (error ", int(e),
                 "): the captured work did what a graph cannot hold (a wait for the device, a cudaFree, cuSPARSELt's search)");
  }
  return g.release();
}

void graph_replay(void* graph) {
  const Graph& g = *static_cast<const Graph*>(graph);
  SINTER_CUDA_CHECK(cudaGraphLaunch(g.exec, stream(g.device)));
  check_launch("cuda graph replay");
}

void graph_free(void* graph) {
  std::unique_ptr<Graph> g(static_cast<Graph*>(graph));
  (void)cudaGraphExecDestroy(g->exec);
  (void)cudaGraphDestroy(g->graph);
  memory(g->device).retire_pool(g->pool, uintptr_t(stream(g->device)));
}

}  // namespace sinter::cuda

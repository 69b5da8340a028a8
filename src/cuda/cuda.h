#pragma once
// The CUDA backend (libsinter_cuda): what its files share. The backend owns the CUDA context of
// each device, one stream per device (created when first used; every kernel and copy goes on it,
// so a device's work runs in the order it was asked for), a caching allocator per device
// (caching_allocator.h), and a kernel per op it serves, registered into the op table by
// sinter_cuda_attach (backend.cpp). Host reads of device data copy explicitly (copy.cu).
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>

#include "sinter/error.h"
#include "sinter/tensor.h"

#define SINTER_CUDA_CHECK(expr)                                                                          \
  do {                                                                                                   \
    const cudaError_t e_ = (expr);                                                                       \
    if (e_ != cudaSuccess)                                                                               \
      SINTER_THROW(Error, "[cuda] ", #expr, " failed: ", cudaGetErrorString(e_), " (error ", int(e_), ")"); \
  } while (0)

namespace sinter::cuda {

cudaStream_t stream(int device);         // the device's stream; makes the device current
void check_launch(const char* op);       // the last launch's error, naming the op

// What a kernel found wrong in its input (an index out of range), written to host memory the
// device maps; the host raises it at its next wait, naming the op as the CPU's kernel would.
struct DeviceFault {
  int set;  // 0: nothing found; the first kernel to find something claims it (atomicCAS)
  int64_t value, position, size;
  int64_t length;    // > 0: positions value..value+length of a dimension of `size`; -1: row `value` is
                     // wrong as `what` says; 0: an index
  const char* op;    // host strings with static storage, carried through the kernel untouched
  const char* what;
};
DeviceFault* device_fault(int device);   // the device's view of its record
// Waits until the device's queued work is done: a host synchronization (counted for
// host_synchronizations), then raises a fault a kernel recorded (backend.cpp). An error while this
// thread captures a graph on the device (a graph holds no host wait).
void wait(int device);
class CachingAllocator;
CachingAllocator& memory(int device);  // the device's allocator (backend.cpp)
// Whether this thread is capturing a graph on the device (graph.cpp), and the hooks that make,
// replay and free one (include/sinter/cuda.h's Graph).
bool capturing(int device);
void* graph_capture(int device, const std::function<void()>& fn);
void graph_replay(void* graph);
void graph_free(void* graph);
// Host bytes to device memory on the device's stream, without waiting: up to 8 bytes go as a
// kernel argument, more through pinned staging memory reused once its copy is done (copy.cu).
void copy_from_host(void* dst, const void* src, size_t bytes, int device);

// dst = src converted to dst's dtype and broadcast to its shape, both on one device (elementwise.cu).
void copy_convert(const char* op, const Tensor& src, const Tensor& dst);
// idx as a new contiguous i64 tensor on the device, every value in [0, n) or equal to `ignore`:
// checked on the device (index.cu), a value out of range recorded as the device's fault (raised at
// the next wait, naming the op, `what` ("index", "target"), the value and its position) and
// replaced by `ignore` (or 0), so the kernel reading the indices stays in bounds.
Tensor checked_indices(const char* op, const Tensor& idx, int64_t n, const char* what, int64_t ignore = INT64_MIN);
// out = cond ? a : b, each broadcast to out's shape, in out's dtype (elementwise.cu).
void where_into(const char* op, const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out);
// acc += b (b broadcast to acc's shape), in acc's dtype (elementwise.cu).
void add_into(const char* op, const Tensor& acc, const Tensor& b);

void register_elementwise_kernels();     // elementwise.cu
void register_copy_kernels();            // copy.cu
void register_factory_kernels();         // factory.cu
void register_reduce_kernels();          // reduce.cu
void register_softmax_kernels();         // softmax.cu
void register_linalg_kernels();          // linalg.cpp
void register_nn_kernels();              // nn.cu
void register_update_kernels();          // update.cu
void register_index_kernels();           // index.cu
void register_topk_kernel();             // topk.cu
void register_shape_kernels();           // shape.cpp
void register_position_kernels();        // positions.cu
void register_attention_kernels();       // attention.cpp
void register_sparse24_kernels();        // sparse24.cu
void register_sparse24_linear_kernel();  // sparse24_linear.cpp

}  // namespace sinter::cuda

// CUDA kernels of the 2:4 weight conversions (src/sparse/semi_structured.cpp), with the CPU's
// formulas (cpu/sparse24/choose.cpp): sparse24_to_dense writes each group of four columns from its
// two kept values times the row's scale (a column named twice adds up), computed in f32 (f64 for
// f64) and rounded once; sparse24_gather reads the kept entries of a dense matrix; sparse24_select
// picks them by the CPU's rule (ops/sparse24_select.h), a thread per meta byte (two groups). One
// thread per group of four columns otherwise.
#include <span>

#define SINTER_HD __host__ __device__
#include "cuda/launch.cuh"
#include "ops/sparse24_select.h"
#include "sinter/op.h"
#include "sinter/ops.h"

namespace sinter::cuda {
namespace {

// Columns of the two kept entries of group g (of four columns) in its row's meta.
__device__ __forceinline__ void kept_columns(const uint8_t* meta_row, int64_t g, int& c0, int& c1) {
  const int nib = (meta_row[g / 2] >> (4 * (g % 2))) & 15;
  c0 = nib & 3, c1 = nib >> 2;
}

template <class V, class O>
__global__ void to_dense_k(int64_t n, const V* values, const uint8_t* meta, const float* scales, O* out, int64_t K) {
  using C = std::conditional_t<std::is_same_v<O, double>, double, float>;
  SINTER_GRID_STRIDE(i, n) {
    const int64_t row = i / (K / 4), g = i % (K / 4);
    int c0, c1;
    kept_columns(meta + row * (K / 8), g, c0, c1);
    const C s = C(scales[row]);
    C o[4] = {0, 0, 0, 0};
    o[c0] += C(load(values + row * (K / 2) + 2 * g)) * s;
    o[c1] += C(load(values + row * (K / 2) + 2 * g + 1)) * s;
    for (int c = 0; c < 4; ++c) store(out + row * K + 4 * g + c, compute_t<O>(o[c]));
  }
}

template <class T> __global__ void gather_k(int64_t n, const T* dense, const uint8_t* meta, T* kept, int64_t K) {
  SINTER_GRID_STRIDE(i, n) {
    const int64_t row = i / (K / 4), g = i % (K / 4);
    int c0, c1;
    kept_columns(meta + row * (K / 8), g, c0, c1);
    kept[row * (K / 2) + 2 * g] = dense[row * K + 4 * g + c0];
    kept[row * (K / 2) + 2 * g + 1] = dense[row * K + 4 * g + c1];
  }
}

template <class T> __global__ void select_k(int64_t n, const T* dense, bool* keep, uint8_t* meta, int64_t K) {
  const int64_t K8 = (K + 7) / 8;
  SINTER_GRID_STRIDE(i, n) {
    const int64_t row = i / K8, b = i % K8;
    uint8_t byte = 0;
    for (int64_t g = 2 * b; g < 2 * b + 2 && g < K / 4; ++g) {
      const uint8_t nib = sparse::keep_two_of_four(dense + row * K + 4 * g);
      for (int c = 0; c < 4; ++c) keep[row * K + 4 * g + c] = c == (nib & 3) || c == nib >> 2;
      byte = uint8_t(byte | nib << (4 * (g % 2)));
    }
    meta[i] = byte;
  }
}

void to_dense_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
  const Tensor values = in[0].contiguous(), meta = in[1].contiguous(), scales = in[2].dtype() == DType::f32 ? in[2].contiguous() : cast(in[2], DType::f32);
  const int64_t K = values.size(1) * 2;
  dispatch<Types::numeric>(values.dtype(), "sparse24_to_dense", [&](auto v) {
    using V = decltype(v);
    dispatch<Types::floating>(out[0].dtype(), "sparse24_to_dense", [&](auto o) {
      using O = decltype(o);
      launch_n("sparse24_to_dense", values.size(0) * K / 4, values.device().index, to_dense_k<V, O>, ptr<const V>(values),
               ptr<const uint8_t>(meta), ptr<const float>(scales),
             ptr<O>(out[0]), K);
    });
  });
}

void gather_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
  const Tensor dense = in[0].contiguous(), meta = in[1].contiguous();
  const int64_t K = dense.size(1);
  dispatch<Types::floating>(dense.dtype(), "sparse24_gather", [&](auto t) {
    using T = decltype(t);
    launch_n("sparse24_gather", dense.size(0) * K / 4, dense.device().index, gather_k<T>, ptr<const T>(dense), ptr<const uint8_t>(meta),
             ptr<T>(out[0]), K);
  });
}

void select_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
  const Tensor dense = in[0].contiguous();
  const int64_t N = dense.size(0), K = dense.size(1);
  auto run = [&](auto t) {  // f32 or f64 (the op's inference)
    using T = decltype(t);
    launch_n("sparse24_select", N * ((K + 7) / 8), dense.device().index, select_k<T>, ptr<const T>(dense), ptr<bool>(out[0]),
             ptr<uint8_t>(out[1]), K);
  };
  dense.dtype() == DType::f64 ? run(double{}) : run(float{});
}

}  // namespace

void register_sparse24_kernels() {
  register_kernel("sparse24_to_dense", DeviceType::cuda, to_dense_kernel);
  register_kernel("sparse24_gather", DeviceType::cuda, gather_kernel);
  register_kernel("sparse24_select", DeviceType::cuda, select_kernel);
  register_sparse24_linear_kernel();
}

}  // namespace sinter::cuda

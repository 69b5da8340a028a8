#pragma once
// A raw oneDNN matmul primitive, made once and executed repeatedly: the dense peer of the linear
// and sparse suites. Weights plain (N, K) row-major, as our Linear keeps them, or prepacked into
// oneDNN's preferred blocked layout (the library's best case); optionally with an activation as
// oneDNN's post-op on the output.
#include <dnnl.hpp>
#include <optional>
#include <sinter/sinter.h>

namespace sinter::bench {

struct RawMatmul {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{eng};
  dnnl::matmul prim;
  dnnl::memory src, wei, dst;
  RawMatmul(const Tensor& x, const Tensor& w, const Tensor& y, bool prepack, std::optional<dnnl::algorithm> act = {}) {
    using tag = dnnl::memory::format_tag;
    const auto dt = x.dtype() == DType::bf16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
    const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
    dnnl::memory::desc src_md({M, K}, dt, tag::ab), plain_w({K, N}, dt, tag::ba), dst_md({M, N}, dt, tag::ab);
    dnnl::memory::desc w_md = prepack ? dnnl::memory::desc({K, N}, dt, tag::any) : plain_w;
    dnnl::primitive_attr attr;
    if (act) {
      dnnl::post_ops po;
      po.append_eltwise(1.f, *act, 0.f, 0.f);
      attr.set_post_ops(po);
    }
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, w_md, dst_md), attr, eng);
    prim = dnnl::matmul(pd);
    src = dnnl::memory(src_md, eng, x.data_ptr());
    dst = dnnl::memory(dst_md, eng, y.data_ptr());
    dnnl::memory plain(plain_w, eng, w.data_ptr());
    wei = plain;
    if (prepack && pd.weights_desc() != plain_w) {
      wei = dnnl::memory(pd.weights_desc(), eng);
      dnnl::reorder(plain, wei).execute(stream, plain, wei);
      stream.wait();
    }
  }
  void run() {
    prim.execute(stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}});
    stream.wait();
  }
};


}  // namespace sinter::bench

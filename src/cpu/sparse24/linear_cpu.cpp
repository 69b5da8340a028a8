// CPU kernels of the 2:4 ops (src/sparse/semi_structured.cpp): sparse24_linear runs the kernel
// choose() picks (kernels.h); sparse24_to_dense and sparse24_gather convert between the dense
// matrix and the kept values; sparse24_select picks them (ops/sparse24_select.h).
#include <algorithm>

#include "cpu/cpu.h"
#include "ops/common.h"
#include "ops/sparse24_select.h"
#include "cpu/sparse24/dense_copy.h"
#include "cpu/sparse24/kernels.h"

namespace sinter::sparse {
namespace {

using detail::raw_view;
using cpu::contiguous_as;

// y = act(x dense^T + b) on a cached dense copy, summed in f32 and rounded once to y's dtype, as
// the 2:4 kernels do: bf16 x against a bf16 copy where oneDNN multiplies bf16 (on AMX, the tile
// unit), else x widened against an f32 copy.
void run_dense(const Tensor& x, const Tensor& dense, const Tensor& bias, Act act, const Tensor& out, int64_t M, int64_t N, int64_t K) {
  Tensor x2 = contiguous_as(x, dense.dtype());
  // Without an activation a bf16 product goes straight to a bf16 y (oneDNN rounds once).
  const bool direct = out.dtype() == DType::f32 || (dense.dtype() == DType::bf16 && act == Act::none && out.dtype() == DType::bf16);
  Tensor y = direct ? out : Tensor::empty(out.shape(), DType::f32);
  const DType bias_dt = y.dtype() == DType::bf16 && bias.defined() && bias.dtype() == DType::bf16 ? DType::bf16 : DType::f32;
  Tensor a = raw_view(x2, {1, M, K}, {M * K, K, 1}, x2.offset());
  Tensor bt = raw_view(dense, {1, K, N}, {0, 1, K}, dense.offset());  // dense^T as a view
  cpu::gemm(a, bt, raw_view(y, {1, M, N}, {M * N, N, 1}, y.offset()), bias.defined() ? contiguous_as(bias, bias_dt) : Tensor());
  switch (act) {
    case Act::relu: cpu::unary(cpu::UnaryOp::Relu, y, y); break;
    case Act::silu: cpu::unary(cpu::UnaryOp::Silu, y, y); break;
    case Act::gelu: cpu::unary(cpu::UnaryOp::Gelu, y, y); break;
    case Act::none: break;
  }
  if (!y.same(out)) cpu::copy(y, out);
}

void sparse24_linear_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& a) {
  SINTER_KERNEL_ENTRY();
  size_t at = 4;
  const Tensor bias = a.b("bias") ? in[at++] : Tensor();
  const Tensor packed = a.b("packed") ? contiguous_as(in[at++], DType::u8) : Tensor();
  const Act act = parse_activation(a.str("activation"));
  const bool packed_only = a.b_or("packed_only", false);  // values and meta are empty placeholders
  const int64_t N = packed_only ? a.i("rows") : in[1].size(0), K = packed_only ? a.i("cols") : in[1].size(1) * 2;
  const int64_t M = in[0].numel() / std::max<int64_t>(K, 1);
  Call call{in[0].dtype(), in[1].dtype(), M, N, K, packed.defined(), a.b_or("dense_copy", true), packed_only};
  const KernelDef* k = &choose(call);
  Tensor dense;
  if (k->kernel == Kernel::dense && !(dense = dense_copy(in[1], in[2], in[3], dense_copy_dtype(in[0].dtype(), in[1].dtype()))).defined()) {
    call.dense_allowed = false;
    k = &choose(call);
  }
  if (k->kernel == Kernel::dense) return run_dense(in[0], dense, bias, act, out[0], M, N, K);
  Tensor values = packed_only ? in[1] : contiguous_as(in[1], in[1].dtype()), meta = packed_only ? in[2] : contiguous_as(in[2], DType::u8);
  Tensor scales = contiguous_as(in[3], DType::f32);
  if (k->kernel == Kernel::reference_f64) {
    Tensor x = contiguous_as(in[0], DType::f64), b = bias.defined() ? contiguous_as(bias, DType::f64) : Tensor();
    linear_f64(x.data<double>(), M, K, values.data<double>(), meta.data<uint8_t>(), scales.data<float>(),
               b.defined() ? b.data<double>() : nullptr, act, out[0].data<double>(), N);
    return;
  }
  Tensor b = bias.defined() ? contiguous_as(bias, DType::f32) : Tensor();
  const bool direct = out[0].dtype() == DType::f32 || (k->bf16_y && out[0].dtype() == DType::bf16);
  Tensor y = direct ? out[0] : Tensor::empty(out[0].shape(), DType::f32);
  const bool yh = y.dtype() == DType::bf16;
  Tensor x = contiguous_as(in[0], k->bf16_x ? DType::bf16 : DType::f32);
  const uint8_t* pp = packed.defined() && k->reads_packed ? packed_payload(packed.data<uint8_t>(), packed.numel(), values.dtype(), N, K, "sparse24_linear")
                                       : nullptr;
  k->run({.x = k->bf16_x ? nullptr : x.data<float>(), .xh = reinterpret_cast<const uint16_t*>(x.data_ptr()), .M = M, .K = K, .N = N,
          .values = values.data_ptr(), .vt = values.dtype(), .meta = meta.data<uint8_t>(), .packed = pp, .scales = scales.data<float>(),
          .bias = b.defined() ? b.data<float>() : nullptr, .act = act, .y = yh ? nullptr : y.data<float>(),
          .yh = yh ? reinterpret_cast<uint16_t*>(y.data_ptr()) : nullptr});
  if (!direct) cpu::copy(y, out[0]);
}

void sparse24_to_dense_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
  SINTER_KERNEL_ENTRY();
  const int64_t N = in[0].size(0), K = in[0].size(1) * 2;
  Tensor values = contiguous_as(in[0], in[0].dtype()), meta = contiguous_as(in[1], DType::u8), scales = contiguous_as(in[2], DType::f32);
  if (out[0].dtype() == DType::f64) {
    to_dense<double>(values.data_ptr(), values.dtype(), meta.data<uint8_t>(), scales.data<float>(), N, K, out[0].data<double>());
    return;
  }
  Tensor d = out[0].dtype() == DType::f32 ? out[0] : Tensor::empty({N, K}, DType::f32);
  to_dense<float>(values.data_ptr(), values.dtype(), meta.data<uint8_t>(), scales.data<float>(), N, K, d.data<float>());
  if (out[0].dtype() != DType::f32) cpu::copy(d, out[0]);
}

void sparse24_gather_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
  SINTER_KERNEL_ENTRY();
  const int64_t N = in[0].size(0), K = in[0].size(1);
  Tensor meta = contiguous_as(in[1], DType::u8);
  if (in[0].dtype() == DType::f64)
    gather_kept<double>(contiguous_as(in[0], DType::f64).data<double>(), meta.data<uint8_t>(), N, K, out[0].data<double>());
  else
    gather_kept<float>(contiguous_as(in[0], DType::f32).data<float>(), meta.data<uint8_t>(), N, K, out[0].data<float>());
}

template <class T> void select_kept(const T* dense, int64_t N, int64_t K, bool* keep, uint8_t* meta) {
  const int64_t K8 = (K + 7) / 8;
  parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t b = 0; b < K8; ++b) {
        uint8_t byte = 0;
        for (int64_t g = 2 * b; g < std::min(2 * b + 2, K / 4); ++g) {
          const uint8_t nib = keep_two_of_four(dense + n * K + 4 * g);
          for (int c = 0; c < 4; ++c) keep[n * K + 4 * g + c] = c == (nib & 3) || c == nib >> 2;
          byte = uint8_t(byte | nib << (4 * (g % 2)));
        }
        meta[n * K8 + b] = byte;
      }
  });
}

void sparse24_select_kernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
  SINTER_KERNEL_ENTRY();
  const int64_t N = in[0].size(0), K = in[0].size(1);
  bool* keep = out[0].data<bool>();
  uint8_t* meta = out[1].data<uint8_t>();
  if (in[0].dtype() == DType::f64) select_kept(contiguous_as(in[0], DType::f64).data<double>(), N, K, keep, meta);
  else select_kept(contiguous_as(in[0], DType::f32).data<float>(), N, K, keep, meta);
}

}  // namespace

void register_sparse_kernels() {
  detail::add_kernel("sparse24_linear", DeviceType::cpu, sparse24_linear_kernel);
  detail::add_kernel("sparse24_to_dense", DeviceType::cpu, sparse24_to_dense_kernel);
  detail::add_kernel("sparse24_gather", DeviceType::cpu, sparse24_gather_kernel);
  detail::add_kernel("sparse24_select", DeviceType::cpu, sparse24_select_kernel);
}

}  // namespace sinter::sparse

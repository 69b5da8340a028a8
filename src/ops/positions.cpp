// Ops whose position is a tensor (a KV cache's fill level), so a traced decode step serves every
// position: dynamic_slice, slice_update_ and kv_append_. Kernels: src/cpu/op_shape.cpp,
// src/cuda/positions.cu.
#include "ops/common.h"

namespace sinter {
namespace detail {
namespace {

//   dynamic_slice(x, start) -> x.narrow(dim, start, length) as a copy      attrs dim, length
//   slice_update_(dst, src, start) writes src at dst.narrow(dim, start, n)  attr dim
// start is an i64 0-d tensor; a range past the dim is an IndexError at run time.
void check_start(const std::string& op, const TensorMeta& start) {
  SINTER_CHECK(start.shape.empty() && start.dtype == DType::i64, "[", op, "] start must be an i64 0-d tensor, got ", start.shape, " ",
               start.dtype);
}

// Whether src can be written into dst at some position along dim: the same rank, every other
// size equal, and no more than dst's along dim.
bool fits_along(const Shape& src, const Shape& dst, int64_t dim) {
  bool ok = src.size() == dst.size() && src[size_t(dim)] <= dst[size_t(dim)];
  for (size_t i = 0; ok && i < dst.size(); ++i) ok = int64_t(i) == dim || src[i] == dst[i];
  return ok;
}

void define_dynamic_slice() {
  OpDef d;
  d.name = "dynamic_slice";
  d.num_inputs = 2;
  d.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    check_start("dynamic_slice", in[1]);
    const int64_t dim = wrap_dim("dynamic_slice", a.i("dim"), int64_t(in[0].shape.size()));
    SINTER_CHECK_INDEX(a.i("length") >= 0 && a.i("length") <= in[0].shape[size_t(dim)], "[dynamic_slice] length ", a.i("length"),
                       " out of range for size ", in[0].shape[size_t(dim)], " of a ", in[0].shape, " tensor");
    TensorMeta m = in[0];
    m.shape[size_t(dim)] = a.i("length");
    return std::vector<TensorMeta>{m};
  };
  add_op(std::move(d));
}

void define_slice_update() {
  OpDef d;
  d.name = "slice_update_";
  d.num_inputs = 3;
  d.mutates = 1;
  d.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    check_start("slice_update_", in[2]);
    const int64_t dim = wrap_dim("slice_update_", a.i("dim"), int64_t(in[0].shape.size()));
    SINTER_CHECK_SHAPE(fits_along(in[1].shape, in[0].shape, dim), "[slice_update_] src", in[1].shape, " does not fit dst", in[0].shape, " along dim ", dim);
    return std::vector<TensorMeta>{in[0]};
  };
  add_op(std::move(d));
}

// A KV cache step: the new keys and values written into both caches at `start` along dim, and the
// caches' new length, start + n, as a fresh i64 0-d tensor. Effects: writes 0, writes 1, fresh.
//   kv_append_(k_cache, v_cache, k, v, start) -> (k_cache, v_cache, end)    attr dim
void define_kv_append() {
  OpDef d;
  d.name = "kv_append_";
  d.num_inputs = 5;
  d.num_outputs = 3;
  d.effects = {Effect::writes(0), Effect::writes(1), Effect::fresh()};
  d.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    check_start("kv_append_", in[4]);
    const int64_t dim = wrap_dim("kv_append_", a.i("dim"), int64_t(in[0].shape.size()));
    for (size_t c = 0; c < 2; ++c) {
      const bool ok = in[2 + c].dtype == in[c].dtype && fits_along(in[2 + c].shape, in[c].shape, dim);
      SINTER_CHECK_SHAPE(ok, "[kv_append_] ", c ? "v" : "k", in[2 + c].dtype, in[2 + c].shape, " does not fit its cache", in[c].dtype,
                         in[c].shape, " along dim ", dim);
    }
    return std::vector<TensorMeta>{in[0], in[1], in[4]};
  };
  add_op(std::move(d));
}

}  // namespace

void register_position_ops() {
  define_dynamic_slice();
  define_slice_update();
  define_kv_append();
}

}  // namespace detail

Tensor dynamic_slice(const Tensor& x, const Tensor& start, int64_t dim, int64_t length) {
  static const OpDef& op = get_op("dynamic_slice");
  return call1(op, {x, start}, {{"dim", dim}, {"length", length}});
}
void slice_update_(const Tensor& dst, const Tensor& src, const Tensor& start, int64_t dim) {
  static const OpDef& op = get_op("slice_update_");
  call(op, {dst, src, start}, {{"dim", dim}});
}
Tensor kv_append_(const Tensor& k_cache, const Tensor& v_cache, const Tensor& k, const Tensor& v, const Tensor& start, int64_t dim) {
  static const OpDef& op = get_op("kv_append_");
  return call(op, {k_cache, v_cache, k, v, start}, {{"dim", dim}})[2];
}

}  // namespace sinter

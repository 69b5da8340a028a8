// View ops (view, permute, slice, expand: outputs alias their input), copy and cat, and the
// Tensor methods built from them. Kernels of copy and cat: src/cpu/op_shape.cpp.
#include <algorithm>
#include <numeric>
#include <optional>

#include "ops/common.h"

namespace sinter {
namespace detail {

void check_inplace_broadcast(const std::string& op, const Shape& self, const Shape& o) {
  bool ok = o.size() <= self.size();
  for (size_t i = 1; ok && i <= o.size(); ++i) {
    const int64_t a = self[self.size() - i], b = o[o.size() - i];
    ok = (b == a || b == 1);
  }
  SINTER_CHECK_SHAPE(ok, "[", op, "] cannot broadcast ", o, " to the in-place target ", self);
}

Tensor unsqueeze_dims(const Tensor& g, const std::vector<int64_t>& dims, int64_t in_ndim, bool keepdim) {
  if (keepdim) return g;
  Shape shape;
  size_t k = 0;
  for (int64_t i = 0; i < in_ndim; ++i) {
    if (std::binary_search(dims.begin(), dims.end(), i)) shape.push_back(1);
    else shape.push_back(g.shape()[k++]);
  }
  return g.reshape(shape);
}

// Strides that let `shape` view memory laid out as (old_shape, old_strides), if any (PyTorch's rule).
static std::optional<Shape> view_strides(const Shape& old_shape, const Shape& old_strides, const Shape& shape) {
  if (old_shape.numel() == 0 || old_shape.empty()) {
    Shape st(shape.size());
    int64_t s = 1;
    for (size_t i = shape.size(); i-- > 0;) { st[i] = s; s *= std::max<int64_t>(shape[i], 1); }
    return st;
  }
  Shape st(shape.size());
  int64_t view_d = int64_t(shape.size()) - 1;
  int64_t chunk_base_stride = old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = int64_t(old_shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= old_shape[size_t(d)];
    if (d == 0 || (old_shape[size_t(d - 1)] != 1 &&
                   old_strides[size_t(d - 1)] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[size_t(view_d)] == 1)) {
        st[size_t(view_d)] = view_numel * chunk_base_stride;
        view_numel *= shape[size_t(view_d)];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base_stride = old_strides[size_t(d - 1)];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return st;
}

static Shape resolve_shape(const char* op, const Shape& in, Shape shape) {
  int64_t infer_at = -1, known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      SINTER_CHECK_SHAPE(infer_at < 0, "[", op, "] only one dimension can be -1 in ", shape);
      infer_at = int64_t(i);
    } else {
      SINTER_CHECK_SHAPE(shape[i] >= 0, "[", op, "] invalid size ", shape[i], " in ", shape);
      known *= shape[i];
    }
  }
  if (infer_at >= 0) {
    SINTER_CHECK_SHAPE(known != 0 && in.numel() % known == 0, "[", op, "] cannot reshape ", in, " into ", shape);
    shape[size_t(infer_at)] = in.numel() / known;
  }
  SINTER_CHECK_SHAPE(shape.numel() == in.numel(), "[", op, "] cannot reshape ", in, " (", in.numel(), " elements) into ",
                     shape);
  return shape;
}

static Tensor slice_backward(const Tensor& g, const Shape& in_shape, int64_t dim, int64_t start, int64_t step) {
  const int64_t n = g.size(dim), full = in_shape[size_t(dim)];
  if (n == 0) return zeros(in_shape, g.dtype(), g.device());
  Tensor spread = g;
  if (step > 1) {  // interleave zeros: (.., n, ..) -> (.., n, step, ..) -> (.., n*step, ..), trimmed
    std::vector<Tensor> parts{g.unsqueeze(dim + 1)};
    Shape zs = g.shape();
    zs.insert(zs.begin() + dim + 1, step - 1);
    parts.push_back(zeros(zs, g.dtype(), g.device()));
    Shape merged = g.shape();
    merged[size_t(dim)] = n * step;
    spread = cat(parts, dim + 1).reshape(merged).narrow(dim, 0, (n - 1) * step + 1);
  }
  std::vector<Tensor> pieces;
  Shape before = in_shape, after = in_shape;
  before[size_t(dim)] = start;
  after[size_t(dim)] = full - start - spread.size(dim);
  if (start > 0) pieces.push_back(zeros(before, g.dtype(), g.device()));
  pieces.push_back(spread);
  if (after[size_t(dim)] > 0) pieces.push_back(zeros(after, g.dtype(), g.device()));
  return pieces.size() == 1 ? pieces[0] : cat(pieces, dim);
}

namespace {

void define_view() {
  OpDef v;
  v.name = "view";
  v.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    return std::vector<TensorMeta>{{resolve_shape("view", in[0].shape, a.ints("shape")), in[0].dtype, in[0].device}};
  };
  v.view = [](std::span<const Tensor> in, const Attrs& a) {
    const Tensor& x = in[0];
    const Shape shape = resolve_shape("view", x.shape(), a.ints("shape"));
    auto st = view_strides(x.shape(), x.strides(), shape);
    SINTER_CHECK_SHAPE(st.has_value(), "[view] shape ", shape, " is not compatible with the strides ", x.strides(),
                       " of a ", x.shape(), " tensor; use reshape (which copies)");
    return std::vector<Tensor>{raw_view(x, shape, *st, x.offset())};
  };
  v.backward = [](BackwardCtx& c) { return std::vector<Tensor>{c.grads[0].reshape(c.input_meta[0].shape)}; };
  v.save_inputs = 0;
  add_op(std::move(v));
}

void define_permute() {
  OpDef p;
  p.name = "permute";
  p.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    const Shape& dims = a.ints("dims");
    const int64_t n = int64_t(in[0].shape.size());
    SINTER_CHECK_SHAPE(int64_t(dims.size()) == n, "[permute] ", dims.size(), " dims given for a ", n, "-d tensor ",
                       in[0].shape);
    std::vector<bool> used(size_t(n), false);
    Shape out;
    for (int64_t d : dims) {
      const int64_t w = wrap_dim("permute", d, n);
      SINTER_CHECK_INDEX(!used[size_t(w)], "[permute] dimension ", d, " repeated in ", dims);
      used[size_t(w)] = true;
      out.push_back(in[0].shape[size_t(w)]);
    }
    return std::vector<TensorMeta>{{out, in[0].dtype, in[0].device}};
  };
  p.view = [](std::span<const Tensor> in, const Attrs& a) {
    const Tensor& x = in[0];
    Shape shape, strides;
    for (int64_t d : a.ints("dims")) {
      const int64_t w = wrap_dim("permute", d, x.dim());
      shape.push_back(x.size(w));
      strides.push_back(x.stride(w));
    }
    return std::vector<Tensor>{raw_view(x, shape, strides, x.offset())};
  };
  p.backward = [](BackwardCtx& c) {
    const Shape& dims = c.attrs.ints("dims");
    Shape inv(dims.size());
    for (size_t i = 0; i < dims.size(); ++i) inv[size_t(wrap_dim("permute", dims[i], int64_t(dims.size())))] = int64_t(i);
    return std::vector<Tensor>{c.grads[0].permute(inv)};
  };
  p.save_inputs = 0;
  add_op(std::move(p));
}

void define_slice() {
  OpDef s;
  s.name = "slice";  // attrs: dim, start, end, step (normalised by Tensor::slice)
  s.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    SINTER_CHECK_SHAPE(!in[0].shape.empty(), "[slice] cannot slice a 0-d tensor");
    const int64_t dim = wrap_dim("slice", a.i("dim"), int64_t(in[0].shape.size()));
    const int64_t start = a.i("start"), end = a.i("end"), step = a.i("step"), size = in[0].shape[size_t(dim)];
    SINTER_CHECK(step > 0, "[slice] step must be positive, got ", step);
    SINTER_CHECK_INDEX(0 <= start && start <= size && start <= end && end <= size, "[slice] range [", start, ", ", end,
                       ") out of bounds for size ", size, " of a ", in[0].shape, " tensor");
    Shape out = in[0].shape;
    out[size_t(dim)] = (end - start + step - 1) / step;
    return std::vector<TensorMeta>{{out, in[0].dtype, in[0].device}};
  };
  s.view = [](std::span<const Tensor> in, const Attrs& a) {
    const int64_t dim = wrap_dim("slice", a.i("dim"), in[0].dim());
    return std::vector<Tensor>{raw_slice(in[0], dim, a.i("start"), a.i("end"), a.i("step"))};
  };
  s.backward = [](BackwardCtx& c) {
    const Shape& in_shape = c.input_meta[0].shape;
    const int64_t dim = wrap_dim("slice", c.attrs.i("dim"), int64_t(in_shape.size()));
    return std::vector<Tensor>{slice_backward(c.grads[0], in_shape, dim, c.attrs.i("start"), c.attrs.i("step"))};
  };
  s.save_inputs = 0;
  add_op(std::move(s));
}

void define_expand() {
  OpDef e;
  e.name = "expand";
  e.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    Shape target = a.ints("shape");
    const Shape& shape = in[0].shape;
    SINTER_CHECK_SHAPE(target.size() >= shape.size(), "[expand] cannot expand ", shape, " to fewer dims ", target);
    const size_t off = target.size() - shape.size();
    for (size_t i = 0; i < target.size(); ++i) {
      if (i < off) {
        SINTER_CHECK_SHAPE(target[i] >= 0, "[expand] size -1 not allowed for a new leading dim in ", target);
        continue;
      }
      if (target[i] == -1) target[i] = shape[i - off];
      SINTER_CHECK_SHAPE(shape[i - off] == target[i] || shape[i - off] == 1, "[expand] cannot expand ", shape, " to ",
                         a.ints("shape"));
    }
    return std::vector<TensorMeta>{{target, in[0].dtype, in[0].device}};
  };
  e.view = [](std::span<const Tensor> in, const Attrs& a) {
    const Tensor& x = in[0];
    Shape target = a.ints("shape"), strides(target.size(), 0);
    const size_t off = target.size() - size_t(x.dim());
    for (size_t i = off; i < target.size(); ++i) {
      if (target[i] == -1) target[i] = x.shape()[i - off];
      strides[i] = x.shape()[i - off] == 1 && target[i] != 1 ? 0 : x.strides()[i - off];
    }
    return std::vector<Tensor>{raw_view(x, target, strides, x.offset())};
  };
  e.backward = [](BackwardCtx& c) { return std::vector<Tensor>{sum_to(c.grads[0], c.input_meta[0].shape)}; };
  e.save_inputs = 0;
  add_op(std::move(e));
}

void define_copy() {
  OpDef cp;
  cp.name = "copy";
  cp.infer = [](std::span<const TensorMeta> in, const Attrs&) { return std::vector<TensorMeta>{in[0]}; };
  cp.backward = [](BackwardCtx& c) { return std::vector<Tensor>{c.grads[0]}; };
  cp.save_inputs = 0;
  add_op(std::move(cp));
}

void define_cat() {
  OpDef ct;
  ct.name = "cat";
  ct.num_inputs = -1;
  ct.infer = [](std::span<const TensorMeta> in, const Attrs& a) {
    const Shape& s0 = in[0].shape;
    SINTER_CHECK_SHAPE(!s0.empty(), "[cat] cannot concatenate 0-d tensors");
    const int64_t dim = wrap_dim("cat", a.i("dim"), int64_t(s0.size()));
    Shape out = s0;
    DType dt = in[0].dtype;
    out[size_t(dim)] = 0;
    for (size_t k = 0; k < in.size(); ++k) {
      const Shape& s = in[k].shape;
      bool ok = s.size() == s0.size();
      for (size_t i = 0; ok && i < s.size(); ++i) ok = int64_t(i) == dim || s[i] == s0[i];
      SINTER_CHECK_SHAPE(ok, "[cat] input ", k, " has shape ", s, ", input 0 has ", s0, " (they may differ only in dim ",
                         dim, ")");
      out[size_t(dim)] += s[size_t(dim)];
      dt = promote_types(dt, in[k].dtype);
    }
    return std::vector<TensorMeta>{{out, dt, in[0].device}};
  };
  ct.backward = [](BackwardCtx& c) {
    const int64_t dim = wrap_dim("cat", c.attrs.i("dim"), int64_t(c.input_meta[0].shape.size()));
    std::vector<Tensor> g;
    int64_t at = 0;
    for (size_t k = 0; k < c.input_meta.size(); ++k) {
      const int64_t n = c.input_meta[k].shape[size_t(dim)];
      g.push_back(c.needs_grad[k] ? c.grads[0].slice(dim, at, at + n) : Tensor());
      at += n;
    }
    return g;
  };
  ct.save_inputs = 0;
  add_op(std::move(ct));
}

}  // namespace

void register_shape_ops() {
  define_view();
  define_permute();
  define_slice();
  define_expand();
  define_copy();
  define_cat();
}

}  // namespace detail

using detail::wrap_dim;

Tensor Tensor::view(const Shape& shape) const {
  static const OpDef& op = get_op("view");
  return call1(op, {*this}, {{"shape", shape}});
}

Tensor Tensor::reshape(const Shape& shape) const {
  const Shape resolved = detail::resolve_shape("reshape", this->shape(), shape);
  if (detail::view_strides(this->shape(), strides(), resolved)) return view(resolved);
  return contiguous().view(resolved);
}

Tensor Tensor::flatten(int64_t start, int64_t end) const {
  if (dim() == 0) return reshape({1});
  start = wrap_dim("flatten", start, dim());
  end = wrap_dim("flatten", end, dim());
  SINTER_CHECK_INDEX(start <= end, "[flatten] start dim ", start, " after end dim ", end);
  Shape s(shape().begin(), shape().begin() + start);
  int64_t n = 1;
  for (int64_t i = start; i <= end; ++i) n *= size(i);
  s.push_back(n);
  s.insert(s.end(), shape().begin() + end + 1, shape().end());
  return reshape(s);
}

Tensor Tensor::permute(const Shape& dims) const {
  static const OpDef& op = get_op("permute");
  return call1(op, {*this}, {{"dims", dims}});
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  d0 = wrap_dim("transpose", d0, dim());
  d1 = wrap_dim("transpose", d1, dim());
  if (d0 == d1) return *this;
  Shape p(static_cast<size_t>(dim()), 0);
  std::iota(p.begin(), p.end(), 0);
  std::swap(p[size_t(d0)], p[size_t(d1)]);
  return permute(p);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  static const OpDef& op = get_op("slice");
  SINTER_CHECK_SHAPE(dim() > 0, "[slice] cannot slice a 0-d tensor");
  d = wrap_dim("slice", d, dim());
  const int64_t n = size(d);
  SINTER_CHECK(step > 0, "[slice] step must be positive, got ", step);
  // Python semantics: negative indices count from the end; out-of-range bounds clamp.
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  return call1(op, {*this}, {{"dim", d}, {"start", start}, {"end", end}, {"step", step}});
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  d = wrap_dim("narrow", d, dim());
  if (start < 0) start += size(d);
  SINTER_CHECK_INDEX(start >= 0 && length >= 0 && start + length <= size(d), "[narrow] start ", start, " length ", length,
                     " out of range for size ", size(d), " of a ", shape(), " tensor");
  return slice(d, start, start + length);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  d = wrap_dim("select", d, dim());
  const int64_t n = size(d);
  SINTER_CHECK_INDEX(index >= -n && index < n, "[select] index ", index, " out of range for size ", n, " of a ", shape(),
                     " tensor");
  if (index < 0) index += n;
  return slice(d, index, index + 1).squeeze(d);
}

Tensor Tensor::expand(const Shape& shape) const {
  static const OpDef& op = get_op("expand");
  return call1(op, {*this}, {{"shape", shape}});
}

Tensor Tensor::squeeze() const {
  Shape s;
  for (int64_t d : shape()) if (d != 1) s.push_back(d);
  return s.size() == shape().size() ? *this : view(s);
}

Tensor Tensor::squeeze(int64_t d) const {
  if (dim() == 0) return *this;
  d = wrap_dim("squeeze", d, dim());
  if (size(d) != 1) return *this;
  Shape s = shape();
  s.erase(s.begin() + d);
  return view(s);
}

Tensor Tensor::unsqueeze(int64_t d) const {
  d = wrap_dim("unsqueeze", d, dim() + 1);
  Shape s = shape();
  s.insert(s.begin() + d, 1);
  return view(s);
}

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

Tensor Tensor::clone() const {
  static const OpDef& op = get_op("copy");
  return call1(op, {*this});
}

Tensor cat(const std::vector<Tensor>& xs, int64_t dim) {
  static const OpDef& op = get_op("cat");
  SINTER_CHECK(!xs.empty(), "[cat] needs at least one tensor");
  return call1(op, xs, {{"dim", dim}});
}

Tensor stack(const std::vector<Tensor>& xs, int64_t dim) {
  SINTER_CHECK(!xs.empty(), "[stack] needs at least one tensor");
  std::vector<Tensor> u;
  for (size_t i = 0; i < xs.size(); ++i) {
    SINTER_CHECK_SHAPE(xs[i].shape() == xs[0].shape(), "[stack] input ", i, " has shape ", xs[i].shape(), ", input 0 has ",
                       xs[0].shape());
    u.push_back(xs[i].unsqueeze(dim));
  }
  return cat(u, dim);
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  SINTER_CHECK(split_size > 0, "[split] split size must be positive, got ", split_size);
  dim = wrap_dim("split", dim, x.dim());
  std::vector<Tensor> out;
  for (int64_t at = 0; at < x.size(dim); at += split_size) out.push_back(x.slice(dim, at, std::min(at + split_size, x.size(dim))));
  if (out.empty()) out.push_back(x);
  return out;
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  SINTER_CHECK(chunks > 0, "[chunk] number of chunks must be positive, got ", chunks);
  dim = wrap_dim("chunk", dim, x.dim());
  return split(x, std::max<int64_t>(1, (x.size(dim) + chunks - 1) / chunks), dim);
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  const int64_t lead = x.dim() - int64_t(shape.size());
  SINTER_CHECK_SHAPE(lead >= 0, "[sum_to] cannot reduce ", x.shape(), " to ", shape);
  Shape dims;
  for (int64_t i = 0; i < x.dim(); ++i) {
    if (i < lead) { dims.push_back(i); continue; }
    const int64_t want = shape[size_t(i - lead)];
    if (want == 1 && x.size(i) != 1) dims.push_back(i);
    else SINTER_CHECK_SHAPE(want == x.size(i), "[sum_to] cannot reduce ", x.shape(), " to ", shape);
  }
  Tensor r = dims.empty() ? x : sum(x, dims, true);
  return r.reshape(shape);
}

}  // namespace sinter

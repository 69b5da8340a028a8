#pragma once
// Public ops. Each is a thin call into the op table (src/ops/), so it runs eagerly, records
// autograd history, and infers shapes on symbolic tensors alike.
#include <optional>
#include <vector>

#include "sinter/tensor.h"

namespace sinter {

// Elementwise, broadcasting, with type promotion (bool < ints < floats).
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);        // true division: integer inputs give f32
Tensor pow(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, const Tensor& b);         // comparisons give bool
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// A scalar operand takes the tensor's dtype (floating scalars make integer tensors f32).
Tensor add(const Tensor& a, double b);
Tensor sub(const Tensor& a, double b);
Tensor mul(const Tensor& a, double b);
Tensor div(const Tensor& a, double b);
Tensor pow(const Tensor& a, double b);
Tensor rsub(const Tensor& a, double b);  // b - a

Tensor neg(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x, bool tanh_approximation = false);
Tensor silu(const Tensor& x);
Tensor erf(const Tensor& x);
// The activations' derivatives in one pass: g * f'(x) (what their backward uses).
Tensor gelu_backward(const Tensor& g, const Tensor& x);
Tensor gelu_tanh_backward(const Tensor& g, const Tensor& x);
Tensor silu_backward(const Tensor& g, const Tensor& x);
Tensor clamp(const Tensor& x, std::optional<double> lo, std::optional<double> hi);
Tensor cast(const Tensor& x, DType dtype);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(double a, const Tensor& b);

// Reductions over `dims` (empty: all dims), negative dims count from the end.
Tensor sum(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
Tensor prod(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
Tensor var(const Tensor& x, const Shape& dims = {}, int64_t correction = 1, bool keepdim = false);
Tensor stddev(const Tensor& x, const Shape& dims = {}, int64_t correction = 1, bool keepdim = false);  // torch.std
Tensor logsumexp(const Tensor& x, const Shape& dims, bool keepdim = false);
struct ValuesIndices { Tensor values, indices; };
ValuesIndices max(const Tensor& x, int64_t dim, bool keepdim = false);
ValuesIndices min(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor max(const Tensor& x);  // over all elements
Tensor min(const Tensor& x);
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor sum_to(const Tensor& x, const Shape& shape);  // reverses broadcasting
// The sum of the squares of every element of every tensor, in f64 (0-d): squared global norms.
Tensor sum_squares(const std::vector<Tensor>& xs);

Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);
// Softmax over the last dim of x (..., Lq, Lkv) where row i sees only columns j <= i + offset
// (0 elsewhere): causal attention scores without a mask; offset = Lkv - Lq aligns bottom-right.
// window > 0 keeps only the last `window` of those columns (sliding-window attention).
// A row that sees no column (or only -inf scores) is 0, as PyTorch's _safe_softmax in SDPA.
Tensor causal_softmax(const Tensor& x, int64_t offset, int64_t window = 0);

// Linear algebra. matmul follows NumPy: 1-D operands, batched, broadcast batch dims.
Tensor matmul(const Tensor& a, const Tensor& b);
Tensor bmm(const Tensor& a, const Tensor& b);  // (B, n, k) x (B, k, m), no broadcasting
// y(..., N) = x(..., K) w(N, K)^T + b(N)
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b = {});

// Mixed precision, as torch.autocast: inside the guard (thread-local), linear() on f32 tensors
// computes in bf16 (oneDNN's bf16 GEMM, fp32 accumulation) and returns f32; parameters stay f32
// (the master weights) and their gradients arrive in f32 through the casts. On CUDA tensors
// matmul() and scaled_dot_product_attention() do too (tensor cores; a CPU without bf16 hardware
// would only pay for the casts). f32 switches it off.
class AutocastGuard {
 public:
  explicit AutocastGuard(DType compute);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;
 private:
  DType prev_;
};
DType autocast_dtype();

// Neural-network building blocks.
Tensor embedding(const Tensor& weight, const Tensor& indices);
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-6);
// Rotary embedding on x(..., T, D) with cos/sin of shape (T, D/2), rotating halves (LLaMA/NeoX).
Tensor rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin);
Tensor rope_cos_sin(int64_t seq_len, int64_t dim, double theta, bool want_sin);  // (T, D/2)
// logits (N, C), target (N) int64. Mean over non-ignored targets.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index = -100,
                     double label_smoothing = 0.0);
Tensor dropout(const Tensor& x, double p, bool training = true);

// Joining, splitting, indexing.
Tensor cat(const std::vector<Tensor>& xs, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& xs, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
// Slices at a position held in a tensor (an i64 0-d `start`), so a traced step serves every
// position: a copy of x.narrow(dim, start, length), and a write of src at dst.narrow(dim, start, n).
Tensor dynamic_slice(const Tensor& x, const Tensor& start, int64_t dim, int64_t length);
void slice_update_(const Tensor& dst, const Tensor& src, const Tensor& start, int64_t dim);
// A KV cache step: k and v written into their caches at start along dim; returns start + n.
Tensor kv_append_(const Tensor& k_cache, const Tensor& v_cache, const Tensor& k, const Tensor& v, const Tensor& start, int64_t dim);
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
// out = x; out[index[i][j]][j] += src[i][j] (dim 0), and so on.
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);
Tensor triu(const Tensor& x, int64_t diagonal = 0);
Tensor tril(const Tensor& x, int64_t diagonal = 0);
ValuesIndices topk(const Tensor& x, int64_t k, int64_t dim = -1, bool largest = true);
Tensor cumsum(const Tensor& x, int64_t dim);
Tensor one_hot(const Tensor& indices, int64_t num_classes);
// Draws num_samples indices per row of probs (P) or (R, P), from the global generator.
Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement = false);

}  // namespace sinter

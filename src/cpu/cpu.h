#pragma once
// CPU kernels. Ops in src/ops/ validate and allocate; these only compute. Outputs are written in
// place (they may be strided views, which the in-place ops use). The src/cpu/op_*.cpp files
// register them into the op table as the ops' CPU kernels.
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "core/parallel.h"
#include "core/view.h"
#include "sinter/tensor.h"

namespace sinter::cpu {

// Registers every CPU kernel through detail::add_kernel (register.cpp): into the op table, or the
// runtime's registry.
void register_all_kernels();

// Every kernel entry point counts itself (core/parallel.h, count_kernel_entry).
#define SINTER_KERNEL_ENTRY() ::sinter::count_kernel_entry()

// Layout helpers (no autograd, no op table).
// A contiguous copy of t in dtype dt, or t itself if it already is one.
Tensor contiguous_as(const Tensor& t, DType dt);
// A contiguous (outer, inner) copy of x with `dims` moved last (a view when already in place).
Tensor rows_last(const Tensor& x, const std::vector<int64_t>& dims);
// x's sizes as (before, within, after) around its dims [first, last]: a contiguous x seen as a
// (P, R, C) block, R the dims reduced (or indexed) where they lie.
struct Around { int64_t before = 1, within = 1, after = 1; };
Around around(const Tensor& x, int64_t first, int64_t last);
// The value of a one-element tensor, as a double (kernels reading a scalar operand).
double scalar_value(const Tensor& t);
// Throws IndexError naming the op unless every int64 index lies in [0, n) (idx contiguous).
void check_index_range(const std::string& op, const Tensor& idx, int64_t n);

enum class UnaryOp {
#define UNARY(F, name, rule, dx) F,
#define BINARY(F, name, rule, da, db)
#include "ops/elementwise.def"
#undef UNARY
#undef BINARY
};
enum class BinaryOp {
#define UNARY(F, name, rule, dx)
#define BINARY(F, name, rule, da, db) F,
#include "ops/elementwise.def"
#undef UNARY
#undef BINARY
};

// out = f(x); x broadcast to out's shape; x and out share a dtype (half types compute in f32).
void unary(UnaryOp op, const Tensor& x, const Tensor& out);
// out = f(a, b); a and b share a dtype and broadcast to out; out has that dtype, or bool.
void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out);
// out = cond ? a : b; a, b and out share a dtype; cond is bool.
void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out);
void clamp(const Tensor& x, std::optional<double> lo, std::optional<double> hi, const Tensor& out);
// dst = src, converting dtype and broadcasting src to dst's shape.
void copy(const Tensor& src, const Tensor& dst);
void fill(const Tensor& dst, double value);

// Reductions over the trailing `inner` elements of a contiguous (outer, inner) layout.
enum class ReduceOp { Sum, Prod, LogSumExp };
void reduce_rows(ReduceOp op, const Tensor& x2d, const Tensor& out);        // out (outer)
// out(P, C) = the sums over R of a contiguous (P, R, C) x: sums over leading or middle dims (bias
// gradients, a mean over the sequence) without a transposing copy.
void sum_cols(const Tensor& x3d, const Tensor& out);
void var_rows(const Tensor& x2d, int64_t correction, const Tensor& out);    // out (outer)
void arg_reduce_rows(bool is_max, const Tensor& x2d, const Tensor& values, const Tensor& indices);
void softmax_rows(const Tensor& x2d, const Tensor& out, bool log);
void softmax_cols(const Tensor& x3d, const Tensor& out, bool log);  // over R of a contiguous f32 (P, R, C)
// Softmax of each row of the (rows_per_matrix, inner) matrices stacked in x2d, row i over columns
// j <= i + offset only (0 beyond), and with window > 0 only the last `window` of those: causal
// (sliding-window) attention without a mask tensor.
// Rows that see no column (or only -inf) give NaN, or zeros when `safe`.
void causal_softmax_rows(const Tensor& x2d, const Tensor& out, int64_t rows_per_matrix, int64_t offset, int64_t window,
                         bool safe = true);
void softmax_backward_rows(const Tensor& g2d, const Tensor& y2d, const Tensor& dx2d, bool log);
void cumsum_rows(const Tensor& x2d, const Tensor& out);

// What a GEMM applies to its output on the way out: c = act(a b + bias) + residual. oneDNN runs
// it as post-ops while each tile is in registers; the other paths run it as passes over c with the
// eager kernels.
struct GemmEpilogue {
  std::optional<UnaryOp> act;
  Tensor residual;  // c's shape and dtype, contiguous
  bool empty() const { return !act && !residual.defined(); }
};
// c(B, M, N) = a(B, M, K) b(B, K, N) (+ bias(N)); inner two dims of a and b may be transposed views.
void gemm(const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& bias = {}, const GemmEpilogue& epilogue = {});
// Several few-row products of one x in one parallel region (the q, k, v projections of a decode
// step): y[i] = x w[i]^T + bias[i]. False, doing nothing, where the few-rows kernel does not apply.
bool few_rows_multi(const Tensor& x, std::span<const Tensor> w, std::span<const Tensor> bias, std::span<Tensor> y);
// Whether oneDNN runs bf16 matmul natively on this CPU (AVX512-BF16); otherwise bf16 is widened to f32.
bool dnnl_has_bf16();

}  // namespace sinter::cpu

namespace sinter::cpu {

// Row-wise norms over the last dim of a contiguous (rows, D) x; w, b are (D) (b may be undefined).
void layer_norm_rows(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const Tensor& out);
void rms_norm_rows(const Tensor& x, const Tensor& w, double eps, const Tensor& out);
// Their gradients in one pass over (g, x): dx (rows, D), dw and db (D) (db may be undefined);
// layer = false for rms_norm.
void norm_backward_rows(bool layer, const Tensor& g, const Tensor& x, const Tensor& w, double eps, const Tensor& dx,
                        const Tensor& dw, const Tensor& db);
// x (rows, T, D) contiguous; cos/sin (T, D/2); rotates (x[:D/2], x[D/2:]) pairs.
void rotary_rows(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& out);
// out(n, D) = weight[idx[n]]; idx already range-checked.
void embedding_rows(const Tensor& weight, const Tensor& idx, const Tensor& out);
// dw(V, D) = sum over n of g(n, D) into row idx[n].
void embedding_backward_rows(const Tensor& g, const Tensor& idx, const Tensor& dw);
// Mean cross-entropy of logits (rows, C) against int64 targets; returns the loss in out (0-d).
void cross_entropy_rows(const Tensor& logits, const Tensor& target, int64_t ignore_index, double smoothing,
                        const Tensor& out);
// d(g * loss) / d logits.
void cross_entropy_backward_rows(const Tensor& logits, const Tensor& target, int64_t ignore_index, double smoothing,
                                 double g, const Tensor& dx);
// out = x * keep / (1 - p), keep_i = philox_uniform(seed, counter, i) >= p (x contiguous).
void dropout(const Tensor& x, double p, uint64_t seed, uint64_t counter, const Tensor& out);

}  // namespace sinter::cpu

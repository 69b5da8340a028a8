// Specs for the 2:4 sparse ops: sparse24_linear (every kernel path: M <= 4 streaming, 5 <= M <= 22
// in 8-row tiles against 8 interleaved weight rows, M >= 23 K-major over panels of x of up to 64
// rows, side by side rows for narrow panels; with AVX-512 the rows kernel at 2 <= M <= 8 and
// 16-row tiles above; K with a tail byte and partial column blocks; a
// partial last tile, panel, chunk and group of weight rows; every value dtype; the activation
// epilogue),
// sparse24_to_dense and sparse24_gather, against double references that read the layout plainly;
// sparse24_select against a sort of each group by magnitude (ties, zeros, K not a multiple of 8).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "op_specs.h"
#include "cpu/sparse24/kernels.h"  // SINTER_TILES16: which tile layout this build prepacks

namespace sinter::test {
using namespace spec;
namespace {

// Valid meta bytes: each nibble two different column offsets, the smaller in the low bits.
Tensor rand_meta(int64_t N, int64_t K) {
  static const uint8_t nibbles[6] = {0 | 1 << 2, 0 | 2 << 2, 0 | 3 << 2, 1 | 2 << 2, 1 | 3 << 2, 2 | 3 << 2};
  Tensor pick = randint(0, 6, {N, K / 8, 2});
  Tensor m = Tensor::empty({N, K / 8}, DType::u8);
  for (int64_t i = 0; i < N * K / 8; ++i)
    m.data<uint8_t>()[i] = uint8_t(nibbles[pick.data<int64_t>()[2 * i]] | nibbles[pick.data<int64_t>()[2 * i + 1]] << 4);
  return m;
}
Tensor rand_values(int64_t N, int64_t K, DType vt) {
  return vt == DType::i8 ? randint(-127, 128, {N, K / 2}, DType::i8) : rn({N, K / 2}, vt);
}
Tensor rand_scales(int64_t N) { return add(rand({N}), 0.5); }

// Dense (N, K) of the layout, in double: values times scales at meta's columns.
std::vector<double> dense_ref(const R& values, const R& meta, const R& scales) {
  const int64_t N = values.shape[0], K = values.shape[1] * 2;
  std::vector<double> w(size_t(N * K), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t b = 0; b < K / 8; ++b) {
      const int byte = int(meta.v[size_t(n * K / 8 + b)]);
      const int off[4] = {byte & 3, (byte >> 2) & 3, 4 + ((byte >> 4) & 3), 4 + (byte >> 6)};
      for (int t = 0; t < 4; ++t) w[size_t(n * K + 8 * b + off[t])] = values.v[size_t(n * K / 2 + 4 * b + t)] * scales.v[size_t(n)];
    }
  return w;
}

double act_ref(double v, const std::string& a) {
  if (a == "relu") return v > 0 ? v : 0;
  if (a == "silu") return v / (1 + std::exp(-v));
  if (a == "gelu") return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
  return v;
}

// y = act(x w^T + b) in double: x (..., K), w the dense (N, K) weight, bias (N) or null.
R linear_ref(const R& x, const std::vector<double>& w, int64_t N, const R* bias, const std::string& act) {
  const int64_t K = N ? int64_t(w.size()) / N : 0, M = K ? int64_t(x.v.size()) / K : 0;
  Shape os = x.shape;
  os.back() = N;
  R y{os, std::vector<double>(size_t(M * N)), x.dtype};
  for (int64_t i = 0; i < M; ++i)
    for (int64_t n = 0; n < N; ++n) {
      double s = bias ? bias->v[size_t(n)] : 0.0;
      for (int64_t k = 0; k < K; ++k) s += x.v[size_t(i * K + k)] * w[size_t(n * K + k)];
      y.v[size_t(i * N + n)] = act_ref(s, act);
    }
  return y;
}

Case linear_case(Shape xs, int64_t N, DType vt, DType xt, bool bias, const std::string& act = "none") {
  const int64_t K = xs.back();
  // x scaled by 1/sqrt(K/2) so an output is O(1) at every K, as in a model (the f32 rounding of a
  // sum of K/2 unit-variance products grows with K: unscaled, K = 4104 misses 1e-5 by 5-9x).
  // int8 values come with scales near 1/127, as quantisation gives them (dequantised weights ~ 1)
  Tensor x = mul(randn(xs, DType::f64), 1.0 / std::sqrt(std::max<double>(1.0, double(K) / 2))).to(xt);
  Tensor scales = vt == DType::i8 ? mul(rand_scales(N), 1.0 / 127) : rand_scales(N);
  std::vector<Tensor> in{x, rand_values(N, K, vt), rand_meta(N, K), scales};
  if (bias) in.push_back(rn({N}, xt));
  // dense_copy off: these small layers would otherwise run densely; the cases exercise the 2:4 kernels.
  return {in, {{"activation", act}, {"bias", bias}, {"packed", false}, {"dense_copy", false}}};
}

// The same with the weight's prepacked copy as the last input (the kernel reads it where it serves).
Case prepacked_case(Shape xs, int64_t N, DType vt, DType xt, bool bias, const std::string& act = "none") {
  Case c = linear_case(std::move(xs), N, vt, xt, bias, act);
  SemiStructuredSparse s{c.in[1], c.in[2], c.in[3]};
  s.prepack();
  c.in.push_back(s.packed);
  c.attrs.set("packed", true);
  return c;
}

// The weight as its prepacked layout alone (prepack(replace=true)): empty values and meta of the
// values' dtype and u8, the packed bytes last, the shape in attrs rows and cols.
Case packed_only_case(Shape xs, int64_t N, DType vt, DType xt, bool bias, const std::string& act = "none") {
  Case c = prepacked_case(std::move(xs), N, vt, xt, bias, act);
  const int64_t K = c.in[1].size(1) * 2;
  c.in[1] = Tensor::empty({0}, vt), c.in[2] = Tensor::empty({0}, DType::u8);
  c.attrs.set("packed_only", true), c.attrs.set("rows", N), c.attrs.set("cols", K);
  return c;
}

// Kept value j (of 16) of row r in a block of the documented tile layout (cpu/sparse24/kernels.h), from
// its bytes: f32 little-endian, bf16 the high half of an f32, i8 two's complement.
double packed_value(const R& bytes, int64_t at, DType vt) {
  auto byte = [&](int64_t i) { return uint32_t(bytes.v[size_t(at + i)]); };
  if (vt == DType::i8) return double(int8_t(uint8_t(byte(0))));
  uint32_t bits = vt == DType::bf16 ? (byte(0) | byte(1) << 8) << 16 : byte(0) | byte(1) << 8 | byte(2) << 16 | byte(3) << 24;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

#if defined(SINTER_TILES16)
// Dense (N, K) of a prepacked weight in the AVX-512 layout, read plainly: blocks of 16 rows x 16
// columns, 16 u32 index words (kept value j's block column in bits 4j..4j+3) and 8 x 16 values
// (value j of row r at 16 j + r; bf16 as pairs, at 32 (j / 2) + 2 r + j % 2); chunks of 8 groups of
// 16 rows, then spans of 64 blocks, group, block.
std::vector<double> dense_of_prepacked(const R& packed, const R& scales, int64_t K, DType vt) {
  const int64_t N = scales.shape[0], NB = (K + 15) / 16, es = vt == DType::f32 ? 4 : vt == DType::bf16 ? 2 : 1, blk = 64 + 128 * es;
  std::vector<double> w(size_t(N * K), 0.0);
  int64_t at = 64;  // past the header
  for (int64_t c0 = 0; c0 < N; c0 += 128)
    for (int64_t s0 = 0; s0 < NB; s0 += 64)
      for (int64_t n0 = c0; n0 < std::min(N, c0 + 128); n0 += 16)
        for (int64_t b = s0; b < std::min(NB, s0 + 64); ++b, at += blk)
          for (int64_t r = 0; r < 16 && n0 + r < N; ++r) {
            const int64_t n = n0 + r;
            uint32_t word = 0;
            for (int i = 0; i < 4; ++i) word |= uint32_t(uint8_t(packed.v[size_t(at + 4 * r + i)])) << (8 * i);
            for (int j = 0; j < 8 && 16 * b + 4 * (j / 2) < K; ++j) {
              const int64_t col = 16 * b + ((word >> (4 * j)) & 15);
              const int64_t slot = vt == DType::bf16 ? 32 * (j / 2) + 2 * r + j % 2 : 16 * j + r;
              w[size_t(n * K + col)] += packed_value(packed, at + 64 + slot * es, vt) * scales.v[size_t(n)];
            }
          }
  return w;
}
#else
// Dense (N, K) of a prepacked weight, read plainly from the layout: chunks of 64 rows (groups of 8),
// column blocks of 256, then group, then blocks of 32 columns (8 meta words, 16 x 8 values).
std::vector<double> dense_of_prepacked(const R& packed, const R& scales, int64_t K, DType vt) {
  const int64_t N = scales.shape[0], Q = (K + 31) / 32, es = vt == DType::f32 ? 4 : vt == DType::bf16 ? 2 : 1, blk = 32 + 128 * es;
  std::vector<double> w(size_t(N * K), 0.0);
  int64_t at = 64;  // past the header
  for (int64_t n0 = 0; n0 < N; n0 += 64) {
    const int64_t groups = std::min<int64_t>(8, (N - n0 + 7) / 8);
    for (int64_t q0 = 0; q0 < Q; q0 += 8)
      for (int64_t b = 0; b < groups; ++b)
        for (int64_t q = q0; q < std::min(Q, q0 + 8); ++q, at += blk)
          for (int64_t r = 0; r < 8 && n0 + 8 * b + r < N; ++r) {
            const int64_t n = n0 + 8 * b + r;
            for (int64_t g = 0; g < 8 && 32 * q + 4 * g < K; ++g) {
              const int nib = (int(packed.v[size_t(at + 4 * r + g / 2)]) >> (4 * (g % 2))) & 15;
              const int64_t col = 32 * q + 4 * g;
              w[size_t(n * K + col + (nib & 3))] = packed_value(packed, at + 32 + (8 * (2 * g) + r) * es, vt) * scales.v[size_t(n)];
              w[size_t(n * K + col + (nib >> 2))] = packed_value(packed, at + 32 + (8 * (2 * g + 1) + r) * es, vt) * scales.v[size_t(n)];
            }
          }
  }
  return w;
}

#endif

}  // namespace

void add_sparse_specs(std::map<std::string, Spec>& m) {
  Spec li;
  li.cases = [] {
    return std::vector<Case>{
        linear_case({1, 64}, 7, DType::f32, DType::f32, true),            // decode row
        linear_case({3, 24}, 70, DType::f32, DType::f32, false),          // a chunk and a tail byte; 64-row groups
        linear_case({2, 2, 40}, 9, DType::bf16, DType::f32, true),        // (B, T, K) input
        linear_case({4, 8}, 5, DType::i8, DType::f32, true, "relu"),      // int8 values, tail only
        linear_case({5, 64}, 70, DType::f32, DType::f32, true, "silu"),   // tiles from M = 5; a partial row group
        linear_case({30, 264}, 13, DType::i8, DType::f32, false, "gelu"), // K-major: one 32-row panel, a last block of one byte
        linear_case({24, 520}, 70, DType::f32, DType::f32, true),         // K-major: a 24-row panel, two rows side by side, 9 blocks
        linear_case({76, 1032}, 70, DType::f32, DType::f32, true),        // 64 + 16-row panels: 4 rows side by side, rows left over alone
        linear_case({23, 1368}, 13, DType::f32, DType::f32, false, "gelu"), // 24-row panel (a row of padding): a last block of 3 bytes, a row alone
        linear_case({73, 40}, 5, DType::f32, DType::f32, true, "relu"),   // a 16-row panel with 7 rows of padding; one partial block
        linear_case({12, 2056}, 70, DType::f32, DType::f32, true),        // tiles of 8 and 4 rows
        linear_case({9, 40}, 5, DType::f32, DType::f32, true, "relu"),    // tiles of 8 and 1 rows; a partial column block
        linear_case({8, 40}, 5, DType::bf16, DType::f32, true),           // M = 8: one tile
        linear_case({17, 1368}, 13, DType::i8, DType::f32, false),        // int8 values at M = 17: three tiles
        linear_case({22, 264}, 13, DType::bf16, DType::f32, true),        // bf16 values at M = 22, the last M in tiles
        linear_case({36, 520}, 70, DType::f32, DType::f32, true),         // K-major: 9 blocks (the last one byte), a partial chunk
        linear_case({140, 520}, 20, DType::f32, DType::f32, false),       // two full 64-row panels and one of 16
        linear_case({64, 136}, 203, DType::i8, DType::f32, true, "silu"), // one full panel; chunks of 8+ rows, the last partial
        linear_case({300, 72}, 20, DType::bf16, DType::f32, true, "relu"), // four full panels and one of 48; a 64 + 8 column K
        linear_case({26, 48}, 6, DType::bf16, DType::bf16, true),         // bf16 activations
        linear_case({1, 32}, 3, DType::i8, DType::bf16, false),
        linear_case({0, 16}, 4, DType::f32, DType::f32, true),            // no rows
        linear_case({3, 16}, 4, DType::f64, DType::f64, true),            // the f64 reference path
        linear_case({1, 4104}, 70, DType::f32, DType::f32, true),         // a model's K (and a tail byte) on each path
        linear_case({6, 4104}, 70, DType::i8, DType::f32, false),
        linear_case({33, 4104}, 70, DType::f32, DType::f32, true, "relu"),  // AVX-512: tiles over two spans of columns
        linear_case({95, 136}, 37, DType::bf16, DType::f32, true),        // AVX-512: the last M in tiles, 12 tiles
        linear_case({100, 200}, 37, DType::i8, DType::f32, false, "relu"),  // AVX-512: K-major, one panel of 7 registers
        // AVX-512 rows kernel (2 <= M <= 8, int8 from M = 1): groups of four rows of x, a partial
        // last quad of weight rows, column chunks of 1024, 32-column steps and a tail of 1-3 bytes
        linear_case({7, 2088}, 70, DType::bf16, DType::f32, true, "relu"),  // three chunks, the last partial; a 24-column tail
        linear_case({2, 48}, 6, DType::f32, DType::f32, false),             // one step and a 16-column tail; quads of 4 and 2 rows
        linear_case({1, 1032}, 9, DType::i8, DType::f32, true, "silu"),     // int8 at M = 1: one pass over K
        // Prepacked weights, where the kernel reads them (2 <= M <= 40, or 128 with AVX-512; M = 1 for int8)
        prepacked_case({2, 64}, 7, DType::f32, DType::f32, true),             // a partial group of rows
        prepacked_case({5, 24}, 70, DType::f32, DType::f32, false, "silu"),   // a block of 3 meta bytes; two chunks
        prepacked_case({2, 3, 40}, 9, DType::bf16, DType::f32, true),         // (B, T, K) input; bf16 values
        prepacked_case({9, 296}, 13, DType::i8, DType::f32, true, "relu"),    // two column blocks, the last of 2 blocks (1 partial)
        prepacked_case({16, 520}, 136, DType::f32, DType::f32, true),         // three chunks, the last a group of 8
        prepacked_case({32, 264}, 64, DType::bf16, DType::f32, false, "gelu"),  // four full tiles, a whole chunk
        prepacked_case({17, 1032}, 70, DType::i8, DType::f32, true),          // three tiles; five column blocks
        prepacked_case({3, 48}, 6, DType::f32, DType::bf16, true),            // bf16 activations
        prepacked_case({1, 32}, 3, DType::i8, DType::f32, false),             // int8 at M = 1
        prepacked_case({40, 72}, 20, DType::f32, DType::f32, true),
        prepacked_case({0, 16}, 4, DType::f32, DType::f32, true),             // no rows
        prepacked_case({4, 4104}, 70, DType::f32, DType::f32, true),          // a model's K
        prepacked_case({20, 1064}, 150, DType::bf16, DType::bf16, true),      // AVX-512: two chunks and two spans of blocks, bf16 pairs
        // The layout as the only copy: its kernels at every M (1, past 40 and 128 too)
        packed_only_case({1, 296}, 70, DType::f32, DType::f32, true, "gelu"),
        packed_only_case({4, 72}, 20, DType::bf16, DType::f32, false),
        packed_only_case({3, 48}, 6, DType::bf16, DType::bf16, true),
        packed_only_case({45, 136}, 37, DType::i8, DType::f32, true, "relu"),
        packed_only_case({140, 40}, 9, DType::f32, DType::f32, false, "silu"),
        // AVX2: K-major over the 8-row layout in place (f32 values, 24 <= M <= 128)
        prepacked_case({24, 1064}, 150, DType::f32, DType::f32, true, "relu"),  // three chunks, the last 22 rows; a column block of 2 blocks
        packed_only_case({100, 296}, 70, DType::f32, DType::f32, true),        // a panel of 64 rows and one of 36; a partial block
        packed_only_case({65, 264}, 13, DType::f32, DType::bf16, false, "gelu")};  // a last panel of one row; bf16 activations
  };
  // With a prepacked copy the reference reads the weight from that copy's layout, plainly: a
  // layout that disagrees with values + meta fails whichever of the two the kernel read.
  li.ref = [](const std::vector<R>& in, const Attrs& a) {
    const bool packed_only = a.b_or("packed_only", false);
    const int64_t N = packed_only ? a.i("rows") : in[1].shape[0], K = packed_only ? a.i("cols") : in[1].shape[1] * 2;
    const bool bias = a.b("bias");
    const std::vector<double> w =
        a.b("packed") ? dense_of_prepacked(in[4 + bias], in[3], K, in[1].dtype) : dense_ref(in[1], in[2], in[3]);
    return std::vector<R>{linear_ref(in[0], w, N, bias ? &in[4] : nullptr, a.str("activation"))};
  };
  li.bad = [] {
    Case wrong_k = linear_case({2, 16}, 3, DType::f32, DType::f32, false);
    wrong_k.in[0] = rn({2, 24});
    Case wrong_meta = linear_case({2, 16}, 3, DType::f32, DType::f32, false);
    wrong_meta.in[2] = wrong_meta.in[2].to(DType::i32);
    Case wrong_bias = linear_case({2, 16}, 3, DType::f32, DType::f32, true);
    wrong_bias.in[4] = rn({4});
    Case wrong_act = linear_case({2, 16}, 3, DType::f32, DType::f32, false, "tanh");
    Case mixed = linear_case({2, 16}, 3, DType::f32, DType::f64, false);
    Case odd_k{{rn({2, 12}), rn({3, 6}), Tensor::empty({3, 1}, DType::u8), rand_scales(3)},
               {{"activation", std::string("none")}, {"bias", false}, {"packed", false}}};
    Case missing_bias = linear_case({2, 16}, 3, DType::f32, DType::f32, false);
    missing_bias.attrs.set("bias", true);
    Case short_packed = prepacked_case({2, 64}, 9, DType::f32, DType::f32, false);
    short_packed.in[4] = short_packed.in[4].narrow(0, 0, 100).contiguous();
    Case no_attrs = linear_case({2, 16}, 3, DType::f32, DType::f32, false);
    no_attrs.attrs = {};
    Case packed_wrong_rows = packed_only_case({2, 64}, 9, DType::f32, DType::f32, false);
    packed_wrong_rows.attrs.set("rows", int64_t(10));
    Case packed_only_no_packed = packed_only_case({2, 64}, 9, DType::f32, DType::f32, false);
    packed_only_no_packed.in.pop_back(), packed_only_no_packed.attrs.set("packed", false);
    return std::vector<Case>{wrong_k, wrong_meta, wrong_bias, wrong_act, mixed, odd_k, missing_bias, short_packed, no_attrs,
                             packed_wrong_rows, packed_only_no_packed};
  };
  li.grad_cases = [] {  // f64 x, values and bias; meta and the f32 scales are constants
    return std::vector<Case>{linear_case({2, 16}, 3, DType::f64, DType::f64, true), linear_case({1, 2, 8}, 2, DType::f64, DType::f64, false)};
  };
  m["sparse24_linear"] = li;

  Spec td;
  td.cases = [] {
    std::vector<Case> c;
    for (DType vt : {DType::f32, DType::bf16, DType::i8, DType::f64})
      c.push_back({{rand_values(5, 24, vt), rand_meta(5, 24), rand_scales(5)}, {}});
    return c;
  };
  td.ref = [](const std::vector<R>& in, const Attrs&) {
    const int64_t N = in[0].shape[0], K = in[0].shape[1] * 2;
    const DType dt = in[0].dtype == DType::i8 ? DType::f32 : in[0].dtype;
    return std::vector<R>{R{{N, K}, dense_ref(in[0], in[1], in[2]), dt}};
  };
  td.bad = [] {
    return std::vector<Case>{{{rn({5, 12}), rand_meta(5, 16), rand_scales(5)}, {}},
                             {{rn({5, 8}), rand_meta(5, 16), rand_scales(4)}, {}},
                             {{ints({5, 8}, 0, 3), rand_meta(5, 16), rand_scales(5)}, {}}};
  };
  td.grad_cases = [] { return std::vector<Case>{{{rn({3, 8}, DType::f64), rand_meta(3, 16), rand_scales(3)}, {}}}; };
  m["sparse24_to_dense"] = td;

  Spec ga;
  ga.cases = [] {
    return std::vector<Case>{{{rn({6, 32}), rand_meta(6, 32)}, {}}, {{rn({2, 8}, DType::f64), rand_meta(2, 8)}, {}}};
  };
  ga.ref = [](const std::vector<R>& in, const Attrs&) {
    const int64_t N = in[0].shape[0], K = in[0].shape[1];
    R out{{N, K / 2}, std::vector<double>(size_t(N * K / 2)), in[0].dtype};
    for (int64_t n = 0; n < N; ++n)
      for (int64_t b = 0; b < K / 8; ++b) {
        const int byte = int(in[1].v[size_t(n * K / 8 + b)]);
        const int off[4] = {byte & 3, (byte >> 2) & 3, 4 + ((byte >> 4) & 3), 4 + (byte >> 6)};
        for (int t = 0; t < 4; ++t) out.v[size_t(n * K / 2 + 4 * b + t)] = in[0].v[size_t(n * K + 8 * b + off[t])];
      }
    return std::vector<R>{out};
  };
  ga.bad = [] {
    return std::vector<Case>{{{rn({6, 32}), rand_meta(6, 16)}, {}}, {{rn({6, 32}, DType::bf16), rand_meta(6, 32)}, {}}};
  };
  ga.grad_cases = [] { return std::vector<Case>{{{rn({2, 16}, DType::f64), rand_meta(2, 16)}, {}}}; };
  m["sparse24_gather"] = ga;

  Spec se;
  se.cases = [] {
    // Ties, zero groups, one and two nonzeros, negative magnitudes: every case of the rule.
    const Tensor groups = tensor<float>({0, 0, 0, 0, 1, -1, 1, -1, 0, 5, 0, 0, 0, 0, -3, 0, 2, 0, 0, -2, -1, 4, -4, 1}, {2, 12});
    return std::vector<Case>{{{rn({6, 32})}, {}}, {{rn({3, 12}, DType::f64)}, {}}, {{groups}, {}}, {{rn({0, 8})}, {}}};
  };
  se.ref = [](const std::vector<R>& in, const Attrs&) {  // the two largest |w| of each four, the earlier on ties
    const int64_t N = in[0].shape[0], K = in[0].shape[1];
    R keep{{N, K}, std::vector<double>(size_t(N * K), 0.0), DType::boolean};
    R meta{{N, (K + 7) / 8}, std::vector<double>(size_t(N * ((K + 7) / 8)), 0.0), DType::u8};
    for (int64_t n = 0; n < N; ++n)
      for (int64_t g = 0; g < K / 4; ++g) {
        int order[4] = {0, 1, 2, 3};
        const double* q = in[0].v.data() + n * K + 4 * g;
        std::stable_sort(order, order + 4, [&](int a, int b) { return std::fabs(q[a]) > std::fabs(q[b]); });
        const int lo = std::min(order[0], order[1]), hi = std::max(order[0], order[1]);
        keep.v[size_t(n * K + 4 * g + lo)] = keep.v[size_t(n * K + 4 * g + hi)] = 1;
        meta.v[size_t(n * ((K + 7) / 8) + g / 2)] += double((lo | hi << 2) << (4 * (g % 2)));
      }
    return std::vector<R>{keep, meta};
  };
  se.bad = [] {
    return std::vector<Case>{{{rn({2, 6})}, {}}, {{rn({2, 8}, DType::bf16)}, {}}, {{rn({8})}, {}}};
  };
  m["sparse24_select"] = se;
}

}  // namespace sinter::test

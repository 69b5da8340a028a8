// 2:4 sparse weights through the public API: packing and its errors, pruning, linear against the
// dense linear of the same pruned weights (every value dtype, odd M on both kernel paths, bias or
// not, fused activations), and gradients against the dense computation.
#include <cstring>

#include "sinter/data.h"
#include "sinter/train.h"
#include "cpu/cpu.h"  // dnnl_has_bf16: which dense copy a bf16 layer gets
#include "cpu/sparse24/kernels.h"  // SINTER_TILES16: which tile layout prepack() builds
#include "test_util.h"

namespace sinter {
namespace {

Tensor pruned(int64_t N, int64_t K) { return prune_2_4(randn({N, K})); }

TEST(Sparse24, PackAndUnpack) {
  manual_seed(1);
  Tensor w = pruned(6, 40);
  SemiStructuredSparse s = to_sparse_semi_structured(w);
  EXPECT_EQ(s.values.shape(), (Shape{6, 20}));
  EXPECT_EQ(s.meta.shape(), (Shape{6, 5}));
  EXPECT_TRUE(test::all_close(s.to_dense(), w, 0, 0));  // f32: exact
  EXPECT_EQ(s.nbytes(), 6 * 20 * 4 + 6 * 5 + 6 * 4);
  // bf16 values round; int8 values are within half a quantisation step of each row's scale
  EXPECT_TRUE(test::all_close(to_sparse_semi_structured(w, DType::bf16).to_dense(), w, 1e-2, 1e-2));
  SemiStructuredSparse q = to_sparse_semi_structured(w, DType::i8);
  Tensor err = max(abs(q.to_dense() - w), 1).values;
  for (int64_t n = 0; n < 6; ++n) EXPECT_LE(err.data<float>()[n], 0.5001 * q.scales.data<float>()[n]);
  // a row with a zero group and a group with one nonzero still packs (zeros kept)
  Tensor z = zeros({1, 8});
  z.data<float>()[6] = 3.0f;
  EXPECT_TRUE(test::all_close(to_sparse_semi_structured(z).to_dense(), z, 0, 0));
}

TEST(Sparse24, RejectsWhatIsNotTwoFour) {
  Tensor w = zeros({3, 16});
  w.data<float>()[2 * 16 + 9] = w.data<float>()[2 * 16 + 10] = w.data<float>()[2 * 16 + 11] = 1.0f;
  try {
    to_sparse_semi_structured(w);
    FAIL() << "accepted three nonzeros in a group";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("row 2, columns 8..11 hold 3 nonzeros"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(test::throws_naming("to_sparse_semi_structured", [] { to_sparse_semi_structured(zeros({3, 12})); }));
  EXPECT_TRUE(test::throws_naming("prune_2_4", [] { prune_2_4(zeros({3, 6})); }));
}

TEST(Sparse24, LinearNamesTheOpForEveryMalformedCall) {
  manual_seed(2);
  const SemiStructuredSparse s = to_sparse_semi_structured(pruned(16, 64));
  const auto with = [&](Tensor v, Tensor m, Tensor sc) { return SemiStructuredSparse{std::move(v), std::move(m), std::move(sc)}; };
  const char* op = "sparse24_linear";
  EXPECT_TRUE(test::throws_naming(op, [&] { linear(randn({3, 60}), s); }));                        // x's K
  EXPECT_TRUE(test::throws_naming(op, [&] { linear(randn({3, 64}), s, randn({15})); }));           // bias
  EXPECT_TRUE(test::throws_naming(op, [&] { linear(randn({3, 64}), s, {}, "tanhh"); }));            // activation
  EXPECT_TRUE(test::throws_naming(op, [&] { linear(randint(0, 3, {3, 64}), s); }));                 // x's dtype
  EXPECT_TRUE(test::throws_naming(op, [&] { linear(randn({3, 64}), with(s.values, s.meta.slice(1, 0, 4).contiguous(), s.scales)); }));
  EXPECT_TRUE(test::throws_naming(op, [&] { linear(randn({3, 64}), with(s.values, s.meta, s.scales.slice(0, 0, 8).contiguous())); }));
  EXPECT_TRUE(test::throws_naming(op, [&] { linear(randn({3, 64}), with(s.values.reshape({-1}), s.meta, s.scales)); }));
  EXPECT_TRUE(test::throws_naming(op, [&] { linear(randn({3, 64}), with(s.values.to(DType::i32), s.meta, s.scales)); }));
  EXPECT_TRUE(test::throws_naming(op, [&] { linear(randn({3, 64}), with(s.values, s.meta.to(DType::i32), s.scales)); }));
  EXPECT_TRUE(test::throws_naming(op, [&] { linear(randn({3, 64}), SemiStructuredSparse{}); }));
  EXPECT_TRUE(test::throws_naming(op, [&] { linear(randn({3, 64}), with(s.values, Tensor{}, s.scales)); }));
  SemiStructuredSparse p = s;  // a prepacked weight whose meta was replaced by a malformed one
  p.prepack();
  p.meta = s.meta.slice(1, 0, 4).contiguous();
  EXPECT_TRUE(test::throws_naming(op, [&] { linear(randn({3, 64}), p); }));
}

TEST(Sparse24, PruneKeepsTheTwoLargestOfEachFour) {
  Tensor w = tensor<float>({0.1f, -3.0f, 2.0f, 0.5f, 1.0f, 1.0f, 1.0f, -1.0f}).reshape({1, 8});
  EXPECT_TRUE(test::all_close(prune_2_4(w), std::vector<double>{0, -3, 2, 0, 1, 1, 0, 0}, 0, 0));
  manual_seed(2);
  Tensor r = randn({16, 64});
  Tensor p = prune_2_4(r);
  EXPECT_EQ(sum(ne(p, zeros({}))).item_double(), 16 * 64 / 2);
  EXPECT_TRUE(test::all_close(prune_2_4(p), p, 0, 0));  // idempotent
}

TEST(Sparse24, LinearEqualsDenseLinearOfThePrunedWeight) {
  manual_seed(3);
  for (int64_t K : {int64_t(8), int64_t(40), int64_t(264)})
    for (DType vt : {DType::f32, DType::bf16, DType::i8})
      for (int64_t M : {1, 2, 3, 4, 5, 8, 17, 22, 23, 33, 64, 130, 200}) {
        SCOPED_TRACE("K=" + std::to_string(K) + " " + dtype_name(vt) + " M=" + std::to_string(M));
        const int64_t N = 67;
        SemiStructuredSparse s = to_sparse_semi_structured(pruned(N, K), vt);
        // the dense linear of the same (dequantised) weight, in f64: both sides round only their f32 sums
        Tensor wd = s.to_dense().to(DType::f64), x = randn({M, K}), b = randn({N});
        EXPECT_TRUE(test::all_close(linear(x, s, b), linear(x.to(DType::f64), wd, b.to(DType::f64)).to(DType::f32), 1e-5, 3e-5));
        EXPECT_TRUE(test::all_close(linear(x, s), linear(x.to(DType::f64), wd).to(DType::f32), 1e-5, 3e-5));
      }
}

TEST(Sparse24, Bf16InputsWithBf16ValuesEqualTheDenseProduct) {
  // bf16 x and bf16 values (a model moved to bf16): with AVX512-BF16, M >= 16 runs the vdpbf16ps
  // pairs kernel (a prepacked weight at M = 16 and from M = 26; at M <= 16 with K a multiple of 64
  // the rows are read in place); elsewhere the f32 kernels. Either way the product is the f64 one
  // of the same bf16 numbers, rounded once to the bf16 output.
  manual_seed(21);
  auto check = [](const Tensor& y, const Tensor& ref) {  // one bf16 rounding of the output apart
    EXPECT_EQ(y.dtype(), DType::bf16);
    EXPECT_TRUE(test::all_close(y.to(DType::f64), ref, 4e-3, 1e-3));  // rounding to bf16 moves a value by at most 2^-8 of it
  };
  for (int64_t K : {int64_t(8), int64_t(40), int64_t(128), int64_t(264)})  // 128: whole 64-column blocks
    for (int64_t N : {int64_t(67), int64_t(136)})
      for (bool packed : {false, true}) {
        SemiStructuredSparse s = to_sparse_semi_structured(pruned(N, K), DType::bf16);
        if (packed) s.prepack();
        const SemiStructuredSparse s64{s.values.to(DType::f64), s.meta, s.scales};
        for (int64_t M : {1, 15, 16, 17, 31, 32, 33, 64, 65, 130}) {
          SCOPED_TRACE("K=" + std::to_string(K) + " N=" + std::to_string(N) + " M=" + std::to_string(M) + (packed ? " prepacked" : ""));
          Tensor x = randn({M, K}).to(DType::bf16), b = randn({N}).to(DType::bf16);
          check(linear(x, s, b, "relu"), relu(linear(x.to(DType::f64), s64, b.to(DType::f64))));
          check(linear(x, s), linear(x.to(DType::f64), s64));
        }
      }
  // Meta a reader may hand us (our writer keeps two distinct columns in order): swapped columns
  // and a column named twice, whose two values add up, as in every other kernel.
  SemiStructuredSparse s = to_sparse_semi_structured(pruned(40, 64), DType::bf16);
  uint8_t* mt = s.meta.data<uint8_t>();
  mt[0] = uint8_t((mt[0] & 0xF0) | ((mt[0] & 3) << 2) | ((mt[0] >> 2) & 3));  // row 0, group 0: the two columns swapped
  std::swap(s.values.data<bf16>()[0].bits, s.values.data<bf16>()[1].bits);
  mt[8 + 1] = uint8_t((mt[9] & 0x0F) | 0x50);  // row 1, group 3: column 1 twice
  mt[16 + 7] = 0xFF;                          // row 2, groups 14 and 15: column 3 twice each
  const SemiStructuredSparse s64{s.values.to(DType::f64), s.meta, s.scales};
  for (bool packed : {false, true}) {
    if (packed) s.prepack();
    for (int64_t M : {8, 16, 70}) {
      Tensor x = randn({M, 64}).to(DType::bf16);
      check(linear(x, s), linear(x.to(DType::f64), s64));
    }
  }
  // to_dense() agrees: the twice-named column holds the sum of its two values
  Tensor x = randn({5, 64}, DType::f64);
  EXPECT_TRUE(test::all_close(linear(x, s64.to_dense()), linear(x, s64), 1e-12, 1e-12));
}

TEST(Sparse24, PrepackedWeightsGiveTheSameProduct) {
  // prepack() adds the tile layout that linear() reads at 2 <= M <= 40 without gradients; every M
  // must still equal the dense linear of the same weight, and an in-place change of the values
  // (as fine-tuning makes) must not leave linear() reading the stale copy.
  manual_seed(13);
  for (int64_t K : {int64_t(40), int64_t(296)})
    for (DType vt : {DType::f32, DType::bf16, DType::i8})
      for (int64_t N : {int64_t(67), int64_t(136)}) {
        SemiStructuredSparse s = to_sparse_semi_structured(pruned(N, K), vt);
        s.prepack();
        ASSERT_TRUE(s.packed_current());
        // A 64-byte header (the format), then the blocks.
#if defined(SINTER_TILES16)  // blocks of 16 rows x 16 columns: 16 index words, 8 x 16 values
        EXPECT_EQ(s.packed.numel(), 64 + (N + 15) / 16 * ((K + 15) / 16) * (64 + 128 * s.values.element_size()));
#else  // blocks of 8 rows x 32 columns: 8 meta words, 16 x 8 values
        EXPECT_EQ(s.packed.numel(), 64 + (N + 7) / 8 * ((K + 31) / 32) * (32 + 128 * s.values.element_size()));
#endif
        const Tensor wd = s.to_dense().to(DType::f64), b = randn({N});
        for (int64_t M : {1, 2, 3, 8, 9, 17, 32, 40, 41}) {
          SCOPED_TRACE("K=" + std::to_string(K) + " N=" + std::to_string(N) + " " + dtype_name(vt) + " M=" + std::to_string(M));
          Tensor x = randn({M, K});
          EXPECT_TRUE(test::all_close(linear(x, s, b, "relu"), relu(linear(x.to(DType::f64), wd, b.to(DType::f64))).to(DType::f32), 1e-5, 3e-5));
        }
      }
  SemiStructuredSparse s = to_sparse_semi_structured(pruned(24, 64));
  s.prepack();
  Tensor x = randn({8, 64});
  {
    NoGradGuard ng;
    s.values.mul_(-2.0);
  }
  EXPECT_FALSE(s.packed_current());
  EXPECT_TRUE(test::all_close(linear(x, s), linear(x, s.to_dense()), 1e-5, 1e-5));
  s.prepack();
  EXPECT_TRUE(s.packed_current());
  EXPECT_TRUE(test::all_close(linear(x, s), linear(x, s.to_dense()), 1e-5, 1e-5));
  s.values = s.values.clone();  // new tensors in the slots: the copy is not theirs
  EXPECT_FALSE(s.packed_current());
  s.prepack();
  // with a gradient wanted, the differentiable op runs (the prepacked one has no backward)
  Tensor xg = x.detach().requires_grad_();
  Tensor gx = autograd::grad({sum(linear(xg, s))}, {xg})[0];
  EXPECT_TRUE(test::all_close(gx, sum(s.to_dense(), {0}).reshape({1, 64}).expand({8, 64}), 1e-5, 1e-5));
  SemiStructuredSparse d = to_sparse_semi_structured(pruned(4, 16), DType::f64);
  EXPECT_TRUE(test::throws_naming("prepack", [&] { d.prepack(); }));
  SemiStructuredSparse empty;
  EXPECT_TRUE(test::throws_naming("prepack", [&] { empty.prepack(); }));
}

TEST(Sparse24, BytesPrepackedForAnotherIsaAreAnErrorNamingBothFormats) {
  // The prepacked bytes carry their format in a header: bytes packed by a build with the other tile
  // layout (an AVX-512 machine's, read on AVX2, or the reverse) are refused by linear() and
  // unpack() naming both, not multiplied as if they were this build's.
#if defined(SINTER_TILES16)
  const uint32_t other = 1;  // the 8-row tiles
  const char *mine = "16-row tiles (AVX-512)", *theirs = "8-row tiles (AVX2)";
#else
  const uint32_t other = 2;  // the 16-row tiles
  const char *mine = "8-row tiles (AVX2)", *theirs = "16-row tiles (AVX-512)";
#endif
  manual_seed(5);
  SemiStructuredSparse s = to_sparse_semi_structured(pruned(64, 256));
  s.prepack(/*replace=*/true);
  NoGradGuard ng;
  const Tensor x = randn({8, 256}), y = linear(x, s);  // this build's bytes serve
  std::memcpy(s.packed.data<uint8_t>() + 8, &other, 4);  // the header's format, as the other build writes it
  for (const char* what : {"linear", "unpack"}) {
    SCOPED_TRACE(what);
    try {
      if (std::string(what) == "linear") (void)linear(x, s);
      else s.unpack();
      ADD_FAILURE() << "bytes of the other format were read";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("prepacked as ") + theirs), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(std::string("this build reads ") + mine), std::string::npos) << e.what();
    }
  }
  const uint32_t own = other == 1 ? 2 : 1;
  std::memcpy(s.packed.data<uint8_t>() + 8, &own, 4);
  EXPECT_TRUE(test::bitwise_equal(linear(x, s), y));
  std::memcpy(s.packed.data<uint8_t>(), "NOTPACKD", 8);
  EXPECT_TRUE(test::throws_naming("sparse24_linear", [&] { (void)linear(x, s); }));
}

TEST(Sparse24, APrepackedLayoutAloneServesEveryRowCountAndUnpacksBitForBit) {
  // prepack(replace=true): the layout is the only copy; values and meta come back from it exactly,
  // linear() at every M (each kernel range, without dense copies) equals the dense product, and
  // a gradient is refused by name.
  manual_seed(17);
  for (int64_t K : {int64_t(40), int64_t(296)})
    for (DType vt : {DType::f32, DType::bf16, DType::i8})
      for (int64_t N : {int64_t(67), int64_t(136)}) {
        SCOPED_TRACE("K=" + std::to_string(K) + " N=" + std::to_string(N) + " " + dtype_name(vt));
        SemiStructuredSparse s = to_sparse_semi_structured(pruned(N, K), vt);
        const Tensor values = s.values.clone(), meta = s.meta.clone(), wd = s.to_dense().to(DType::f64), b = randn({N});
        s.prepack(/*replace=*/true);
        ASSERT_TRUE(s.packed_only());
        EXPECT_TRUE(s.values.is_symbolic() && s.meta.is_symbolic());
        EXPECT_EQ(s.shape(), Shape({N, K}));
        EXPECT_EQ(s.dtype(), vt);
        EXPECT_EQ(s.nbytes(), s.packed.numel() + N * 4);
        EXPECT_TRUE(test::all_close(s.to_dense().to(DType::f64), wd, 0, 0));
        EXPECT_FALSE(sparse_runs_densely(s, DType::f32));  // no dense copy: its bytes are not kept either
        for (int64_t M : {1, 2, 4, 7, 17, 41, 130}) {
          SCOPED_TRACE("M=" + std::to_string(M));
          EXPECT_NE(sparse_kernel_for(s, DType::f32, M).find("prepacked"), std::string::npos) << sparse_kernel_for(s, DType::f32, M);
          NoGradGuard ng;
          Tensor x = randn({M, K});
          EXPECT_TRUE(test::all_close(linear(x, s, b, "relu"), relu(linear(x.to(DType::f64), wd, b.to(DType::f64))).to(DType::f32), 1e-5, 3e-5));
          if (vt == DType::bf16) {  // bf16 activations too (the pairs kernel where the CPU has AVX512-BF16)
            Tensor xb = x.to(DType::bf16);
            EXPECT_TRUE(test::all_close(linear(xb, s).to(DType::f32), linear(xb.to(DType::f64), wd).to(DType::f32), 1e-2, 1e-2));
          }
        }
        Tensor xg = randn({3, K}).requires_grad_();
        EXPECT_TRUE(test::throws_naming("sparse24_linear", [&] { (void)linear(xg, s); }));
        s.unpack();
        EXPECT_FALSE(s.packed_only());
        EXPECT_TRUE(s.packed_current());  // the layout stays, now as a copy of values + meta
        EXPECT_TRUE(test::all_close(s.values.to(DType::f64), values.to(DType::f64), 0, 0));
        EXPECT_TRUE(test::all_close(s.meta.to(DType::f64), meta.to(DType::f64), 0, 0));
      }
}

TEST(Sparse24, ServingPrepacksInt8LayersAndGeneratesTheSameTokens) {
  // GPT::prepack_for_decode (what `sinter generate` calls): int8 2:4 layers above the dense-copy
  // size get the prepacked layout; greedy generation and the logits must not change.
  nn::ModelConfig c = nn::ModelConfig::preset("tiny");
  c.hidden_size = 384, c.intermediate_size = 1536, c.num_hidden_layers = 1, c.max_position_embeddings = 64;
  for (DType vt : {DType::i8, DType::f32}) {
    nn::GPT model(c);
    model.init_weights(7);
    model.sparsify(vt);
    NoGradGuard ng;
    Tensor idx = randint(0, 256, {1, 12});
    const Tensor logits = model.forward(idx);
    const Tensor tokens = train::generate(model, data::encode("the quick"), 10, train::Sampling{0.0, 0, 1.0, 1});
    const int64_t added = model.prepack_for_decode();
    const bool packs = prepacked_serves(vt, 1);  // int8 values, on an AVX2 build
    EXPECT_EQ(packs, vt == DType::i8 && prepacked_serves(DType::i8, 2));
    int64_t want = 0;
    for (auto& l : model.block_linears()) {
      EXPECT_EQ(l->sparse.packed.defined(), packs);  // every block layer is >= 384 x 384 (576 KiB dense)
      if (l->sparse.packed.defined()) want += l->sparse.packed.numel();
    }
    EXPECT_EQ(added, want);
    EXPECT_EQ(added > 0, packs);
    EXPECT_TRUE(test::all_close(model.forward(idx), logits, 1e-4, 1e-4));
    EXPECT_TRUE(test::all_close(train::generate(model, data::encode("the quick"), 10, train::Sampling{0.0, 0, 1.0, 1}), tokens, 0, 0));
    // As `sinter generate` serves: the layout replaces values + meta (fewer bytes, not more), the
    // same tokens; state_dict() refuses the layers until they are unpacked, then gives the weights back.
    const auto before = model.state_dict();
    const int64_t change = model.prepack_for_decode(/*replace=*/true);
    int64_t released = 0;  // the bytes of values + meta (the shapes stay)
    for (auto& l : model.block_linears()) {
      EXPECT_EQ(l->sparse.packed_only(), packs);
      if (packs) released += l->sparse.values.numel() * l->sparse.values.element_size() + l->sparse.meta.numel();
    }
    EXPECT_EQ(change, added - released);
    EXPECT_TRUE(test::all_close(model.forward(idx), logits, 1e-4, 1e-4));
    EXPECT_TRUE(test::all_close(train::generate(model, data::encode("the quick"), 10, train::Sampling{0.0, 0, 1.0, 1}), tokens, 0, 0));
    // the compiled decode step reads the layout alone too (sparse24_linear is a node like any other)
    EXPECT_TRUE(test::all_close(train::generate(model, data::encode("the quick"), 10, train::Sampling{0.0, 0, 1.0, 1}, true, nullptr, {},
                                                /*compiled=*/true),
                                tokens, 0, 0));
    if (packs) {
      EXPECT_TRUE(test::throws_naming("state_dict", [&] { (void)model.state_dict(); }));
      for (auto& l : model.block_linears()) l->sparse.unpack();
    }
    for (auto& [name, t] : model.state_dict()) EXPECT_TRUE(test::all_close(t.to(DType::f64), before.at(name).to(DType::f64), 0, 0)) << name;
  }
}

TEST(Sparse24, FusedActivationsAndBf16Activations) {
  manual_seed(4);
  SemiStructuredSparse s = to_sparse_semi_structured(pruned(20, 48));
  Tensor x = randn({7, 48}), b = randn({20});
  EXPECT_TRUE(test::all_close(linear(x, s, b, "relu"), relu(linear(x, s, b)), 1e-6, 1e-6));
  EXPECT_TRUE(test::all_close(linear(x, s, b, "silu"), silu(linear(x, s, b)), 1e-5, 1e-5));
  EXPECT_TRUE(test::all_close(linear(x, s, b, "gelu"), gelu(linear(x, s, b)), 1e-5, 1e-5));
  EXPECT_TRUE(test::throws_naming("sparse24_linear", [&] { linear(x, s, b, "tanh"); }));
  Tensor yb = linear(x.to(DType::bf16), s, b.to(DType::bf16));
  EXPECT_EQ(yb.dtype(), DType::bf16);
  EXPECT_TRUE(test::all_close(yb.to(DType::f32), linear(x.to(DType::bf16).to(DType::f32), s, b.to(DType::bf16).to(DType::f32)), 1e-2, 1e-2));
  EXPECT_TRUE(test::throws_naming("sparse24_linear", [&] { linear(randn({2, 40}), s); }));
}

TEST(Sparse24, GradientsMatchTheDenseComputationOnTheKeptEntries) {
  manual_seed(5);
  Tensor w = pruned(12, 32);
  SemiStructuredSparse s = to_sparse_semi_structured(w);
  s.values.requires_grad_();
  Tensor x = randn({9, 32}).requires_grad_(), b = randn({12}).requires_grad_();
  Tensor g = randn({9, 12});
  auto gs = autograd::grad({sum(linear(x, s, b, "silu") * g)}, {x, s.values, b});
  Tensor wd = w.detach().requires_grad_(), xd = x.detach().requires_grad_(), bd = b.detach().requires_grad_();
  auto gd = autograd::grad({sum(silu(linear(xd, wd, bd)) * g)}, {xd, wd, bd});
  EXPECT_TRUE(test::all_close(gs[0], gd[0], 1e-5, 1e-5));
  EXPECT_TRUE(test::all_close(gs[2], gd[2], 1e-5, 1e-5));
  // the values' gradient is the dense weight gradient at the kept positions
  SemiStructuredSparse grad_as_sparse{gs[1], s.meta, s.scales};
  EXPECT_TRUE(test::all_close(grad_as_sparse.to_dense(), gd[1] * ne(w, zeros({})).to(DType::f32), 1e-5, 1e-5));
}

TEST(Sparse24, SmallLayersComputeDenselyAndFollowTheirValues) {
  // The sparse24_linear kernel runs a 2:4 layer of at most kSmallLayerBytes densely from a cached
  // copy: it must compute what the dense matrix computes, follow in-place changes and loaded
  // values, give the op's gradients, and stay within its budget.
  manual_seed(6);
  using sparse::kDenseCopyBudget;
  using sparse::kSmallLayerBytes;
  const int64_t before = sparse_dense_copy_bytes();
  auto dense_ref = [](const Tensor& x, const nn::Linear& l) {
    return linear(x, l.sparse.to_dense().to(x.dtype()), l.bias.defined() ? l.bias.to(x.dtype()) : Tensor());
  };
  for (DType vt : {DType::f32, DType::i8, DType::bf16}) {
    SCOPED_TRACE(dtype_name(vt));
    nn::Linear l(128, 96);
    l.sparsify(vt);
    EXPECT_TRUE(sparse_runs_densely(l.sparse, DType::f32));
    Tensor x = randn({3, 5, 128});
    NoGradGuard g;
    Tensor y1 = l.forward(x);
    EXPECT_TRUE(test::all_close(y1, dense_ref(x, l), 1e-5, 1e-5));
    EXPECT_EQ(sparse_dense_copy_bytes(), before + 96 * 128 * 4);
    l.sparse.scales.mul_(-2.0);  // in place: the copy is remade
    EXPECT_TRUE(test::all_close(l.forward(x), dense_ref(x, l), 1e-5, 1e-5));
    EXPECT_TRUE(test::all_close(l.forward(x), y1 * -2.0 + l.bias * 3.0, 1e-4, 1e-4));
    nn::Linear other(128, 96);
    other.sparsify(vt);
    l.load_state_dict(other.state_dict());
    EXPECT_TRUE(test::all_close(l.forward(x), dense_ref(x, other), 1e-5, 1e-5));
  }
  EXPECT_EQ(sparse_dense_copy_bytes(), before);  // released with their weights
  // bf16 inputs (a model moved to bf16): with bf16 values a bf16 copy where oneDNN multiplies bf16
  // (exact: the values are bf16), else the f32 copy, x widened.
  const int64_t bf16_copy = cpu::dnnl_has_bf16() ? 96 * 128 * 2 : 96 * 128 * 4;
  for (DType vt : {DType::bf16, DType::i8}) {
    SCOPED_TRACE(std::string("bf16 inputs, values ") + dtype_name(vt));
    nn::Linear l(128, 96);
    l.sparsify(vt);
    l.to(DType::bf16);
    for (int64_t M : {1, 3}) {
      Tensor x = randn({M, 128}).to(DType::bf16);
      NoGradGuard g;
      Tensor y = l.forward(x);
      EXPECT_EQ(y.dtype(), DType::bf16);
      EXPECT_TRUE(test::all_close(y.to(DType::f32), dense_ref(x, l).to(DType::f32), 1e-2, 1e-2));
    }
    Tensor x = randn({3, 128}).to(DType::bf16);
    NoGradGuard g;
    Tensor y = l.forward(x);
    EXPECT_EQ(sparse_dense_copy_bytes(), before + (vt == DType::bf16 ? bf16_copy : 96 * 128 * 4));
    EXPECT_TRUE(test::all_close(y.to(DType::f32), dense_ref(x, l).to(DType::f32), 1e-2, 1e-2));
    l.sparse.scales.mul_(-2.0);  // in place: the copy is remade
    EXPECT_TRUE(test::all_close(l.forward(x).to(DType::f32), (y.to(DType::f32) * -2.0 + l.bias.to(DType::f32) * 3.0), 3e-2, 3e-2));
  }
  EXPECT_EQ(sparse_dense_copy_bytes(), before);
  {  // a layer run in f32, then moved to bf16: its copy follows
    nn::Linear l(128, 96);
    l.sparsify();
    NoGradGuard g;
    Tensor x = randn({2, 128});
    (void)l.forward(x);
    EXPECT_EQ(sparse_dense_copy_bytes(), before + 96 * 128 * 4);
    l.to(DType::bf16);
    Tensor xb = x.to(DType::bf16);
    EXPECT_TRUE(test::all_close(l.forward(xb).to(DType::f32), dense_ref(xb, l).to(DType::f32), 1e-2, 1e-2));
    EXPECT_EQ(sparse_dense_copy_bytes(), before + bf16_copy);
  }
  EXPECT_EQ(sparse_dense_copy_bytes(), before);
  {  // gradients through the dense form: those of the dense product, restricted to the kept entries
    nn::Linear l(64, 40);
    l.sparsify();
    Tensor x = randn({7, 64}).requires_grad_(), g = randn({7, 40});
    Tensor w = l.sparse.to_dense().detach().requires_grad_();
    auto gl = autograd::grad({sum(l.forward(x) * g)}, {x, l.sparse.values, l.bias});
    auto gd = autograd::grad({sum(linear(x, w, l.bias) * g)}, {x, w, l.bias});
    EXPECT_TRUE(test::all_close(gl[0], gd[0], 1e-5, 1e-5));
    SemiStructuredSparse kept{gl[1], l.sparse.meta, l.sparse.scales};
    EXPECT_TRUE(test::all_close(kept.to_dense(), gd[1] * ne(w, zeros({})).to(DType::f32), 1e-5, 1e-5));
    EXPECT_TRUE(test::all_close(gl[2], gd[2], 1e-5, 1e-5));
  }
  {  // larger layers run the 2:4 kernels, and the copies stop at the budget
    NoGradGuard g;
    nn::Linear big(256, 512);
    big.sparsify();
    EXPECT_FALSE(sparse_runs_densely(big.sparse, DType::f32));
    Tensor x = randn({2, 256});
    EXPECT_TRUE(test::all_close(big.forward(x), dense_ref(x, big), 1e-5, 1e-5));
    EXPECT_EQ(sparse_dense_copy_bytes(), before);
    const int64_t n = kDenseCopyBudget / kSmallLayerBytes + 3;
    std::vector<std::shared_ptr<nn::Linear>> layers;
    Tensor xs = randn({2, 128});
    for (int64_t i = 0; i < n; ++i) {
      layers.push_back(std::make_shared<nn::Linear>(128, 512));  // exactly kSmallLayerBytes dense
      layers.back()->sparsify();
      EXPECT_TRUE(test::all_close(layers.back()->forward(xs), dense_ref(xs, *layers.back()), 1e-5, 1e-5));
    }
    EXPECT_LE(sparse_dense_copy_bytes(), kDenseCopyBudget);
    EXPECT_GE(sparse_dense_copy_bytes(), kDenseCopyBudget - kSmallLayerBytes);
  }
  EXPECT_EQ(sparse_dense_copy_bytes(), before);
}

}  // namespace
}  // namespace sinter

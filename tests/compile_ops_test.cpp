// Compiled against eager over the whole op table. For every registered op, one compiled function
// runs the op on every case of its spec (tests/op_specs*.cpp: broadcasting, size-0 and size-1
// dims) and on strided copies of them, and must give eager's results: bit for bit where the same
// functors or the same library kernel run, within f32 1e-6 relative where a generated kernel
// reorders a reduction. A second compiled function takes the gradient of a weighted sum of the
// op's outputs (its backward traced into the graph) and must match eager's gradients. Random ops
// draw in the graph what eager draws from the same generator state, and new numbers every call;
// data-dependent ops must break the graph (explain names them) and still give eager's values.
// An op without a spec fails OpTableCoverage in ops_test.cpp; here every op gets a case by
// construction, so a new op is compiled the day it is registered.
#include <cstring>
#include <random>

#include <sinter/compile.h>
#include <sinter/random.h>

#include "op_specs.h"

using namespace sinter;
using namespace sinter::test;

namespace {

::testing::AssertionResult same(const Tensor& out, const Tensor& ref, bool bitwise) {
  if (out.shape() != ref.shape() || out.dtype() != ref.dtype())
    return ::testing::AssertionFailure() << "compiled " << out.dtype() << out.shape() << ", eager " << ref.dtype() << ref.shape();
  if (bitwise || !is_floating(ref.dtype())) {
    if (bitwise_equal(out, ref)) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "not bit for bit equal: " << all_close(out, ref, 0, 0).message();
  }
  const double tol = std::max(1e-6, default_rtol(ref.dtype()) * (ref.dtype() == DType::f64 ? 0 : 1));
  return all_close(out, ref, tol, tol);
}

std::vector<Tensor> clones(const std::vector<Tensor>& ts) {
  std::vector<Tensor> c;
  for (const Tensor& t : ts) {
    if (!t.defined() || t.is_contiguous()) c.push_back(t.defined() ? t.clone() : t);
    else c.push_back(noncontiguous(t.contiguous().clone()));  // the same values, strided again
  }
  return c;
}

// A random op's seed and counter come from the generator, as its public function sets them, so
// every call draws new numbers (a spec case's fixed attributes would draw the same ones).
Attrs with_draws(Attrs a) {
  if (a.has("seed") && a.has("counter")) {
    Generator& g = default_generator();
    a.set("seed", int64_t(g.seed)), a.set("counter", int64_t(g.reserve(1 << 16)));
  }
  return a;
}

class CompiledOp : public ::testing::TestWithParam<std::string> {
 protected:
  const OpDef& op() const { return get_op(GetParam()); }
  const Spec& spec() const { return op_specs().at(GetParam()); }
};

}  // namespace

TEST_P(CompiledOp, MatchesEagerOnEveryCase) {
  ASSERT_TRUE(op_specs().count(GetParam())) << "op '" << GetParam() << "' has no spec, so no compile case";
  manual_seed(4321);
  std::vector<Case> cases = spec().cases();
  ASSERT_FALSE(cases.empty());
  const size_t contiguous_cases = cases.size();
  for (size_t i = 0; i < contiguous_cases; ++i) {
    Case nc = cases[i];
    bool strided = false;
    for (Tensor& t : nc.in)
      if (t.defined() && t.numel() > 1) t = noncontiguous(t), strided = true;
    if (strided) cases.push_back(nc);
  }
  // One function runs every case: its inputs are the cases' inputs, end to end.
  std::vector<size_t> first;
  std::vector<Tensor> inputs;
  for (const Case& c : cases) first.push_back(inputs.size()), inputs.insert(inputs.end(), c.in.begin(), c.in.end());
  const OpDef* o = &op();
  auto fn = [o, &cases, first](const std::vector<Tensor>& in) {
    std::vector<Tensor> out;
    for (size_t k = 0; k < cases.size(); ++k) {
      std::vector<Tensor> args(in.begin() + long(first[k]), in.begin() + long(first[k] + cases[k].in.size()));
      for (Tensor& t : call(*o, args, with_draws(cases[k].attrs))) out.push_back(t);
    }
    return out;
  };
  // In-place ops write their inputs: each side gets its own copies, and the copies are compared too.
  std::vector<Tensor> eager_in = clones(inputs), compiled_in = clones(inputs);
  manual_seed(99);
  const std::vector<Tensor> ref = fn(eager_in);
  const uint64_t eager_offset = default_generator().offset;
  CompiledFunction f = compile(fn, {.name = "op_" + o->name});
  manual_seed(99);
  const std::vector<Tensor> out = f(compiled_in);
  EXPECT_EQ(default_generator().offset, eager_offset) << "the compiled call reserved other random numbers than eager";
  const Explanation e = f.explain(compiled_in);
  if (o->data_dependent) {
    // The trace cannot go past it: the function runs lazily, in pieces, and explain says where and why.
    ASSERT_EQ(e.breaks, 1) << e.text;
    EXPECT_NE(e.break_reasons[0].find(o->name), std::string::npos) << e.text;
    CompileOptions full{.fullgraph = true, .name = "op_" + o->name};
    EXPECT_THROW(compile(fn, full)(compiled_in), CompileError);
  } else {
    EXPECT_EQ(e.breaks, 0) << e.text;
    EXPECT_EQ(f.traces(), 1) << e.text;
    EXPECT_EQ(f.compiles(), 1) << e.text;
  }
  ASSERT_EQ(out.size(), ref.size());
  // Fused elementwise kernels run the eager kernels' functors; library kernels are eager's own;
  // only a reduction regenerated in a fused kernel may round differently.
  const bool bitwise = o->fusable || (o->name != "layer_norm" && o->name != "rms_norm");
  for (size_t k = 0; k < out.size(); ++k) EXPECT_TRUE(same(out[k], ref[k], bitwise)) << "output " << k << "\n" << e.text;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].defined()) {
      EXPECT_TRUE(same(compiled_in[i], eager_in[i], true)) << "input " << i << " after the call";
    }
  // A second call reuses the compiled code (and its planned buffers). A random op draws new
  // numbers, the ones eager's second call draws.
  if (!o->mutates) {
    const Generator before = default_generator();
    const std::vector<Tensor> again = f(compiled_in);
    default_generator() = before;
    const std::vector<Tensor> eager_again = fn(eager_in);
    for (size_t k = 0; k < out.size(); ++k) EXPECT_TRUE(same(again[k], eager_again[k], bitwise)) << "second call, output " << k;
    if (o->random) {  // some case draws differently (a degenerate one, like p = 0, may not)
      bool differs = false;
      for (size_t k = 0; k < out.size(); ++k) differs = differs || !bitwise_equal(again[k], out[k]);
      EXPECT_TRUE(differs) << "the second call drew the same numbers";
    }
    EXPECT_EQ(f.traces(), 1);
    EXPECT_EQ(f.compiles(), o->data_dependent ? 0 : 1);  // item alone is a piece of scalars: run op by op
  }
}

TEST_P(CompiledOp, GradientsMatchEager) {
  if (!op().backward) return;  // not differentiable: nothing to compile backward
  manual_seed(77);
  const std::vector<Case> cases = spec().grad_cases();
  ASSERT_FALSE(cases.empty());
  const OpDef* o = &op();
  for (const Case& c : cases) {
    std::vector<size_t> diff;
    for (size_t i = 0; i < c.in.size(); ++i)
      if (c.in[i].defined() && is_floating(c.in[i].dtype()) && c.in[i].numel() > 0) diff.push_back(i);
    if (diff.empty()) continue;
    std::vector<Tensor> weights;
    {
      NoGradGuard no_grad;
      for (const Tensor& out : call(*o, c.in, c.attrs)) weights.push_back(is_floating(out.dtype()) ? randn(out.shape(), out.dtype()) : Tensor());
    }
    // The function makes its floating inputs leaves, runs the op, and returns the op's outputs and
    // the gradients of sum(out * w): the backward formulas are ops, so they trace into the graph.
    auto fn = [o, &c, &weights, diff](const std::vector<Tensor>& in) {
      std::vector<Tensor> args = in, xs;
      for (size_t i : diff) args[i] = in[i].detach().requires_grad_(), xs.push_back(args[i]);
      std::vector<Tensor> outs = call(*o, args, with_draws(c.attrs));
      Tensor loss;
      for (size_t k = 0; k < outs.size(); ++k)
        if (weights[k].defined()) {
          Tensor term = sum(outs[k] * weights[k]);
          loss = loss.defined() ? loss + term : term;
        }
      std::vector<Tensor> r;
      for (const Tensor& t : outs) r.push_back(t.detach());
      if (!loss.defined() || !loss.requires_grad()) return r;
      const std::vector<Tensor> grads = autograd::grad({loss}, xs, {}, false, false, true);
      for (size_t n = 0; n < xs.size(); ++n) r.push_back(grads[n].defined() ? grads[n] : zeros(xs[n].shape(), xs[n].dtype()));
      return r;
    };
    manual_seed(5);
    const std::vector<Tensor> ref = fn(c.in);
    CompiledFunction f = compile(fn, {.fullgraph = true, .name = "grad_" + o->name});
    manual_seed(5);
    const std::vector<Tensor> out = f(c.in);
    ASSERT_EQ(out.size(), ref.size());
    const Explanation e = f.explain(c.in);
    for (size_t k = 0; k < out.size(); ++k) {
      EXPECT_TRUE(same(out[k], ref[k], false)) << "result " << k << " (outputs, then gradients)\n" << e.text;
    }
  }
}

// Random programs of fusable ops over broadcast inputs, strided views of inputs (a slice, a
// transpose) and views taken inside the chain (an op applied through a transpose), compiled and
// run eagerly: bit for bit the same, since the same functors run.
TEST(CompiledChains, RandomChainsOfFusableOpsEqualEagerBitForBit) {
  std::vector<const OpDef*> unary, binary;
  for (const OpDef* op : all_ops()) {
    if (!op->fusable || op->name == "cast" || op->name == "clamp" || op->name == "masked_fill" || op->name == "where") continue;
    if (op->num_inputs == 1) unary.push_back(op);
    else if (op->num_inputs == 2 && op->name != "eq" && op->name != "ne" && op->name != "lt" && op->name != "le" &&
             op->name != "gt" && op->name != "ge")
      binary.push_back(op);
  }
  ASSERT_GT(unary.size(), 10u);
  ASSERT_GT(binary.size(), 5u);
  struct Instr {
    int kind;  // 0 unary, 1 unary through a transpose, 2 binary, 3 where(a > b, a, b), 4 clamp
    const OpDef* op;
    int a, b;
  };
  for (uint64_t seed = 0; seed < 16; ++seed) {
    SCOPED_TRACE("chain seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    auto pick = [&](size_t n) { return int(rng() % n); };
    std::vector<Instr> prog;
    const int n_inputs = 5, length = 4 + pick(8);
    std::string text;
    for (int i = 0; i < length; ++i) {
      const int avail = n_inputs + i, kind = pick(10);
      Instr in{kind < 4 ? 0 : kind < 5 ? 1 : kind < 8 ? 2 : kind < 9 ? 3 : 4, nullptr, pick(size_t(avail)), pick(size_t(avail))};
      if (in.kind <= 1) in.op = unary[size_t(pick(unary.size()))];
      if (in.kind == 2) in.op = binary[size_t(pick(binary.size()))];
      text += (in.op ? in.op->name : in.kind == 3 ? "where" : "clamp") + std::string(" ");
      prog.push_back(in);
    }
    SCOPED_TRACE(text);
    auto fn = [&prog](const std::vector<Tensor>& in) {
      // Inputs: x (4, 6, 5); y (6, 1) and z (5) broadcast; a slice of a wider tensor; a transpose.
      std::vector<Tensor> v{in[0], in[1], in[2], in[3].slice(2, 1, 6), in[4].transpose(0, 2)};
      for (const Instr& i : prog) {
        // Positive operands where the op needs them (log, sqrt, pow's base): |t| + 0.25.
        auto arg = [&](int k) {
          return i.op && (i.op->name == "log" || i.op->name == "sqrt" || i.op->name == "rsqrt" || i.op->name == "pow")
                     ? abs(v[size_t(k)]) + 0.25
                     : v[size_t(k)];
        };
        switch (i.kind) {
          case 0: v.push_back(call1(*i.op, {arg(i.a)})); break;
          case 1: v.push_back(call1(*i.op, {arg(i.a).expand({4, 6, 5}).transpose(0, 1)}).transpose(0, 1)); break;
          case 2: v.push_back(call1(*i.op, {arg(i.a), arg(i.b)})); break;
          case 3: v.push_back(where(gt(v[size_t(i.a)], v[size_t(i.b)]), v[size_t(i.a)], v[size_t(i.b)])); break;
          default: v.push_back(clamp(v[size_t(i.a)], -0.5, 0.75)); break;
        }
      }
      return std::vector<Tensor>{v.back(), v[v.size() / 2 + 2]};
    };
    manual_seed(seed);
    const std::vector<Tensor> in{randn({4, 6, 5}), randn({6, 1}), randn({5}), randn({4, 6, 7}), randn({5, 6, 4})};
    const std::vector<Tensor> ref = fn(in);
    CompiledFunction f = compile(fn, {.fullgraph = true, .name = "chain" + std::to_string(seed)});
    const std::vector<Tensor> out = f(in);
    const Explanation e = f.explain(in);
    for (size_t k = 0; k < out.size(); ++k) EXPECT_TRUE(same(out[k], ref[k], true)) << "output " << k << "\n" << e.text;
    // Every op ran in generated code (kernels group by output shape, so a broadcast-shaped
    // operand's ops form a kernel of their own).
    EXPECT_EQ(e.library_calls, 0) << e.text;
    EXPECT_LE(e.fused_kernels, length) << e.text;
  }
}

INSTANTIATE_TEST_SUITE_P(AllOps, CompiledOp, ::testing::ValuesIn(op_names()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

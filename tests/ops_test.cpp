// The op-table sweep: every registered op is checked against its simple reference on random cases
// (contiguous and not), against finite differences (f64), symbolically, and with bad input.
// An op registered without a spec in op_specs*.cpp fails OpTable.EveryOpHasASpec.
#include <cmath>

#include "op_specs.h"

using namespace sinter;
using namespace sinter::test;

namespace {

class OpTable : public ::testing::TestWithParam<std::string> {
 protected:
  const OpDef& op() const { return get_op(GetParam()); }
  const Spec& spec() const {
    static Spec none;
    auto it = op_specs().find(GetParam());
    return it == op_specs().end() ? none : it->second;
  }
  bool has_spec() const { return op_specs().count(GetParam()) > 0; }
};

}  // namespace

TEST(OpTableCoverage, EveryOpHasASpecAndEverySpecAnOp) {
  for (const OpDef* op : all_ops()) {
    auto it = op_specs().find(op->name);
    ASSERT_NE(it, op_specs().end()) << "op '" << op->name << "' has no test spec in tests/op_specs*.cpp";
    const bool has_grad_cases = it->second.grad_cases != nullptr;
    EXPECT_EQ(has_grad_cases, op->backward != nullptr)
        << "op '" << op->name << "': differentiable ops need gradient cases, and only they";
    EXPECT_TRUE(it->second.bad != nullptr) << "op '" << op->name << "' has no bad-input cases";
  }
  for (auto& [name, s] : op_specs()) EXPECT_NE(find_op(name), nullptr) << "spec for unknown op '" << name << "'";
}

TEST_P(OpTable, MatchesReferenceOnRandomCases) {
  ASSERT_TRUE(has_spec());
  manual_seed(1234);
  const auto cases = spec().cases();
  ASSERT_FALSE(cases.empty());
  for (const Case& c : cases) {
    // The reference reads the inputs before the op runs (an in-place op writes some of them), and
    // the strided run starts from the same values.
    std::vector<R> in_ref;
    for (auto& t : c.in) in_ref.push_back(ref_of(t));
    Case nc = c;
    for (auto& t : nc.in) t = noncontiguous(t);
    const std::vector<R> ref = spec().ref(in_ref, c.attrs);
    std::vector<Tensor> out = call(op(), c.in, c.attrs);
    EXPECT_TRUE(matches(out, ref, spec())) << describe(c);
    // Same values, strided layout: the result must not change.
    EXPECT_TRUE(matches(call(op(), nc.in, nc.attrs), ref, spec())) << describe(nc);
  }
}

// Makes every op call symbolic (what a compiler's trace sees), recording nothing.
struct SymbolicOnly : OpObserver {
  bool tracing() const override { return true; }
  void after(const OpDef&, std::span<const Tensor>, const Attrs&, std::span<const Tensor>) override {}
};

TEST_P(OpTable, SymbolicInferenceMatchesEager) {
  ASSERT_TRUE(has_spec());
  manual_seed(99);
  for (const Case& c : spec().cases()) {
    std::vector<Tensor> sym;
    for (auto& t : c.in) sym.push_back(Tensor::symbolic(t.shape(), t.dtype()));
    std::vector<Tensor> out_sym;
    {
      SymbolicOnly tracer;  // ops without inputs (factories) are symbolic only while traced
      ObserveScope scope(&tracer);
      out_sym = call(op(), sym, c.attrs);
    }
    const auto out = call(op(), c.in, c.attrs);
    ASSERT_EQ(out_sym.size(), out.size());
    for (size_t k = 0; k < out.size(); ++k) {
      EXPECT_TRUE(out_sym[k].is_symbolic());
      EXPECT_EQ(out_sym[k].shape(), out[k].shape()) << describe(c);
      EXPECT_EQ(out_sym[k].dtype(), out[k].dtype()) << describe(c);
    }
  }
}

TEST_P(OpTable, GradientsMatchFiniteDifferences) {
  ASSERT_TRUE(has_spec());
  if (!op().backward) {
    EXPECT_FALSE(spec().grad_cases) << "non-differentiable op with gradient cases";
    return;
  }
  manual_seed(7);
  const auto cases = spec().grad_cases();
  ASSERT_FALSE(cases.empty()) << "differentiable op without gradient cases";
  const double eps = 1e-6;
  for (const Case& c : cases) {
    std::vector<Tensor> in;
    std::vector<size_t> diff;
    for (size_t i = 0; i < c.in.size(); ++i) {
      Tensor t = c.in[i].contiguous().detach().clone();
      if (t.dtype() == DType::f64 && t.numel() > 0) { t.requires_grad_(); diff.push_back(i); }
      in.push_back(t);
    }
    if (diff.empty()) continue;
    const auto probe = call(op(), in, c.attrs);
    std::vector<Tensor> weights;
    for (auto& o : probe) weights.push_back(is_floating(o.dtype()) ? randn(o.shape(), DType::f64) : Tensor());
    auto loss_of = [&](const std::vector<Tensor>& outs) {
      Tensor l = zeros({}, DType::f64);
      for (size_t k = 0; k < outs.size(); ++k) if (weights[k].defined()) l = l + sum(outs[k] * weights[k]);
      return l;
    };
    Tensor loss = loss_of(call(op(), in, c.attrs));
    ASSERT_TRUE(loss.requires_grad()) << describe(c);
    std::vector<Tensor> xs;
    for (size_t i : diff) xs.push_back(in[i]);
    auto grads = autograd::grad({loss}, xs, {}, false, false, true);
    for (size_t n = 0; n < diff.size(); ++n) {
      const size_t i = diff[n];
      Tensor analytic = grads[n].defined() ? grads[n] : zeros(in[i].shape(), DType::f64);
      std::vector<double> numeric(size_t(in[i].numel()));
      NoGradGuard no_grad;
      for (int64_t j = 0; j < in[i].numel(); ++j) {
        double f[2];
        for (int side = 0; side < 2; ++side) {
          std::vector<Tensor> pin = in;
          pin[i] = in[i].detach().clone();
          pin[i].data<double>()[j] += side ? -eps : eps;
          f[side] = loss_of(call(op(), pin, c.attrs)).item<double>();
        }
        numeric[size_t(j)] = (f[0] - f[1]) / (2 * eps);
      }
      EXPECT_TRUE(all_close(analytic, numeric, 1e-5, 1e-6)) << "gradient of input " << i << "; " << describe(c);
    }
  }
}

TEST_P(OpTable, BadInputsRaiseErrorsNamingTheOp) {
  ASSERT_TRUE(has_spec());
  manual_seed(5);
  ASSERT_TRUE(spec().bad);
  const auto bad = spec().bad();
  ASSERT_FALSE(bad.empty());
  for (const Case& c : bad) {
    EXPECT_TRUE(throws_naming(op().name, [&] { call(op(), c.in, c.attrs); })) << describe(c);
    // Symbolic inputs reach the same checks (data-dependent ones excepted: those need values).
  }
  // Wrong arity, for every op.
  std::vector<Tensor> wrong(op().num_inputs < 0 ? 0 : size_t(op().num_inputs + 1), randn({2}));
  EXPECT_TRUE(throws_naming(op().name, [&] { call(op(), wrong, {}); }));
  // Undefined input.
  if (op().num_inputs != 0) {
    std::vector<Tensor> undef(op().num_inputs < 0 ? 1 : size_t(op().num_inputs));
    EXPECT_TRUE(throws_naming(op().name, [&] { call(op(), undef, {}); }));
  }
}

INSTANTIATE_TEST_SUITE_P(AllOps, OpTable, ::testing::ValuesIn(op_names()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

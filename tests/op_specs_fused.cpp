// Specs for the ops the compiler makes by fusion (they are in the op table like any other, so
// they are tested like any other): linear_fused = act(linear(x, w, b)) + residual.
#include "op_specs.h"

namespace sinter::test {
using namespace spec;

void add_fused_specs(std::map<std::string, Spec>& m) {
  Spec lf;
  auto attrs = [](const std::string& act, bool bias, bool res) {
    return Attrs{{"act", act}, {"bias", bias}, {"residual", res}};
  };
  lf.cases = [attrs] {
    std::vector<Case> c;
    // Every activation on the oneDNN path (M > 8, post-ops) and on the few-rows path (M <= 8: the
    // epilogue runs as passes), with and without bias and residual.
    for (const char* act : {"none", "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh"}) {
      c.push_back({{rn({20, 24}), rn({16, 24}), rn({16}), rn({20, 16})}, attrs(act, true, true)});
      c.push_back({{rn({2, 3, 24}), rn({16, 24})}, attrs(act, false, false)});
    }
    c.push_back({{rn({3, 24}), rn({16, 24}), rn({16})}, attrs("gelu_tanh", true, false)});
    c.push_back({{rn({4, 5, 24}), rn({7, 24}), rn({4, 5, 7})}, attrs("none", false, true)});
    c.push_back({{rn({0, 24}), rn({7, 24}), rn({7}), rn({0, 7})}, attrs("relu", true, true)});
    c.push_back({{rn({12, 40}).to(DType::bf16), rn({24, 40}).to(DType::bf16), rn({24}).to(DType::bf16), rn({12, 24}).to(DType::bf16)},
                 attrs("gelu_tanh", true, true)});
    c.push_back({{rn({5, 6}, DType::f64), rn({3, 6}, DType::f64), rn({3}, DType::f64), rn({5, 3}, DType::f64)}, attrs("silu", true, true)});
    return c;
  };
  auto linear_ref = m.at("linear").ref;
  lf.ref = [linear_ref](const std::vector<R>& in, const Attrs& a) {
    const bool bias = a.b("bias"), res = a.b("residual");
    std::vector<R> li(in.begin(), in.begin() + 2 + int(bias));
    R y = linear_ref(li, {})[0];
    const std::string& act = a.str("act");
    for (size_t i = 0; i < y.v.size(); ++i) {
      double& v = y.v[i];
      if (act == "relu") v = v > 0 ? v : 0;
      else if (act == "gelu") v = 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
      else if (act == "gelu_tanh") v = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
      else if (act == "silu") v = v / (1 + std::exp(-v));
      else if (act == "sigmoid") v = 1 / (1 + std::exp(-v));
      else if (act == "tanh") v = std::tanh(v);
      if (res) v += in.back().v[i];
    }
    return std::vector<R>{y};
  };
  lf.bad = [attrs] {
    return std::vector<Case>{{{rn({4, 3}), rn({5, 3})}, attrs("softplus", false, false)},        // no such activation
                             {{rn({4, 3}), rn({5, 3}), rn({5})}, attrs("relu", false, false)},    // an input too many
                             {{rn({4, 3}), rn({5, 3}), rn({4, 4})}, attrs("none", false, true)},  // residual of another shape
                             {{rn({4, 3}), rn({5, 4})}, attrs("none", false, false)},             // K differs
                             {{rn({4, 3}), rn({5, 3}), rn({4, 5}, DType::f64)}, attrs("none", false, true)}};
  };
  m["linear_fused"] = lf;

  // linear3: three linears of one input. The few-rows path (M <= 8, f32: one parallel region over
  // the three weights, GQA-sized k and v) and the three-GEMM path (more rows, bf16, f64).
  Spec l3;
  l3.cases = [] {
    std::vector<Case> c;
    auto b = [](bool v) { return Attrs{{"bias", v}}; };
    c.push_back({{rn({1, 1, 32}), rn({32, 32}), rn({16, 32}), rn({16, 32})}, b(false)});
    c.push_back({{rn({1, 1, 32}), rn({32, 32}), rn({32, 32}), rn({32, 32}), rn({32}), rn({32}), rn({32})}, b(true)});
    c.push_back({{rn({3, 2, 24}), rn({8, 24}), rn({4, 24}), rn({4, 24}), rn({8}), rn({4}), rn({4})}, b(true)});
    c.push_back({{rn({20, 24}), rn({16, 24}), rn({8, 24}), rn({8, 24})}, b(false)});
    // past 4 MB of weights: chunks taken by threads as they free up, across the three weights
    c.push_back({{rn({1, 1024}), rn({400, 1024}) * 0.03, rn({300, 1024}) * 0.03, rn({300, 1024}) * 0.03, rn({400}), rn({300}), rn({300})}, b(true)});
    c.push_back({{rn({0, 24}), rn({16, 24}), rn({8, 24}), rn({8, 24})}, b(false)});
    c.push_back({{rn({4, 40}).to(DType::bf16), rn({24, 40}).to(DType::bf16), rn({8, 40}).to(DType::bf16), rn({8, 40}).to(DType::bf16)}, b(false)});
    c.push_back({{rn({5, 6}, DType::f64), rn({3, 6}, DType::f64), rn({2, 6}, DType::f64), rn({2, 6}, DType::f64)}, b(false)});
    return c;
  };
  l3.ref = [linear_ref](const std::vector<R>& in, const Attrs& a) {
    std::vector<R> out;
    for (size_t i = 0; i < 3; ++i) {
      std::vector<R> li{in[0], in[1 + i]};
      if (a.b("bias")) li.push_back(in[4 + i]);
      out.push_back(linear_ref(li, {})[0]);
    }
    return out;
  };
  l3.bad = [] {
    return std::vector<Case>{{{rn({4, 3}), rn({5, 3}), rn({5, 3})}, Attrs{{"bias", false}}},                     // two weights
                             {{rn({4, 3}), rn({5, 3}), rn({5, 4}), rn({5, 3})}, Attrs{{"bias", false}}},          // K differs
                             {{rn({4, 3}), rn({5, 3}), rn({5, 3}), rn({5, 3})}, Attrs{{"bias", true}}}};          // no biases
  };
  m["linear3"] = l3;
}

}  // namespace sinter::test

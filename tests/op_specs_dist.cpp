// Specs for the collective ops on the single-process group (a group of one: every collective is the
// identity, its backward too). What they do across ranks is tested under mpirun (tests/dist_test.cpp).
#include "op_specs.h"
#include "sinter/dist.h"

namespace sinter::test {
using namespace spec;
namespace {

int64_t world_id() { return dist::world()->id(); }
constexpr int64_t kNoGroup = 1 << 30;

std::vector<R> identity(const std::vector<R>& in, const Attrs&) { return {in[0]}; }

Spec identity_spec(std::function<Attrs(const Tensor&)> attrs, std::function<std::vector<Case>()> bad) {
  Spec s;
  s.cases = [attrs] {
    std::vector<Case> c;
    for (const Tensor& t : {rn({3, 4}), rn({2, 1, 5}, DType::f64), rn({4, 0})}) c.push_back({{t}, attrs(t)});
    return c;
  };
  s.ref = identity;
  s.bad = std::move(bad);
  s.grad_cases = [attrs] {
    Tensor t = rn({2, 3}, DType::f64);
    return std::vector<Case>{{{t}, attrs(t)}};
  };
  return s;
}

Attrs gather_attrs(const Tensor& t, int64_t dim) {
  return {{"group", world_id()}, {"dim", dim}, {"sizes", Shape{t.size(dim)}}, {"grad_partial", false}, {"grad_op", std::string("sum")}};
}

}  // namespace

void add_dist_specs(std::map<std::string, Spec>& m) {
  m["dist_all_reduce"] = identity_spec(
      [](const Tensor&) { return Attrs{{"group", world_id()}, {"op", std::string("avg")}, {"grad_partial", true}}; },
      [] {
        return std::vector<Case>{
            {{bools({3})}, {{"group", world_id()}, {"op", std::string("sum")}, {"grad_partial", false}}},
            {{rn({3})}, {{"group", kNoGroup}, {"op", std::string("sum")}, {"grad_partial", false}}}};
      });
  m["dist_all_gather"] = identity_spec([](const Tensor& t) { return gather_attrs(t, t.dim() - 1); }, [] {
    Attrs two = gather_attrs(rn({3, 4}), 1);
    two.set("sizes", Shape{2, 2});
    Attrs wrong = gather_attrs(rn({3, 4}), 1);
    wrong.set("sizes", Shape{5});
    Attrs dim = gather_attrs(rn({3, 4}), 1);
    dim.set("dim", int64_t(4));
    return std::vector<Case>{{{rn({3, 4})}, two}, {{rn({3, 4})}, wrong}, {{rn({3, 4})}, dim}};
  });
  m["dist_reduce_scatter"] = identity_spec(
      [](const Tensor& t) {
        return Attrs{{"group", world_id()}, {"dim", int64_t(0)}, {"sizes", Shape{t.size(0)}}, {"op", std::string("sum")}};
      },
      [] {
        return std::vector<Case>{
            {{rn({3, 4})}, {{"group", world_id()}, {"dim", int64_t(0)}, {"sizes", Shape{4}}, {"op", std::string("sum")}}},
            {{rn({3, 4})}, {{"group", world_id()}, {"dim", int64_t(0)}, {"sizes", Shape{1, 2}}, {"op", std::string("sum")}}}};
      });
  m["dist_all_to_all"] = identity_spec(
      [](const Tensor& t) { return Attrs{{"group", world_id()}, {"split_dim", int64_t(0)}, {"concat_dim", t.dim() - 1}}; },
      [] {
        return std::vector<Case>{{{rn({3, 4})}, {{"group", world_id()}, {"split_dim", int64_t(2)}, {"concat_dim", int64_t(0)}}}};
      });
  m["dist_broadcast"] = identity_spec([](const Tensor&) { return Attrs{{"group", world_id()}, {"root", int64_t(0)}}; }, [] {
    return std::vector<Case>{{{rn({3})}, {{"group", world_id()}, {"root", int64_t(1)}}}};
  });
  m["dist_copy_to_group"] = identity_spec([](const Tensor&) { return Attrs{{"group", world_id()}}; }, [] {
    return std::vector<Case>{{{rn({3})}, {{"group", kNoGroup}}}};
  });
  m["dist_shard"] = identity_spec([](const Tensor& t) { return Attrs{{"group", world_id()}, {"dim", t.dim() - 1}}; }, [] {
    return std::vector<Case>{{{rn({3})}, {{"group", world_id()}, {"dim", int64_t(1)}}}};
  });
}

}  // namespace sinter::test

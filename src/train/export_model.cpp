// `sinter export`: a checkpoint's forward, prefill and decode graphs, traced over the model with
// its KV caches as state, exported for libsinter_rt (sinter/aot.h).
#include "core/format.h"
#include "sinter/autograd.h"
#include "train/internal.h"

namespace sinter::train {

namespace {
// "seq=1..128" -> {1, 128}.
std::pair<int64_t, int64_t> parse_range(const std::string& spec, int64_t limit) {
  if (spec.empty()) return {1, limit};
  const size_t eq = spec.find('='), dots = spec.find("..");
  SINTER_CHECK(eq != std::string::npos && dots != std::string::npos && dots > eq, "[export] --dynamic takes NAME=MIN..MAX, got '", spec, "'");
  const std::string name = spec.substr(0, eq);
  SINTER_CHECK(name == "seq", "[export] this model has one dynamic dim, seq (the tokens' length), not '", name, "'");
  int64_t lo = 0, hi = 0;
  try {
    lo = std::stoll(spec.substr(eq + 1, dots - eq - 1)), hi = std::stoll(spec.substr(dots + 2));
  } catch (const std::exception&) {
    SINTER_THROW(ValueError, "[export] --dynamic takes NAME=MIN..MAX with whole numbers, got '", spec, "'");
  }
  SINTER_CHECK(lo >= 1 && hi >= lo && hi <= limit, "[export] --dynamic ", spec, ": the range must lie in 1..", limit,
               " (the model's positions)");
  return {lo, hi};
}
}  // namespace

aot::Exported export_model(const ExportOptions& o) {
  auto model = load_model(o.checkpoint);
  model->to(o.dtype);
  return export_model(*model, o);
}

aot::Exported export_model(nn::GPT& model_in, const ExportOptions& o) {
  nn::GPT* model = &model_in;
  NoGradGuard no_grad;
  const bool was_training = model->is_training();
  model->eval();
  model->prepack_for_decode(/*replace=*/true);  // int8 2:4 layers: the layout their decode kernels read
  const int64_t limit = model->config().max_position_embeddings;
  const auto [lo, hi] = parse_range(o.dynamic, limit);
  std::vector<nn::KVCache> caches = model->make_caches(1, limit);
  aot::Options opts;
  opts.isa = o.isa, opts.progress = o.progress;
  for (auto& [name, t] : model->named_parameters()) opts.names[name] = *t;
  for (auto& [name, t] : model->named_buffers()) opts.names[name] = *t;
  for (size_t i = 0; i < caches.size(); ++i) {
    opts.names["cache." + std::to_string(i) + ".k"] = caches[i].k;
    opts.names["cache." + std::to_string(i) + ".v"] = caches[i].v;
  }
  opts.names["cache.pos"] = caches[0].pos;
  nn::GPT& m = *model;
  const Tensor tokens = zeros({1, lo}, DType::i64);
  std::vector<aot::GraphToExport> graphs;
  const aot::Dim seq{.name = "seq", .input = 0, .dim = 1, .min = lo, .max = hi};
  for (const std::string& g : o.graphs) {
    if (g == "forward")
      graphs.push_back({[&m](const std::vector<Tensor>& in) { return std::vector<Tensor>{m.forward(in[0])}; }, {tokens},
                        {.name = "forward", .input_names = {"tokens"}, .output_names = {"logits"}, .dynamic = {seq}}});
    else if (g == "prefill")
      graphs.push_back({[&m, &caches](const std::vector<Tensor>& in) { return std::vector<Tensor>{m.forward(in[0], &caches)}; }, {tokens},
                        {.name = "prefill", .input_names = {"tokens"}, .output_names = {"logits"}, .dynamic = {seq}}});
    else if (g == "decode")
      graphs.push_back({[&m, &caches](const std::vector<Tensor>& in) { return std::vector<Tensor>{m.forward(in[0], &caches)}; },
                        {zeros({1, 1}, DType::i64)},
                        {.name = "decode", .input_names = {"tokens"}, .output_names = {"logits"}, .dynamic = {}}});
    else
      SINTER_THROW(ValueError, "[export] --graph takes forward, prefill or decode, got '", g, "'");
  }
  const aot::Exported r = aot::export_graphs(graphs, opts, o.out_dir);
  model->train(was_training);
  return r;
}

}  // namespace sinter::train

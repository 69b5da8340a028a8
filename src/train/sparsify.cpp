// Prune -> fine-tune -> save: the 2:4 workflow behind `sinter sparsify`.
#include <chrono>
#include <cmath>

#include "sinter/autograd.h"
#include "sinter/dist.h"
#include "sinter/io.h"
#include "sinter/optim.h"
#include "sinter/random.h"
#include "sinter/sparse.h"
#include "train/internal.h"

namespace sinter::train {

using namespace detail;

namespace {

// Fine-tuning with the pattern held: only the kept values train (AdamW, cosine to lr / 10).
void finetune(nn::GPT& model, const data::ByteDataset& data, const SparsifyOptions& o, const ProgressFn& progress) {
  model.train();
  optim::AdamW opt(model.named_parameters(), o.lr, 0.9, 0.95, 1e-8, 0.0);
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t step = 0; step < o.finetune_steps; ++step) {
    opt.set_lr(optim::warmup_cosine(step, 0, o.finetune_steps, o.lr, o.lr * 0.1));
    auto [x, y] = data.batch(true, o.batch, o.seq_len, o.seed ^ 0x2f4, uint64_t(step));
    manual_seed(o.seed ^ (0x9E3779B97F4A7C15ull * uint64_t(step + 1)));
    Tensor loss = lm_loss(model, x, y);
    opt.zero_grad();
    loss.backward();
    optim::clip_grad_norm(model.parameters(), 1.0);
    opt.step();
    const int64_t done = step + 1;
    if (progress && !o.quiet && (done % 10 == 0 || done == o.finetune_steps)) {
      const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double rate = double(done) / std::max(el, 1e-9);
      progress({.step = done, .steps = o.finetune_steps, .loss = loss.item_double(), .rate = rate, .elapsed_s = el,
                .eta_s = double(o.finetune_steps - done) / std::max(rate, 1e-9)});
    }
  }
  model.eval();
}

}  // namespace

SparsifyResult sparsify(const SparsifyOptions& o, const ProgressFn& progress) {
  SINTER_CHECK(o.finetune_steps >= 0 && o.batch > 0 && o.seq_len > 1 && o.val_batches > 0 && o.lr > 0,
               "[sparsify] SparsifyOptions::finetune_steps >= 0; SparsifyOptions::batch, SparsifyOptions::seq_len (> 1), "
               "SparsifyOptions::val_batches and SparsifyOptions::lr positive");
  SINTER_CHECK(o.values == "f32" || o.values == "bf16" || o.values == "i8", "[sparsify] SparsifyOptions::values must be f32, bf16 or i8, got '",
               o.values, "'");
  const data::ByteDataset data = o.data_path.empty() ? data::ByteDataset::fortunes() : data::ByteDataset::from_file(o.data_path);
  data.check_window(o.seq_len);
  check_trains_on_bytes(o.checkpoint, "sparsify");  // its validation and fine-tuning read byte-level data
  auto model = load_model(o.checkpoint);
  SINTER_CHECK(model->config().sparsity.empty(), "[sparsify] ", o.checkpoint, " is already 2:4 sparse");
  SINTER_CHECK(o.seq_len <= model->config().max_position_embeddings, "[sparsify] SparsifyOptions::seq_len ", o.seq_len,
               " exceeds the model's ", model->config().max_position_embeddings, " positions");
  SparsifyResult r;
  auto val = [&] { return evaluate(*model, data, o.batch, o.seq_len, o.val_batches, o.seed); };
  for (auto& l : model->block_linears()) r.dense_bytes += l->weight.numel() * l->weight.element_size();
  r.dense_val = val();
  model->sparsify(DType::f32);  // fine-tuning trains f32 values; bf16 / int8 come after
  r.pruned_val = val();
  if (progress && !o.quiet)
    progress({.event = Progress::Event::pruned, .loss = r.dense_val, .val_loss = r.pruned_val, .layers = int64_t(model->block_linears().size())});
  r.finetuned_val = r.pruned_val;
  if (o.finetune_steps > 0) {
    finetune(*model, data, o, progress);
    r.finetuned_val = val();
  }
  if (o.values != "f32") {  // re-pack the fine-tuned weights with values in the storage dtype
    NoGradGuard g;
    for (auto& l : model->block_linears()) {
      SemiStructuredSparse s = to_sparse_semi_structured(l->sparse.to_dense(), dtype_from_name(o.values));
      l->sparse.values = s.values, l->sparse.meta = s.meta, l->sparse.scales = s.scales;  // the slots the state dict reads
    }
  }
  nn::ModelConfig cfg = model->config();  // the model was fine-tuned with f32 values
  cfg.sparse_values = o.values;
  make_dirs(o.out_dir);
  io::save_safetensors(o.out_dir + "/model.safetensors", model->state_dict(), {{"format", "sinter"}, {"sparsity", "2:4"}});
  io::atomic_write(o.out_dir + "/config.json", cfg.to_json());
  for (auto& l : model->block_linears()) r.sparse_bytes += l->sparse.nbytes();
  r.saved_val = o.values == "f32" ? r.finetuned_val : val();
  return r;
}

}  // namespace sinter::train

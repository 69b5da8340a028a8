// The sinter command line: train, generate, sparsify, info, bench, and `demo` (the library end to
// end in a few lines: tensors, autograd, an MLP fitted by hand-written SGD, a safetensors round trip).
#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sinter/sinter.h>
#include <sinter/cuda.h>
#include <sinter/dist.h>
#include <sinter/train.h>
#include <sstream>
#include <nlohmann/json.hpp>

#include <sinter/bench.h>

#include "flags.h"
#include "progress.h"

using namespace sinter;
using cli::flag, cli::option;

namespace {

// The train and sparsify progress line: step, loss (and validation), rate, elapsed and ETA.
struct ProgressLine {
  bool tty = cli::stdout_is_terminal();
  void operator()(const train::Progress& p) const {
    using E = train::Progress::Event;
    const char* cr = tty ? "\r" : "";
    if (p.event == E::compiled) {
      const Explanation& e = *p.compiled;
      std::printf("compile: the step is %d fused kernels + %d library calls%s (first step %.2f s)\n", e.fused_kernels, e.library_calls,
                  e.breaks ? (", graph break: " + e.break_reasons[0] + "; the step runs in compiled pieces").c_str() : "", p.elapsed_s);
    } else if (p.event == E::skipped) {
      std::printf("%sstep %5lld/%lld  loss %g  gradient norm %g: update skipped (--on-nan skip; %lld in a row)\n", cr, (long long)p.step,
                  (long long)p.steps, p.loss, p.grad_norm, (long long)p.skips_in_a_row);
    } else if (p.event == E::pruned) {
      std::printf("sparsify: %s, %lld Linear layers pruned to 2:4; validation %.4f -> %.4f nats/byte\n", checkpoint.c_str(),
                  (long long)p.layers, p.loss, p.val_loss);
    } else {
      step(p);
    }
    std::fflush(stdout);
  }
  void step(const train::Progress& p) const {
    const bool last = p.step == p.steps, val = !std::isnan(p.val_loss);
    const char* cr = tty ? "\r" : "";
    if (tokens) {
      std::printf("%sstep %5lld/%lld  loss %.4f  %s%.0f tok/s  elapsed %s  ETA %s%s", cr, (long long)p.step, (long long)p.steps, p.loss,
                  val ? ("val " + std::to_string(p.val_loss).substr(0, 6) + "  ").c_str() : "", p.rate,
                  cli::format_duration(p.elapsed_s).c_str(), cli::format_duration(p.eta_s).c_str(), (tty && !val) ? "   " : "\n");
    } else {
      std::printf("%sfine-tune %5lld/%lld  loss %.4f  %.1f steps/s  elapsed %s  ETA %s%s", cr, (long long)p.step, (long long)p.steps, p.loss,
                  p.rate, cli::format_duration(p.elapsed_s).c_str(), cli::format_duration(p.eta_s).c_str(), (tty && !last) ? "   " : "\n");
    }
  }
  bool tokens = true;      // training (tokens/s) or fine-tuning (steps/s)
  std::string checkpoint;  // sparsify: the dense checkpoint
};

// What a training run is, as it starts.
void print_run(const train::Trainer& t, const train::Options& o) {
  const train::RunInfo& i = t.info();
  if (i.removed_temporaries > 0)
    std::printf("train: removed %d temporary file%s left in %s by an interrupted save\n", i.removed_temporaries,
                i.removed_temporaries == 1 ? "" : "s", o.out_dir.c_str());
  if (!i.mesh.empty())
    std::printf("train: %lld ranks as %s: tensor parallel over tp%s, FSDP over dp, %lld sequences per dp rank\n", (long long)(o.tp * o.dp),
                i.mesh.c_str(), o.sequence_parallel ? " (sequence parallel)" : "", (long long)(o.batch / o.dp));
  const std::string numbers = std::string(o.dtype == "bf16" ? "bf16 autocast (f32 master weights)" : "f32") +
                              (o.device == "cpu" ? "" : " on " + o.device);
  std::printf("train: %s model, %.2fM parameters, %s, data %s (%lld train / %lld val bytes), %lld steps of %lldx%lld tokens%s%s\n",
              i.model_type.c_str(), double(i.parameters) / 1e6, numbers.c_str(),
              i.data_name.c_str(), (long long)i.train_bytes, (long long)i.val_bytes, (long long)o.steps, (long long)o.batch,
              (long long)o.seq_len, (o.grad_accum > 1 ? " in " + std::to_string(o.grad_accum) + " micro-batches" : std::string()).c_str(),
              i.resumed_at >= 0 ? (" (resuming at step " + std::to_string(i.resumed_at) + ")").c_str() : "");
  std::fflush(stdout);
}

int run_demo(int steps, int hidden, uint64_t seed, const std::string& out_dir) {
  manual_seed(seed);
  // Fit y = sin(3x) on [-1, 1] with a 2-layer tanh MLP.
  const int64_t n = 256;
  Tensor x = linspace(-1, 1, n).reshape({n, 1});
  Tensor y = sin(x * 3.0);
  Tensor w1 = (randn({hidden, 1}) * 1.0).requires_grad_(), b1 = zeros({hidden}).requires_grad_();
  Tensor w2 = (randn({1, hidden}) * (1.0 / std::sqrt(double(hidden)))).requires_grad_(), b2 = zeros({1}).requires_grad_();
  std::vector<Tensor> params{w1, b1, w2, b2};
  const double lr = 0.3;
  auto t0 = std::chrono::steady_clock::now();
  double loss_v = 0;
  std::printf("demo: fitting sin(3x) with a %d-unit MLP, %d steps of SGD (lr %.2f)\n", hidden, steps, lr);
  for (int step = 1; step <= steps; ++step) {
    Tensor pred = linear(tanh(linear(x, w1, b1)), w2, b2);
    Tensor loss = mean((pred - y) * (pred - y));
    loss.backward();
    {
      NoGradGuard g;
      for (Tensor& p : params) {
        p.add_(p.grad(), -lr);
        p.set_grad({});
      }
    }
    loss_v = loss.item<float>();
    if (step % 100 == 0 || step == steps) {
      const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double rate = step / el;
      std::printf("\rstep %5d/%d  loss %.5f  %.0f steps/s  ETA %.1fs   ", step, steps, loss_v, rate, (steps - step) / rate);
      std::fflush(stdout);
    }
  }
  std::printf("\n");
  std::filesystem::create_directories(out_dir);
  const std::string path = out_dir + "/demo_mlp.safetensors";
  io::save_safetensors(path, {{"w1", w1}, {"b1", b1}, {"w2", w2}, {"b2", b2}}, {{"task", "sin(3x) regression"}});
  auto loaded = io::load_safetensors(path);
  Tensor pred = linear(tanh(linear(x, loaded.tensors.at("w1"), loaded.tensors.at("b1"))), loaded.tensors.at("w2"),
                       loaded.tensors.at("b2"));
  const double reloaded = mean((pred - y) * (pred - y)).item<float>();
  std::printf("saved %s (%zu tensors); reloaded model loss %.5f\n", path.c_str(), loaded.tensors.size(), reloaded);
  std::printf("x = 0.5: model %.4f, sin(1.5) = %.4f\n",
              linear(tanh(linear(full({1, 1}, 0.5), w1, b1)), w2, b2).item<float>(), std::sin(1.5));
  return loss_v < 0.01 ? 0 : 1;
}

int run_info(const std::string& dir) {
  auto model = train::load_model(dir);
  const auto& c = model->config();
  std::printf("checkpoint %s\n", dir.c_str());
  std::printf("config: %s", c.to_json().c_str());
  std::printf("parameters: %lld (%.2fM)\n\n", (long long)model->num_parameters(), double(model->num_parameters()) / 1e6);
  std::printf("%-40s %-16s %-6s\n", "tensor", "shape", "dtype");
  for (auto& [name, t] : model->state_dict()) {
    std::ostringstream shape;
    shape << t.shape();
    std::printf("%-40s %-16s %-6s\n", name.c_str(), shape.str().c_str(), dtype_name(t.dtype()));
  }
  return 0;
}

// Text (or with --ids, token ids) on stdout, statistics on stderr; --format json puts both in one
// JSON object on stdout.
struct GenerateOut {
  std::string format = "text";  // or "json"
  std::string ids;              // "1,2,3": the prompt as token ids, and ids printed instead of bytes
};

// `sinter export`: traces with a progress line (sizes per second, ETA), then one summary line.
int run_export(train::ExportOptions o, const std::string& dtype) {
  o.dtype = dtype == "bf16" ? DType::bf16 : DType::f32;
  const auto t0 = std::chrono::steady_clock::now();
  auto stage_start = t0;
  std::string stage;
  o.progress = [&](const std::string& what, int64_t done, int64_t total) {
    const auto now = std::chrono::steady_clock::now();
    if (what != stage) stage = what, stage_start = now;
    const double s = std::chrono::duration<double>(now - stage_start).count();
    const double rate = done > 0 && s > 0 ? double(done) / s : 0;
    if (what == "compile") std::fprintf(stderr, "\r\033[K[export] %s", done ? "compiled\n" : "compiling model.so ...");
    else std::fprintf(stderr, "\r\033[K[export] %s: size %lld/%lld (%.0f/s, ETA %.0f s)", what.c_str(), (long long)done + 1, (long long)total,
                      rate, rate > 0 ? double(total - done) / rate : 0.0);
  };
  const aot::Exported r = train::export_model(o);
  std::printf("exported %s to %s in %.1f s: model.so %.2f MB, weights.safetensors %.2f MB (%lld weights, %lld state), %lld sizes traced\n",
              o.checkpoint.c_str(), r.dir.c_str(), r.seconds, double(r.model_so_bytes) / 1e6, double(r.weights_bytes) / 1e6,
              (long long)r.weights, (long long)r.state, (long long)r.sizes_traced);
  return 0;
}

int run_generate(const std::string& dir, const std::string& prompt, int64_t max_new, const train::Sampling& s,
                 bool no_cache, DType dtype, bool compiled, const GenerateOut& o, Device device) {
  if (device != Device::cpu()) cuda::require_device(device.index);  // before reading the checkpoint
  auto model = train::load_model(dir);
  const int64_t vocab = model->config().vocab_size;
  const bool by_ids = !o.ids.empty(), json_out = o.format == "json";
  // Text goes through the checkpoint's tokenizer.json (a Hugging Face byte-level BPE) when it has
  // one, else through bytes.
  const std::string tok_path = dir + "/tokenizer.json";
  std::error_code ec;
  const bool has_tok = !by_ids && std::filesystem::exists(tok_path, ec);
  const text::Tokenizer tok = has_tok ? text::Tokenizer::from_file(tok_path) : text::Tokenizer::bytes();
  SINTER_CHECK(by_ids || has_tok || vocab == 256, "[generate] the model in ", dir, " has a vocabulary of ", vocab,
               " tokens, not bytes, and the folder has no tokenizer.json; drive it with --ids");
  SINTER_CHECK(tok.vocab_size() <= vocab, "[generate] ", tok_path, " has ", tok.vocab_size(), " tokens, more than the model's ", vocab);
  Tensor prompt_ids = tensor<int64_t>(tok.encode(prompt));
  // A token's bytes; an id of the model's padded vocabulary that the tokenizer lacks prints as <id>.
  const auto text_of = [&](int64_t id) { return id < tok.vocab_size() ? tok.token_bytes(id) : "<" + std::to_string(id) + ">"; };
  if (by_ids) {
    std::vector<int64_t> ids;
    std::stringstream ss(o.ids);
    for (std::string item; std::getline(ss, item, ',');) {
      size_t used = 0;
      int64_t v = -1;
      try {
        v = std::stoll(item, &used);
      } catch (const std::exception&) {
      }
      SINTER_CHECK(used == item.size() && v >= 0 && v < vocab, "[generate] --ids: '", item, "' is not a token id of this model (0..",
                   vocab - 1, ")");
      ids.push_back(v);
    }
    SINTER_CHECK(!ids.empty(), "[generate] --ids needs at least one token id");
    prompt_ids = tensor<int64_t>(ids);
  }
  model->to(dtype);
  model->to(device);
  // int8 2:4 layers: their one-token steps read the prepacked layout, which replaces values + meta
  // (generation neither trains nor saves)
  const int64_t packed = model->prepack_for_decode(/*replace=*/true);
  if (!json_out) {
    if (by_ids) std::printf("%s", o.ids.c_str());
    else std::printf("%s", prompt.c_str());
    std::fflush(stdout);
  }
  double rate = 0;
  std::string compile_note, decode;
  const Tensor all = train::generate(*model, prompt_ids, max_new, s, !no_cache, &rate, [&](int64_t id) {
    if (json_out) return;
    if (by_ids) std::printf(",%lld", (long long)id);
    else {
      const std::string b = text_of(id);
      std::fwrite(b.data(), 1, b.size(), stdout);
    }
    std::fflush(stdout);
  }, compiled, [&](CompiledFunction& f) {
    const Explanation e = f.explain({zeros({1, 1}, DType::i64)});
    compile_note = ", compiled decode step: " + std::to_string(e.graphs) + " graph, " + std::to_string(e.fused_kernels) +
                   " fused kernels + " + std::to_string(e.library_calls) + " library calls";
  }, &decode);
  if (json_out) {
    const std::vector<int64_t> v = all.to_vector<int64_t>();
    const std::vector<int64_t> new_ids(v.begin() + prompt_ids.numel(), v.end());
    nlohmann::json j{{"prompt_ids", prompt_ids.to_vector<int64_t>()}, {"ids", new_ids}, {"tokens_per_s", rate}};
    if (!by_ids || vocab == 256) {  // --ids on a byte model: bytes still
      std::string text;
      for (int64_t id : new_ids) text += text_of(id);
      j["text"] = text;
    }
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());  // bytes that are not UTF-8: U+FFFD
  } else {
    std::printf("\n");
  }
  char extra[96] = "";
  if (packed) std::snprintf(extra, sizeof extra, ", 2:4 weights prepacked in place (%+.1f MB)", double(packed) / 1e6);
  const std::string graph_note = decode.find("CUDA graph") != std::string::npos ? ", decode steps: " + decode : "";
  std::fprintf(stderr, "[%lld tokens, %.1f tokens/s%s%s%s%s]\n", (long long)max_new, rate, no_cache ? ", no KV cache" : "", extra,
               compile_note.c_str(), graph_note.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"sinter: train and serve language models from C++"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("sinter ") + version());
  int steps = 2000, hidden = 32, threads = 0;
  uint64_t seed = 0;
  std::string out = "out";
  auto* demo = app.add_subcommand("demo", "fit a small MLP with autograd and round-trip it through safetensors");
  demo->add_option("--steps", steps, "SGD steps")->check(CLI::Range(1, 10000000));
  demo->add_option("--hidden", hidden, "hidden units")->check(CLI::Range(1, 1 << 20));
  demo->add_option("--seed", seed, "random seed");
  demo->add_option("--out", out, "output folder");

  train::Options to;
  auto* tr = app.add_subcommand("train", "train a byte-level language model (default: tiny GPT on the fortunes corpus)");
  option(tr, "--preset", "Options::preset", to.preset, "model preset: tiny, small, llama-tiny, gpt2-124m")
      ->check(CLI::IsMember({"tiny", "small", "llama-tiny", "gpt2-124m"}));
  option(tr, "--config", "Options::config_path", to.config_path, "config.json with Hugging Face keys (instead of --preset)");
  option(tr, "--init", "Options::init_dir", to.init_dir, "start from a checkpoint's weights: Sinter's, or a Hugging Face save_pretrained folder");
  option(tr, "--data", "Options::data_path", to.data_path, "text file to train on (default: Debian's fortunes)");
  option(tr, "--out", "Options::out_dir", to.out_dir, "output folder for the checkpoint, log.csv and loss.svg");
  option(tr, "--steps", "Options::steps", to.steps, "total optimizer steps")->check(CLI::Range(int64_t(1), int64_t(1) << 40));
  option(tr, "--batch", "Options::batch", to.batch, "sequences per step")->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  option(tr, "--grad-accum", "Options::grad_accum", to.grad_accum, "run each step's batch as N micro-batches (same update, less activation memory)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  flag(tr, "--checkpoint-activations", "Options::checkpoint_activations", to.checkpoint_activations,
               "recompute each block's activations in the backward instead of keeping them (less memory, ~1 more forward)");
  option(tr, "--seq-len", "Options::seq_len", to.seq_len, "tokens per sequence")->check(CLI::Range(int64_t(2), int64_t(1) << 20));
  option(tr, "--lr", "Options::lr", to.lr, "peak learning rate")->check(CLI::Range(1e-9, 10.0));
  option(tr, "--min-lr", "Options::min_lr", to.min_lr, "final learning rate of the cosine schedule")->check(CLI::Range(0.0, 10.0));
  option(tr, "--warmup", "Options::warmup", to.warmup, "linear warmup steps")->check(CLI::Range(int64_t(0), int64_t(1) << 40));
  option(tr, "--weight-decay", "Options::weight_decay", to.weight_decay, "AdamW weight decay")->check(CLI::Range(0.0, 10.0));
  option(tr, "--seed", "Options::seed", to.seed, "seed for initialization and batches");
  option(tr, "--val-every", "Options::val_every", to.val_every, "validate every N steps")->check(CLI::Range(int64_t(1), int64_t(1) << 40));
  option(tr, "--save-every", "Options::save_every", to.save_every, "checkpoint every N steps")->check(CLI::Range(int64_t(1), int64_t(1) << 40));
  option(tr, "--stop-after", "Options::stop_after", to.stop_after, "stop with a checkpoint after this step (resume later)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 40));
  option(tr, "--dtype", "Options::dtype", to.dtype, "f32, or bf16: linear layers in bf16 with f32 master weights and optimizer")
      ->check(CLI::IsMember({"f32", "bf16"}));
  option(tr, "--device", "Options::device", to.device, "cpu, cuda or cuda:N: where the model, optimizer and batches live");
  flag(tr, "--resume", "Options::resume", to.resume, "continue from the checkpoint in --out (the data, batch, seq-len and model must match)");
  flag(tr, "--overwrite", "Options::overwrite", to.overwrite, "replace the checkpoint in --out (without it, train refuses a folder that holds one)");
  flag(tr, "--allow-changes", "Options::allow_changes", to.allow_changes, "with --resume: continue on other data, batch or seq-len (fine-tuning)");
  option(tr, "--keep", "Options::keep", to.keep, "checkpoint steps kept in --out (each save is committed whole)")->check(CLI::Range(1, 1 << 20));
  tr->add_option("--threads", threads, "CPU threads (default: all cores)")->check(CLI::Range(0, 4096));
  int64_t tp = 1, dp = 0;
  cli::flag_names()["Options::tp"] = "--tp", cli::flag_names()["Options::dp"] = "--dp";
  tr->add_option("--tp", tp, "tensor-parallel ranks (under mpirun)")->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  tr->add_option("--dp", dp, "FSDP ranks (under mpirun; default: the ranks left after --tp)")->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  flag(tr, "--sp", "Options::sequence_parallel", to.sequence_parallel, "sequence parallelism with --tp: norms and activations between blocks split along the sequence");
  flag(tr, "--compile", "Options::compile", to.compile, "run each step as one compiled graph (sinter::compile; one process)");
  option(tr, "--on-nan", "Options::on_nan", to.on_nan, "a step with a NaN or infinite loss or gradient: stop (keep the last checkpoint) or skip its update")
      ->check(CLI::IsMember({"stop", "skip"}));
  option(tr, "--max-skips", "Options::max_skips", to.max_skips, "with --on-nan skip: stop after this many skipped steps in a row")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 40));

  std::string dir = "out/tiny", prompt = "The ";
  int64_t max_new = 200;
  train::Sampling sampling;
  bool no_cache = false;
  auto* gen = app.add_subcommand("generate", "sample text from a checkpoint");
  gen->add_option("--checkpoint", dir, "checkpoint folder");
  gen->add_option("--prompt", prompt, "text to continue");
  gen->add_option("--max-new-tokens", max_new, "tokens to generate")->check(CLI::Range(int64_t(0), int64_t(1) << 30));
  gen->add_option("--temperature", sampling.temperature, "0 for greedy")->check(CLI::Range(0.0, 100.0));
  gen->add_option("--top-k", sampling.top_k, "keep the k most likely tokens (0: all)")->check(CLI::Range(int64_t(0), int64_t(1) << 30));
  gen->add_option("--top-p", sampling.top_p, "nucleus sampling mass")->check(CLI::Range(1e-6, 1.0));
  gen->add_option("--seed", sampling.seed, "sampling seed");
  std::string gen_dtype = "f32";
  gen->add_option("--dtype", gen_dtype, "f32, or bf16: the model's weights and activations in bf16")->check(CLI::IsMember({"f32", "bf16"}));
  std::string gen_device = "cpu";
  gen->add_option("--device", gen_device, "cpu, cuda or cuda:N: where the model and its KV cache live");
  gen->add_flag("--no-cache", no_cache, "recompute the whole context each step (slow; for comparison)");
  bool gen_compile = false;
  gen->add_flag("--compile", gen_compile, "run the one-token decode step as one compiled graph (sinter::compile)");
  gen->add_option("--threads", threads, "CPU threads (default: all cores)")->check(CLI::Range(0, 4096));
  GenerateOut gen_out;
  gen->add_option("--format", gen_out.format, "text (stdout: the text; stderr: statistics), or json: ids, text and speed")
      ->check(CLI::IsMember({"text", "json"}));
  gen->add_option("--ids", gen_out.ids, "the prompt as comma-separated token ids (instead of --prompt); prints ids, not bytes");

  train::SparsifyOptions so;
  auto* sp = app.add_subcommand("sparsify", "prune a checkpoint's Linear layers to 2:4, fine-tune with the pattern held, save it sparse");
  sp->add_option("checkpoint", so.checkpoint, "a trained (dense) checkpoint folder")->required();
  option(sp, "--out", "SparsifyOptions::out_dir", so.out_dir, "folder for the sparse checkpoint");
  option(sp, "--finetune-steps", "SparsifyOptions::finetune_steps", so.finetune_steps, "fine-tuning steps after pruning (0: none)")->check(CLI::Range(int64_t(0), int64_t(1) << 30));
  option(sp, "--values", "SparsifyOptions::values", so.values, "stored values: f32, bf16 or i8 (per-row scales)")->check(CLI::IsMember({"f32", "bf16", "i8"}));
  option(sp, "--lr", "SparsifyOptions::lr", so.lr, "fine-tuning learning rate")->check(CLI::Range(1e-9, 10.0));
  option(sp, "--data", "SparsifyOptions::data_path", so.data_path, "text file (default: the fortunes corpus)");
  sp->add_option("--threads", threads, "CPU threads (default: all cores)")->check(CLI::Range(0, 4096));

  auto* info = app.add_subcommand("info", "show a checkpoint's config, parameter count and tensors");
  info->add_option("checkpoint", dir, "checkpoint folder (Sinter's or a Hugging Face one)")->required();
  std::string export_dir;
  auto* ex = app.add_subcommand("export-hf", "write a checkpoint as a Hugging Face save_pretrained directory");
  ex->add_option("checkpoint", dir, "checkpoint folder")->required();
  ex->add_option("--out", export_dir, "output folder (config.json + model.safetensors)")->required();

  train::ExportOptions xo;
  std::string x_dtype = "f32";
  auto* xp = app.add_subcommand("export", "export a checkpoint for the runtime libsinter_rt: model.so, weights.safetensors, manifest.json");
  xp->add_option("checkpoint", xo.checkpoint, "checkpoint folder (Sinter's or a Hugging Face one)")->required();
  option(xp, "--out", "ExportOptions::out_dir", xo.out_dir, "output folder")->required();
  option(xp, "--graph", "ExportOptions::graphs", xo.graphs, "forward, prefill, decode (repeat the flag; default: all three)")
      ->check(CLI::IsMember({"forward", "prefill", "decode"}));
  option(xp, "--dynamic", "ExportOptions::dynamic", xo.dynamic, "seq=MIN..MAX: the token lengths forward and prefill take (default: 1..the model's positions)");
  xp->add_option("--dtype", x_dtype, "f32, or bf16: weights and activations in bf16")->check(CLI::IsMember({"f32", "bf16"}));
  option(xp, "--isa", "ExportOptions::isa", xo.isa, "the generated code's ISA level")->check(CLI::IsMember({"x86-64-v3", "x86-64-v4"}));

  bench::Options bo;
  auto* be = app.add_subcommand("bench", "benchmark a suite against its peers (raw oneDNN, memcpy, PyTorch when installed)");
  std::vector<std::string> suite_names;
  for (auto& [name, what] : bench::suite_list()) suite_names.push_back(name);
  be->add_option("suite", bo.suite, "ops, linear, train, generate, attention, sparse, compile, sweep or cuda")->required()->check(CLI::IsMember(suite_names));
  be->add_flag("--quick", bo.quick, "fewer cases and repetitions");
  be->add_option("--json", bo.json, "write the rows as JSON: case, ours_ms, peer, peer_ms, ratio (= peer / ours)");
  be->add_option("--update", bo.update, "rewrite this suite's section of a markdown file (BENCHMARKS.md)");
  be->add_option("--svg", bo.svg, "write a chart of the ratios");
  be->add_option("--python", bo.python, "Python interpreter that has PyTorch (the peer)");
  be->add_option("--torch-script", bo.torch_script, "the PyTorch side (default: bench/torch_peer.py of the source tree)");
  be->add_flag("--no-torch", bo.no_torch, "skip the PyTorch peer");
  be->add_option("--checkpoint", bo.checkpoint, "generate: a trained checkpoint instead of a fresh tiny model");
  be->add_option("--threads", threads, "CPU threads (default: all cores)")->check(CLI::Range(0, 4096));

  CLI11_PARSE(app, argc, argv);
  // An error on one rank of an mpirun job ends every rank at once (the others would wait in their
  // next collective until its deadline).
  auto fail = [](const char* library_message) {
    const std::string what = cli::in_flags(library_message);
    if (dist::is_mpi() && dist::world_size() > 1) dist::abort_job("error on rank " + std::to_string(dist::rank()) + ": " + what, 2);
    std::fprintf(stderr, "error: %s\n", what.c_str());
    return 2;
  };
  // The library never prints: its warnings, and the op profile (SINTER_PROFILE=1) at exit, are ours.
  set_warning_handler([](const std::string& w) { std::fprintf(stderr, "%s\n", cli::in_flags(w).c_str()); });
  if (op_profiling()) std::atexit([] { std::fprintf(stderr, "%s", op_profile_table().c_str()); });
  // The crash tests' full disk: SINTER_FAIL_FILE_OP=N fails the Nth file operation of a save.
  if (const char* n = std::getenv("SINTER_FAIL_FILE_OP")) io::fail_file_operation_for_testing(std::atoll(n));
  try {
    dist::init();  // before threads: ranks sharing a machine split its cores
    if (threads > 0) set_num_threads(threads);
    if (*demo) return run_demo(steps, hidden, seed, out);
    if (*tr) {
      to.tp = tp;
      to.dp = dp > 0 ? dp : std::max<int64_t>(1, dist::world_size() / tp);
      SINTER_CHECK_T(DistError, to.tp * to.dp > 1 || dist::world_size() == 1, "[train] the job has ", dist::world_size(),
                     " ranks, but --tp 1 x --dp 1 would train the same model on every rank into one --out; choose --tp and --dp",
                     " whose product is ", dist::world_size());
      train::Trainer trainer(to, ProgressLine{});
      if (dist::rank() == 0) print_run(trainer, to);
      const train::Result r = trainer.run();
      if (dist::rank() != 0) return 0;
      std::printf("done: step %lld, train loss %.4f, validation loss %.4f nats/byte; checkpoint in %s\n",
                  (long long)r.step, r.train_loss, r.val_loss, to.out_dir.c_str());
      return 0;
    }
    if (*gen)
      return run_generate(dir, prompt, max_new, sampling, no_cache, gen_dtype == "bf16" ? DType::bf16 : DType::f32, gen_compile, gen_out,
                          Device::parse(gen_device));
    if (*ex) {
      auto model = train::load_model(dir);
      model->save_pretrained(export_dir);
      std::printf("wrote %s/config.json and %s/model.safetensors (Hugging Face %s layout)\n", export_dir.c_str(), export_dir.c_str(),
                  model->config().llama() ? "LlamaForCausalLM" : "GPT2LMHeadModel");
      return 0;
    }
    if (*xp) return run_export(xo, x_dtype);
    if (*info) return run_info(dir);
    if (*sp) {
      const auto r = train::sparsify(so, ProgressLine{.tokens = false, .checkpoint = so.checkpoint});
      std::printf("validation loss (nats/byte): dense %.4f | pruned 2:4 %.4f | fine-tuned %.4f | saved (%s values) %.4f\n"
                  "Linear weights: dense %.2f MB -> 2:4 %.2f MB (%.0f%%); sparse checkpoint in %s\n",
                  r.dense_val, r.pruned_val, r.finetuned_val, so.values.c_str(), r.saved_val, r.dense_bytes / 1e6,
                  r.sparse_bytes / 1e6, 100.0 * double(r.sparse_bytes) / double(std::max<int64_t>(r.dense_bytes, 1)), so.out_dir.c_str());
      return 0;
    }
    if (*be) {
      for (int i = 0; i < argc; ++i) bo.command_line += (i ? " " : "") + std::string(i ? argv[i] : "sinter");
      return bench::run(bo);
    }
  } catch (const DeviceError& e) {  // the machine lacks the device asked for: 1, as against 2 for bad input
    fail(e.what());
    return 1;
  } catch (const sinter::Error& e) {
    return fail(e.what());
  } catch (const std::exception& e) {  // e.g. a filesystem error from the standard library
    return fail(e.what());
  }
  return 0;
}

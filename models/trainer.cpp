#include "models/trainer.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string_view>

#include <nlohmann/json.hpp>

#include "inspect/anomaly.hpp"
#include "ops/products/blas_info.hpp"
#include "ops/products/products.hpp"
#include "models/run_memory.hpp"
#include "engine/parallel.hpp"
#include "engine/rng.hpp"
#include "models/checkpoint.hpp"
#include "models/data.hpp"
#include "models/files.hpp"
#include "models/optim.hpp"
#include "models/plot.hpp"
#include "models/sharpness.hpp"
#include "ops/ops.hpp"

namespace tapegrad {

namespace {

using json = nlohmann::json;

json model_json(const GPTConfig& m) {
  return {{"vocab_size", m.vocab_size},
          {"block_size", m.block_size},
          {"n_layer", m.n_layer},
          {"n_head", m.n_head},
          {"n_embd", m.n_embd},
          {"dropout", m.dropout},
          {"bias", m.bias},
          {"attention", m.attention},
          {"gelu", gelu_form_name(m.gelu)}};
}

// The configuration in a checkpoint's "tapegrad.model"; errors name the checkpoint.
GPTConfig model_from_json(const std::string& text, const std::string& path) {
  GPTConfig m;
  // An integer field: a JSON integer within int64 (a float such as 1e20 would not convert).
  auto integer = [&](const json& j, const char* key) {
    const json& v = j.at(key);
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX}))
      fail("checkpoint {}: 'tapegrad.model' has {} = {}, not an integer", path, key, v.dump().substr(0, 40));
    return v.get<int64_t>();
  };
  try {
    const json j = json::parse(text);
    m.vocab_size = integer(j, "vocab_size");
    m.block_size = integer(j, "block_size");
    m.n_layer = integer(j, "n_layer");
    m.n_head = integer(j, "n_head");
    m.n_embd = integer(j, "n_embd");
    m.dropout = j.at("dropout").get<double>();
    m.bias = j.at("bias").get<bool>();
    m.attention = j.at("attention").get<std::string>();
    // A checkpoint written before the exact GELU was the default has no "gelu": it was trained with the tanh form.
    const std::string gelu = j.contains("gelu") ? j.at("gelu").get<std::string>() : "tanh";
    const std::optional<GeluForm> form = gelu_form_named(gelu);
    if (!form) fail("checkpoint {}: 'tapegrad.model' has gelu = '{}', expected exact or tanh", path, gelu);
    m.gelu = *form;
    m.validate();
  } catch (const json::exception& e) {
    fail("checkpoint {}: 'tapegrad.model' is not a model configuration ({})", path, e.what());
  } catch (const Error& e) {
    if (std::string_view(e.what()).starts_with("checkpoint ")) throw;
    fail("checkpoint {}: {}", path, e.what());
  }
  return m;
}

std::string utf8_of(const std::vector<char32_t>& vocab) {
  std::string s;
  for (char32_t c : vocab) {
    if (c < 0x80) s += static_cast<char>(c);
    else if (c < 0x800) s += {static_cast<char>(0xC0 | (c >> 6)), static_cast<char>(0x80 | (c & 0x3F))};
    else if (c < 0x10000)
      s += {static_cast<char>(0xE0 | (c >> 12)), static_cast<char>(0x80 | ((c >> 6) & 0x3F)),
            static_cast<char>(0x80 | (c & 0x3F))};
    else
      s += {static_cast<char>(0xF0 | (c >> 18)), static_cast<char>(0x80 | ((c >> 12) & 0x3F)),
            static_cast<char>(0x80 | ((c >> 6) & 0x3F)), static_cast<char>(0x80 | (c & 0x3F))};
  }
  return s;
}

// What a run's checkpoint holds besides what TrainingRun keeps (the model under nanoGPT's names, AdamW's moments,
// the step, evaluations, log and the batch generator's state): the configuration and the vocabulary.
void add_run_metadata(Checkpoint& ck, const GPT& model, const TrainConfig& cfg, const TextData& data) {
  ck.metadata["format"] = "tapegrad-gpt";
  ck.metadata["tapegrad.model"] = model_json(model.config()).dump();
  ck.metadata["tapegrad.train"] = json{
      {"seed", cfg.seed},
      {"batch_size", cfg.batch_size},
      {"max_iters", cfg.loop.max_steps},
      {"precision",
       precision_name(cfg.precision)}}.dump();
  ck.metadata["tapegrad.vocab"] = utf8_of(data.vocab);
  ck.metadata["tapegrad.data"] =
      json{{"bytes", data.text_bytes}, {"checksum", fmt::format("{:016x}", data.text_checksum)}}.dump();
}

// Refuses to resume from the checkpoint of another model, or of the same model on other data: every option that
// changes the function being trained must be the checkpoint's. (The schedule, the number of steps, the evaluation and
// logging options may change: they decide how the run goes on, not what it trains.)
void refuse_another_model(const Checkpoint& ck, const GPTConfig& m, const TextData& data, const std::string& path) {
  const GPTConfig saved = model_from_json(training_metadata(ck, "tapegrad.model", path), path);
  checkpoint_vocabulary(ck, saved.vocab_size, path);  // the vocabulary the model was made for, or refused
  if (saved.attention != m.attention || saved.n_embd != m.n_embd || saved.n_layer != m.n_layer ||
      saved.n_head != m.n_head || saved.block_size != m.block_size || saved.vocab_size != m.vocab_size)
    fail(
        "--resume: {} was trained with another model ({} attention, {} layers, {} heads, {} wide, context {}, vocab "
        "{})",
        path, saved.attention, saved.n_layer, saved.n_head, saved.n_embd, saved.block_size, saved.vocab_size);
  if (saved.gelu != m.gelu)
    fail("--resume: {} was trained with --gelu {}, this run asks for --gelu {}", path, gelu_form_name(saved.gelu),
         gelu_form_name(m.gelu));
  if (saved.dropout != m.dropout)
    fail("--resume: {} was trained with --dropout {}, this run asks for --dropout {}", path, saved.dropout, m.dropout);
  if (saved.bias != m.bias)
    fail("--resume: {} was trained {}, this run asks for {}", path,
         saved.bias ? "with biases (--bias)" : "without biases (--no-bias)", m.bias ? "--bias" : "--no-bias");
  if (training_metadata(ck, "tapegrad.vocab", path) != utf8_of(data.vocab))
    fail("--resume: {} was trained on a text with another vocabulary of {} symbols; --data gives another text", path,
         saved.vocab_size);
  if (auto it = ck.metadata.find("tapegrad.data"); it != ck.metadata.end()) {  // older checkpoints do not say
    const json d = json::parse(it->second, nullptr, false);
    const std::string checksum = fmt::format("{:016x}", data.text_checksum);
    if (d.is_discarded() || !d.contains("bytes") || !d.contains("checksum") || !d["bytes"].is_number_unsigned() ||
        !d["checksum"].is_string())
      fail("--resume: {}: its 'tapegrad.data' metadata cannot be read", path);
    if (d["bytes"].get<uint64_t>() != data.text_bytes || d["checksum"].get<std::string>() != checksum)
      fail("--resume: {} was trained on another text ({} bytes, checksum {}); --data gives {} bytes, checksum {}", path,
           d["bytes"].get<uint64_t>(), d["checksum"].get<std::string>(), data.text_bytes, checksum);
  }
}

// Refuses to resume with another seed, batch size or precision than the checkpoint's unless cfg.allow_change: the
// run would go on drawing other batches, or computing its products otherwise, than the run it continues. A key the
// checkpoint does not record (an older checkpoint) is not compared.
void refuse_another_training(const Checkpoint& ck, const TrainConfig& cfg, const std::string& path) {
  const json t = json::parse(training_metadata(ck, "tapegrad.train", path), nullptr, false);
  if (t.is_discarded() || !t.is_object()) fail("--resume: {}: its 'tapegrad.train' metadata cannot be read", path);
  auto compare = [&](const char* key, std::string_view option, bool integer, const std::string& asked) {
    if (!t.contains(key)) return;
    const json& v = t[key];
    if (integer ? !v.is_number_integer() : !v.is_string())
      fail("--resume: {}: its 'tapegrad.train' metadata has {} = {}, not {}", path, key, v.dump().substr(0, 40),
           integer ? "an integer" : "a string");
    const std::string saved = integer ? v.dump() : v.get<std::string>();
    if (saved != asked && !cfg.allow_change)
      fail(
          "--resume: {} was trained with {} {}, this run asks for {} {}; --allow-change lets the seed, the batch "
          "size and the precision change on resume",
          path, option, saved, option, asked);
  };
  compare("seed", "--seed", true, std::to_string(cfg.seed));
  compare("batch_size", "--batch-size", true, std::to_string(cfg.batch_size));
  compare("precision", "--precision", false, precision_name(cfg.precision));
}

// The run's outputs are not its inputs: each file the run writes (kRunFiles, symbolic links followed) must be neither
// the text, a config file, nor (the checkpoint excepted, which a resumed run replaces by design) the checkpoint the
// run continues from; and none may lie in another run's directory. Checked before anything is written.
void refuse_outputs_that_are_inputs(const TrainConfig& cfg, const std::string& data_path) {
  const std::string& dir = cfg.loop.dir;
  const std::string checkpoint = dir + "/" + kRunFiles[0];
  std::vector<std::pair<std::string, std::string>> inputs{{"--data", data_path}};
  for (const std::string& config : cfg.config_files) inputs.emplace_back("--config", config);
  for (const char* file : kRunFiles) {
    const std::string output = dir + "/" + file;
    for (const auto& [option, input] : inputs)
      if (same_regular_file(output, input))
        fail(
            "the run's {} '{}' is the file {} reads ('{}'): the run would overwrite its own input; give another {}, "
            "or another --out or --name",
            file, output, option, input, option);
    if (cfg.loop.resume && output != checkpoint && same_regular_file(output, checkpoint))
      fail(
          "the run's {} '{}' is its checkpoint '{}', which --resume reads: the run would overwrite it; remove the "
          "link",
          file, output, checkpoint);
    refuse_replacing_run_files(output, fmt::format("the run's {}", file), dir);
  }
}

}  // namespace

void validate_run_name(const std::string& name) {
  if (name == "." || name == ".." || name.find('/') != std::string::npos)
    fail("--name '{}': a run's name is one directory name below --out (no '/', not '.' or '..')", name);
}

TextData checkpoint_vocabulary(const Checkpoint& ck, int64_t vocab_size, const std::string& path) {
  const std::string& text = training_metadata(ck, "tapegrad.vocab", path);
  TextData vocab;
  try {
    vocab = TextData::from_text(text, 1.0);
  } catch (const Error& e) {
    fail("checkpoint {}: its vocabulary ('tapegrad.vocab') cannot be read: {}", path, e.what());
  }
  if (vocab.vocab_size() != vocab_size)
    fail(
        "checkpoint {}: its vocabulary ('tapegrad.vocab') holds {} symbols, but its model's vocab_size is {} (the "
        "file was edited, or is damaged)",
        path, vocab.vocab_size(), vocab_size);
  if (utf8_of(vocab.vocab) != text)
    fail(
        "checkpoint {}: its vocabulary ('tapegrad.vocab') is not its {} symbols once each, in order (the file was "
        "edited, or is damaged)",
        path, vocab_size);
  return vocab;
}

GPT model_from_checkpoint(const Checkpoint& ck, const std::string& path) {
  const GPTConfig cfg = model_from_json(training_metadata(ck, "tapegrad.model", path), path);
  // Before a model of the configuration's size is allocated, the file must hold its largest tensors: a
  // configuration that lies (n_embd 10⁶, n_layer 10⁹) is refused instead of exhausting memory.
  auto expect = [&](const std::string& name, const Shape& shape) {
    const Tensor* t = ck.find(name);
    if (!t) fail("checkpoint {}: no tensor {} of shape {} for the model its metadata describes", path, name, shape);
    if (t->dtype() != DType::f32 || !(t->shape() == shape))
      fail("checkpoint {}: tensor {} is {} {}, the model expects float32 {}", path, name, t->dtype(), t->shape(),
           shape);
  };
  expect("transformer.wte.weight", {cfg.vocab_size, cfg.n_embd});
  expect("transformer.wpe.weight", {cfg.block_size, cfg.n_embd});
  if (cfg.n_layer > static_cast<int64_t>(ck.tensors.size()))
    fail("checkpoint {}: {} layers in its metadata, but it holds {} tensors", path, cfg.n_layer, ck.tensors.size());
  for (int64_t l = 0; l < cfg.n_layer; ++l)
    expect(fmt::format("transformer.h.{}.mlp.c_fc.weight", l), {4 * cfg.n_embd, cfg.n_embd});
  GPT model(cfg, 0);
  for (auto& p : model.parameters()) {
    const Tensor& t = ck.at(p.name);
    if (t.dtype() != DType::f32 || !(t.shape() == p.value.shape()))
      fail("checkpoint {}: tensor {} is {} {}, the model expects float32 {}", path, p.name, t.dtype(), t.shape(),
           p.value.shape());
    refuse_non_finite_weight(t, p.name, path);  // as --resume does: `sample` and `evaluate` refuse it too
    p.value.copy_from(t);
  }
  return model;
}

namespace {

// Batches of token ids: x (B, T) and its targets y (B, T), y[b, t] = x[b, t + 1].
using Batches = std::vector<std::pair<Tensor, Tensor>>;

// The evaluation's batches, `n` of each split, drawn once from a generator of their own: the same for every run
// with this seed, whatever else it draws.
std::pair<Batches, Batches> evaluation_batches(const TextData& data, int64_t B, int64_t T, int64_t n, uint64_t seed) {
  Rng rng(seed + 0x5eed);
  std::pair<Batches, Batches> splits;
  for (auto [batches, tokens] : {std::pair{&splits.first, &data.train}, std::pair{&splits.second, &data.val}})
    for (int64_t i = 0; i < n; ++i) {
      Tensor x = Tensor::empty(DType::i32, {B, T}), y = Tensor::empty(DType::i32, {B, T});
      sample_batch(*tokens, B, T, rng, x.data<int32_t>(), y.data<int32_t>());
      batches->emplace_back(x, y);
    }
  return splits;
}

// Mean loss over fixed batches, recording nothing; `tape` is cleared after each batch. A signal (`interrupt`) cuts
// it short, between batches, with NaN: TrainingRun::evaluate drops an evaluation the signal came during.
double mean_loss(const GPT& model, Tape& tape, const Batches& batches, const volatile std::sig_atomic_t* interrupt) {
  double total = 0;
  for (const auto& [x, y] : batches) {
    if (stop_requested(interrupt)) return NAN;
    NoGradGuard no_grad(tape);
    total += model.loss(tape, x, y).value().item();
    tape.clear();
  }
  return total / static_cast<double>(batches.size());
}

// The prompt `ids` followed by `n` sampled tokens, or fewer when a signal (`interrupt`) stops it: it is checked
// before each token, so that a long sample ends at once.
std::vector<int32_t> sample_tokens(const GPT& model, std::vector<int32_t> ids, int64_t n, double temperature,
                                   int64_t top_k, Rng& rng, const volatile std::sig_atomic_t* interrupt = nullptr) {
  const int64_t T = model.config().block_size, V = model.config().vocab_size;
  Tape tape;
  std::vector<double> probs(static_cast<size_t>(V));
  for (int64_t step = 0; step < n && !stop_requested(interrupt); ++step) {
    const int64_t len = std::min<int64_t>(T, static_cast<int64_t>(ids.size()));
    Tensor x = Tensor::from<int32_t>({1, len}, std::span<const int32_t>(ids.data() + ids.size() - len, len));
    NoGradGuard no_grad(tape);
    Tensor logits = model.logits(tape, x).value();
    const float* last = logits.data<float>() + (len - 1) * V;
    double mx = -INFINITY;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, static_cast<double>(last[j]));
    double cut = -INFINITY;
    if (top_k > 0 && top_k < V) {
      std::vector<float> sorted(last, last + V);
      std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(), std::greater<float>());
      cut = sorted[static_cast<size_t>(top_k - 1)];
    }
    double z = 0;
    for (int64_t j = 0; j < V; ++j) {
      double p = last[j] < cut ? 0.0 : std::exp((last[j] - mx) / temperature);
      probs[static_cast<size_t>(j)] = p;
      z += p;
    }
    double u = rng.uniform() * z, acc = 0;
    int32_t next = static_cast<int32_t>(V - 1);
    for (int64_t j = 0; j < V; ++j) {
      acc += probs[static_cast<size_t>(j)];
      if (u < acc) {
        next = static_cast<int32_t>(j);
        break;
      }
    }
    ids.push_back(next);
    tape.clear();
  }
  return ids;
}

// What the memory check before the run found, for the header.
struct MemoryOutlook {
  TrainingMemory need;              // the estimate for the run
  double resident_at_start;         // the program, its libraries and the text
  std::optional<double> available;  // what the system has free, when it says
};

// The run's header: the model and its parameters, the engine, the memory, the data, where a resumed run continues.
void print_header(std::FILE* out, const TrainConfig& cfg, const std::string& data_path, const TextData& data,
                  const GPT& model, const MemoryOutlook& memory, const TrainingRun& run) {
  fmt::print(out,
             "tapegrad train: {} attention, {} layers, {} heads, {} wide, context {}, {} gelu, vocab {}, batch {}\n",
             cfg.model.attention, cfg.model.n_layer, cfg.model.n_head, cfg.model.n_embd, cfg.model.block_size,
             gelu_form_name(cfg.model.gelu), cfg.model.vocab_size, cfg.batch_size);
  for (const auto& [part, n] : model.parameter_summary()) fmt::print(out, "  {:<24} {:>9} parameters\n", part, n);
  fmt::print(out, "  {:<24} {:>9} parameters\n", "total", model.num_parameters());
  fmt::print(out, "threads: {} (the engine's pool); BLAS {}\n{}\n", num_threads(), blas_summary(blas_info()),
             products_summary());
  const TrainingMemory& need = memory.need;
  fmt::print(out,
             "memory: about {} estimated for the run (parameters and gradients {}, AdamW {}, one step's tape {}, "
             "evaluation batches {}{}) beside the program's {}; {}\n",
             bytes_text(need.total()), bytes_text(need.parameter_bytes), bytes_text(need.optimizer_bytes),
             bytes_text(need.tape_bytes), bytes_text(need.eval_bytes),
             need.hvp_bytes > 0 ? ", Hessian-vector products " + bytes_text(need.hvp_bytes) : "",
             bytes_text(memory.resident_at_start),
             memory.available ? bytes_text(*memory.available) + " available" : "available unknown");
  fmt::print(out, "data: {} ({} train / {} val tokens); run directory {}\n", data_path, data.train.size(),
             data.val.size(), cfg.loop.dir);
  if (cfg.loop.resume) fmt::print(out, "resuming from {} at step {}\n", run.checkpoint_path(), run.first_step());
  std::fflush(out);
}

// The sharpness of the training loss (models/sharpness.hpp) every sharpness_every steps, on one batch drawn once
// from a generator of its own (so the training batches, and the losses, are those of a run without it); printed,
// and written to sharpness.csv and sharpness.svg in the run directory.
class SharpnessLog {
 public:
  SharpnessLog(const TrainConfig& cfg, const TextData& data) : cfg_(cfg) {
    if (cfg.sharpness_every <= 0) return;
    const int64_t B = cfg.batch_size, T = cfg.model.block_size;
    Rng rng(cfg.seed ^ 0x5ba1d0e5ull);
    x_ = Tensor::empty(DType::i32, {B, T});
    y_ = Tensor::empty(DType::i32, {B, T});
    sample_batch(data.train, B, T, rng, x_.data<int32_t>(), y_.data<int32_t>());
  }

  // λ_max after `steps` steps, the last at learning rate `lr`.
  void measure(const GPT& model, int64_t steps, double lr, const TrainingRun& run) {
    const Sharpness s = sharpness(model, [&](Tape& tape) { return model.loss(tape, x_, y_); },
                                  {.iterations = cfg_.sharpness_iterations, .tolerance = 1e-3, .seed = cfg_.seed});
    rows_.push_back({steps, lr, s});
    std::FILE* out = cfg_.loop.out;
    if (!cfg_.loop.quiet)
      fmt::print(out,
                 "{}sharpness after step {}: λ_max = {:.4g} ({} Hessian-vector products, residual {:.2g}; "
                 "loss {:.4f} on its batch)\n",
                 run.line_start(), steps, s.largest, s.iterations, s.residual, s.loss);
    const std::string& dir = cfg_.loop.dir;
    if (dir.empty()) return;
    std::string csv = "step,lr,sharpness,largest_magnitude,iterations,residual,loss\n";
    PlotSeries curve{"largest Hessian eigenvalue", {}};
    for (const Row& r : rows_) {
      csv += fmt::format("{},{},{},{},{},{},{}\n", r.step, r.lr, r.s.largest, r.s.magnitude, r.s.iterations,
                         r.s.residual, r.s.loss);
      curve.points.emplace_back(static_cast<double>(r.step), r.s.largest);
    }
    write_file_atomic(dir + "/sharpness.csv", csv);
    write_loss_svg(dir + "/sharpness.svg", fmt::format("sharpness of the training loss, {}", cfg_.loop.title),
                   std::span<const PlotSeries>(&curve, 1), "step", "λ_max");
  }

 private:
  struct Row {
    int64_t step;
    double lr;
    Sharpness s;
  };
  const TrainConfig& cfg_;
  Tensor x_, y_;
  std::vector<Row> rows_;
};

// The training steps, as llm.c's main loop. Before each step that is a multiple of eval_interval, and after the
// last, the mean losses on the fixed evaluation batches and a checkpoint; each step samples a batch, records the
// forward pass on the tape, differentiates it and updates the weights with AdamW at the scheduled learning rate.
void train_steps(const TrainConfig& cfg, const TextData& data, GPT& model, AdamW& opt, Rng& batch_rng,
                 TrainingRun& run) {
  const int64_t B = cfg.batch_size, T = cfg.model.block_size;
  const std::pair<Batches, Batches> eval_batches = evaluation_batches(data, B, T, cfg.eval_iters, cfg.seed);
  const Batches &eval_train = eval_batches.first, &eval_val = eval_batches.second;
  // One tape for the whole run: a step's forward pass, cleared after its backward, and between steps the
  // evaluations' forward passes (recording no gradients), cleared after each batch. Its arena, sized by the first
  // step, serves them all.
  Tape tape;
  AnomalyCheck anomaly(tape, cfg.loop.detect_anomaly);  // with --detect-anomaly: the first NaN or ±∞ a node makes
  Profile* prof = run.profile();                        // the training steps only, not the evaluations
  if (prof) tape.add_observer(prof);
  auto eval_losses = [&](int64_t) {
    if (prof) tape.remove_observer(prof);
    Evaluation e{mean_loss(model, tape, eval_train, cfg.loop.interrupt),
                 mean_loss(model, tape, eval_val, cfg.loop.interrupt)};
    if (prof) tape.add_observer(prof);
    return e;
  };
  auto add_metadata = [&](Checkpoint& ck) { add_run_metadata(ck, model, cfg, data); };
  // Linear warm-up to learning_rate over warmup_iters steps, then a cosine down to min_lr at lr_decay_iters.
  auto lr_at = [&](int64_t it) {
    return learning_rate(it, cfg.learning_rate, cfg.min_lr, cfg.warmup_iters, cfg.lr_decay_iters);
  };
  SharpnessLog sharpness_log(cfg, data);
  Tensor x = Tensor::empty(DType::i32, {B, T}), y = Tensor::empty(DType::i32, {B, T});

  for (int64_t it = run.first_step(); it < run.stop_step(); ++it) {
    if (it % cfg.loop.eval_interval == 0) {  // the weights step `it` starts from: evaluated, then kept
      run.evaluate(it, eval_losses);
      if (run.interrupted(it)) break;  // a signal during the evaluation: the checkpoint at `it`, then out
      run.save_checkpoint(it, add_metadata);
    }
    const double lr = lr_at(it);
    run.step_started();
    // x (B, T): token ids from B random offsets of the train split; y (B, T): the next ones, y[b, t] = x[b, t + 1]
    sample_batch(data.train, B, T, batch_rng, x.data<int32_t>(), y.data<int32_t>());
    if (prof) prof->mark("data: batch");
    // forward: embeddings (B, T, C) → n_layer blocks → logits (B, T, V) = ln_f(h)·wteᵀ;
    //          loss = −1/(B·T) Σ_b,t log softmax(logits[b, t])[y[b, t]], a scalar
    Var loss = run.at_step(it, [&] { return model.loss(tape, x, y, dropout_seed(cfg.model, cfg.seed, it)); });
    const double loss_value = run.finite_loss(it, loss);  // a NaN or ±∞ stops the run
    // backward: ∂loss/∂θ added into every parameter's gradient (zero since the last update)
    run.at_step(it, [&] { tape.backward(loss); });
    tape.clear();  // forgets the step's nodes and values; the arena keeps its memory for the next step
    // update: g ← g·min(1, grad_clip/(‖g‖₂ + 1e-6)), ‖g‖₂ over all parameters; θ ← AdamW(θ, g) at lr, with
    // decoupled weight decay on the matrices and embeddings; g ← 0
    optimizer_step(opt, lr, cfg.loop.grad_clip, prof);
    run.step_done(it, lr, loss_value);  // the log's row, the progress line
    if (cfg.sharpness_every > 0 && (it + 1) % cfg.sharpness_every == 0)
      sharpness_log.measure(model, it + 1, lr, run);  // λ_max of the loss's Hessian at the weights after the step
    if (run.interrupted(it + 1)) break;               // SIGINT or SIGTERM: a checkpoint at it + 1, then out
  }
  if (prof) tape.remove_observer(prof);
  run.finish(lr_at(cfg.loop.max_steps), eval_losses, add_metadata);
}

}  // namespace

std::string default_data_path() { return shared_file("data/tinyshakespeare.txt"); }

void TrainConfig::validate() const {
  model.validate();
  if (batch_size <= 0) fail("batch_size must be positive, got {}", batch_size);
  if (loop.max_steps < 0) fail("max_iters must not be negative, got {}", loop.max_steps);
  if (loop.eval_interval <= 0 || eval_iters <= 0) fail("eval_interval and eval_iters must be positive");
  if (!(learning_rate > 0) || !(min_lr >= 0)) fail("learning rates must be positive");
  if (min_lr > learning_rate)
    fail("--min-lr ({}) is above --lr ({}): the schedule would rise instead of decaying", min_lr, learning_rate);
  if (out_dir.empty()) fail("--out: the directory of run directories is empty; give one (the default is runs)");
  if (!(loop.grad_clip >= 0)) fail("grad_clip must not be negative");
  if (sharpness_every < 0) fail("sharpness_every must not be negative, got {}", sharpness_every);
  if (sharpness_iterations < 1) fail("sharpness_iterations must be at least 1, got {}", sharpness_iterations);
  if (sample_tokens < 0 || sample_tokens > kMaxSampleTokens)
    fail("--sample-tokens must lie in [0, {}], got {}", kMaxSampleTokens, sample_tokens);
  if (!(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1)) fail("beta1 and beta2 must be in [0, 1)");
  validate_run_name(name);
  if (loop.resume && loop.overwrite)
    fail("--resume continues the run in its directory and --overwrite starts it over: give one of them");
  if (loop.stop_after < 0) fail("--stop-after must not be negative, got {}", loop.stop_after);
}

std::string TrainConfig::run_dir() const { return out_dir + "/" + (name.empty() ? model.attention : name); }

TrainResult train(const TrainConfig& cfg_in, std::FILE* out) {
  TrainConfig cfg = cfg_in;
  const std::string data_path = cfg.data.empty() ? default_data_path() : cfg.data;
  TextData data = TextData::load(data_path);
  cfg.model.vocab_size = data.vocab_size();
  if (cfg.lr_decay_iters == 0) cfg.lr_decay_iters = cfg.loop.max_steps;
  cfg.loop.dir = cfg.run_dir();
  cfg.loop.title =
      fmt::format("{} attention on {}", cfg.model.attention, std::filesystem::path(data_path).filename().string());
  cfg.loop.tokens_per_step = cfg.batch_size * cfg.model.block_size;
  cfg.loop.out = out;
  cfg.validate();
  refuse_outputs_that_are_inputs(cfg, data_path);
  const PrecisionScope precision(cfg.precision);  // refuses bf16 on a CPU without bf16 units, before any work
  const int64_t B = cfg.batch_size, T = cfg.model.block_size;
  // Before anything large is allocated: a run that cannot fit is refused in one line.
  const MemoryOutlook memory{estimate_training_memory(cfg.model, B, cfg.eval_iters, cfg.sharpness_every > 0),
                             resident_bytes(), memory_available()};
  const TrainingMemory& need = memory.need;
  if (memory.available && need.total() > *memory.available)
    fail(
        "the run needs about {} of memory ({:.4g} parameters: {} for them and their gradients, {} for AdamW's "
        "moments, {} for one step's tape at batch {} and context {}, {} for {} evaluation batches per split{}), "
        "more than the {} available; make the model, the batch or --eval-iters smaller{}",
        bytes_text(need.total()), need.parameters, bytes_text(need.parameter_bytes), bytes_text(need.optimizer_bytes),
        bytes_text(need.tape_bytes), B, T, bytes_text(need.eval_bytes), cfg.eval_iters,
        need.hvp_bytes > 0 ? ", " + bytes_text(need.hvp_bytes) + " for --sharpness-every's Hessian-vector products"
                           : "",
        bytes_text(*memory.available), need.hvp_bytes > 0 ? ", or leave out --sharpness-every" : "");
  if (static_cast<int64_t>(data.val.size()) <= T || static_cast<int64_t>(data.train.size()) <= T)
    fail(
        "the data's train split ({} tokens) and validation split ({} tokens) must each be longer than one context "
        "of {} tokens",
        data.train.size(), data.val.size(), T);

  GPT model(cfg.model, cfg.seed);
  AdamW opt(
      model.parameters(),
      {.lr = cfg.learning_rate, .beta1 = cfg.beta1, .beta2 = cfg.beta2, .eps = 1e-8, .weight_decay = cfg.weight_decay});
  Rng batch_rng(cfg.seed * 0x9E3779B97F4A7C15ULL + 1);  // draws the training batches
  TrainResult res;
  res.parameters = model.num_parameters();
  res.run_dir = cfg.loop.dir;
  TrainingRun run(cfg.loop, model, opt, res, &batch_rng);
  if (cfg.loop.resume)
    run.resume("--resume", [&](const Checkpoint& ck) {
      refuse_another_model(ck, cfg.model, data, run.checkpoint_path());
      refuse_another_training(ck, cfg, run.checkpoint_path());
    });
  run.start();
  if (!cfg.loop.quiet) print_header(out, cfg, data_path, data, model, memory, run);
  train_steps(cfg, data, model, opt, batch_rng, run);

  // The profile against the mean step time of the same steps (the rows add up to the mean, not the median).
  auto report_profile = [&] {
    if (!res.profile) return;
    write_file_atomic(res.run_dir + "/profile.json", profile_json(*res.profile, res.mean_ms_per_step).dump(2) + "\n");
    if (!cfg.loop.quiet)
      fmt::print(out, "\n{}wrote {}/profile.json\n",
                 format_profile(*res.profile, res.mean_ms_per_step, "profile (training steps, evaluation excluded)"),
                 res.run_dir);
  };
  if (res.stopped_early) {
    report_profile();
    return res;
  }
  if (cfg.sample_tokens > 0) {
    Rng rng(cfg.seed);
    res.sample = data.decode(
        sample_tokens(model, data.encode(data.default_prompt()), cfg.sample_tokens, 0.8, 0, rng, cfg.loop.interrupt));
    if (stop_requested(cfg.loop.interrupt)) {  // the run is complete and written; the sample is cut short
      res.interrupted_by = static_cast<int>(*cfg.loop.interrupt);
      res.sample.clear();
    }
  }
  if (!cfg.loop.quiet) {
    const EvalPoint& final_eval = res.evals.back();
    fmt::print(out,
               "done: {} steps, train loss {:.4f}, val loss {:.4f}, {:.1f} ms/step (median), {} wall, peak RSS {}\n",
               cfg.loop.max_steps, final_eval.train_loss, final_eval.val_loss, res.ms_per_step,
               format_duration(res.wall_seconds), bytes_text(peak_resident_bytes()));
    fmt::print(out, "wrote {0}/checkpoint.safetensors, {0}/losses.csv, {0}/losses.svg\n", res.run_dir);
    if (!res.sample.empty()) fmt::print(out, "\nsample:\n{}\n", res.sample);
  }
  report_profile();
  return res;
}

std::string sample_from_checkpoint(const std::string& path, const SampleConfig& sc) {
  Checkpoint ck = load_checkpoint(path);
  GPT model = model_from_checkpoint(ck, path);
  const TextData vocab = checkpoint_vocabulary(ck, model.config().vocab_size, path);
  if (!(sc.temperature > 0)) fail("temperature must be positive, got {}", sc.temperature);
  if (sc.tokens < 0 || sc.top_k < 0) fail("tokens and top-k must not be negative");
  if (sc.tokens > kMaxSampleTokens) fail("--tokens must be at most {}, got {}", kMaxSampleTokens, sc.tokens);
  Rng rng(sc.seed);
  std::vector<int32_t> ids = vocab.encode(sc.prompt.empty() ? vocab.default_prompt() : sc.prompt);
  return vocab.decode(sample_tokens(model, ids, sc.tokens, sc.temperature, sc.top_k, rng));
}

}  // namespace tapegrad

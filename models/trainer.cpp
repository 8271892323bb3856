#include "models/trainer.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string_view>

#include <nlohmann/json.hpp>

#include "engine/anomaly.hpp"
#include "engine/blas_info.hpp"
#include "engine/products.hpp"
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
  return {{"vocab_size", m.vocab_size}, {"block_size", m.block_size}, {"n_layer", m.n_layer},
          {"n_head", m.n_head},         {"n_embd", m.n_embd},         {"dropout", m.dropout},
          {"bias", m.bias},             {"attention", m.attention},   {"gelu", gelu_form_name(m.gelu)}};
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

// What a run's checkpoint holds besides what the loop keeps (the model under nanoGPT's names, AdamW's moments, the
// step, evaluations and log): the configuration, the vocabulary and the batch generator's state.
void add_run_metadata(Checkpoint& ck, const GPT& model, const TrainConfig& cfg, const TextData& data, uint64_t rng_state) {
  ck.metadata["format"] = "tapegrad-gpt";
  ck.metadata["tapegrad.model"] = model_json(model.config()).dump();
  ck.metadata["tapegrad.train"] = json{{"seed", cfg.seed}, {"batch_size", cfg.batch_size}, {"max_iters", cfg.max_iters},
                                        {"precision", precision_name(cfg.precision)}}.dump();
  ck.metadata["tapegrad.vocab"] = utf8_of(data.vocab);
  ck.metadata["tapegrad.rng"] = std::to_string(rng_state);
}

}  // namespace

GPT model_from_checkpoint(const Checkpoint& ck, const std::string& path) {
  const GPTConfig cfg = model_from_json(training_metadata(ck, "tapegrad.model", path), path);
  // Before a model of the configuration's size is allocated, the file must hold its largest tensors: a
  // configuration that lies (n_embd 10⁶, n_layer 10⁹) is refused instead of exhausting memory.
  auto expect = [&](const std::string& name, const Shape& shape) {
    const Tensor* t = ck.find(name);
    if (!t) fail("checkpoint {}: no tensor {} of shape {} for the model its metadata describes", path, name, shape);
    if (t->dtype() != DType::f32 || !(t->shape() == shape))
      fail("checkpoint {}: tensor {} is {} {}, the model expects float32 {}", path, name, t->dtype(), t->shape(), shape);
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
    p.value.copy_from(t);
  }
  return model;
}

namespace {

// Mean loss over fixed batches, without recording anything.
double evaluate(const GPT& model, Tape& tape, const std::vector<std::pair<Tensor, Tensor>>& batches) {
  double total = 0;
  for (const auto& [x, y] : batches) {
    NoGradGuard no_grad(tape);
    total += model.loss(tape, x, y).value().item();
    tape.clear();
  }
  return total / static_cast<double>(batches.size());
}

std::vector<int32_t> sample_tokens(const GPT& model, std::vector<int32_t> ids, int64_t n, double temperature,
                                   int64_t top_k, Rng& rng) {
  const int64_t T = model.config().block_size, V = model.config().vocab_size;
  Tape tape;
  std::vector<double> probs(static_cast<size_t>(V));
  for (int64_t step = 0; step < n; ++step) {
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

}  // namespace

std::string default_data_path() {
  return shared_file("data/tinyshakespeare.txt");
}

void TrainConfig::validate() const {
  model.validate();
  if (batch_size <= 0) fail("batch_size must be positive, got {}", batch_size);
  if (max_iters < 0) fail("max_iters must not be negative, got {}", max_iters);
  if (eval_interval <= 0 || eval_iters <= 0) fail("eval_interval and eval_iters must be positive");
  if (!(learning_rate > 0) || !(min_lr >= 0)) fail("learning rates must be positive");
  if (!(grad_clip >= 0)) fail("grad_clip must not be negative");
  if (sharpness_every < 0) fail("sharpness_every must not be negative, got {}", sharpness_every);
  if (sharpness_iterations < 1) fail("sharpness_iterations must be at least 1, got {}", sharpness_iterations);
  if (!(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1)) fail("beta1 and beta2 must be in [0, 1)");
}

std::string TrainConfig::run_dir() const { return out_dir + "/" + (name.empty() ? model.attention : name); }

TrainResult train(const TrainConfig& cfg_in, std::FILE* out) {
  TrainConfig cfg = cfg_in;
  const std::string dir = cfg.run_dir();
  const std::string ck_path = dir + "/checkpoint.safetensors";
  TextData data = TextData::load(cfg.data.empty() ? default_data_path() : cfg.data);
  cfg.model.vocab_size = static_cast<int64_t>(data.vocab.size());
  if (cfg.lr_decay_iters == 0) cfg.lr_decay_iters = cfg.max_iters;

  std::optional<Checkpoint> resume_ck;
  if (cfg.resume) {
    resume_ck = load_checkpoint(ck_path);
    GPTConfig saved = model_from_json(training_metadata(*resume_ck, "tapegrad.model", ck_path), ck_path);
    if (saved.attention != cfg.model.attention || saved.n_embd != cfg.model.n_embd || saved.n_layer != cfg.model.n_layer ||
        saved.n_head != cfg.model.n_head || saved.block_size != cfg.model.block_size || saved.vocab_size != cfg.model.vocab_size)
      fail("--resume: {} was trained with another model ({} attention, {} layers, {} heads, {} wide, context {}, vocab {})",
           ck_path, saved.attention, saved.n_layer, saved.n_head, saved.n_embd, saved.block_size, saved.vocab_size);
  }
  cfg.validate();
  const PrecisionScope precision(cfg.precision);  // refuses bf16 on a CPU without bf16 units, before any work
  const int64_t B = cfg.batch_size, T = cfg.model.block_size;
  // Before anything large is allocated: a run that cannot fit is refused in one line.
  const TrainingMemory need = estimate_training_memory(cfg.model, B);
  const double resident_at_start = resident_bytes();  // the program, its libraries and the text
  const std::optional<double> available = memory_available();
  if (available && need.total() > *available)
    fail("the run needs about {} of memory ({:.4g} parameters: {} for them and their gradients, {} for AdamW's "
         "moments, {} for one step's tape at batch {} and context {}), more than the {} available; make the model "
         "or the batch smaller",
         bytes_text(need.total()), need.parameters, bytes_text(need.parameter_bytes), bytes_text(need.optimizer_bytes),
         bytes_text(need.tape_bytes), B, T, bytes_text(*available));
  if (static_cast<int64_t>(data.val.size()) <= T || static_cast<int64_t>(data.train.size()) <= T)
    fail("the data's train split ({} tokens) and validation split ({} tokens) must each be longer than one context "
         "of {} tokens", data.train.size(), data.val.size(), T);

  GPT model(cfg.model, cfg.seed);
  AdamW opt(model.parameters(), {.lr = cfg.learning_rate, .beta1 = cfg.beta1, .beta2 = cfg.beta2, .eps = 1e-8,
                                 .weight_decay = cfg.weight_decay});
  Rng batch_rng(cfg.seed * 0x9E3779B97F4A7C15ULL + 1);

  // Fixed evaluation batches, the same for every run with this seed.
  Rng eval_rng(cfg.seed + 0x5eed);
  std::vector<std::pair<Tensor, Tensor>> eval_train, eval_val;
  for (auto* split : {&eval_train, &eval_val})
    for (int64_t i = 0; i < cfg.eval_iters; ++i) {
      Tensor x = Tensor::empty(DType::i32, {B, T}), y = Tensor::empty(DType::i32, {B, T});
      sample_batch(split == &eval_train ? data.train : data.val, B, T, eval_rng, x.data<int32_t>(), y.data<int32_t>());
      split->emplace_back(x, y);
    }

  TrainResult res;
  res.parameters = model.num_parameters();
  res.run_dir = dir;
  if (cfg.profile) res.profile.emplace(&builtin_registry());
  Profile* prof = cfg.profile ? &*res.profile : nullptr;

  LoopConfig lc;
  lc.max_steps = cfg.max_iters;
  lc.eval_interval = cfg.eval_interval;
  lc.grad_clip = cfg.grad_clip;
  lc.lr = [&](int64_t it) { return learning_rate(it, cfg.learning_rate, cfg.min_lr, cfg.warmup_iters, cfg.lr_decay_iters); };
  lc.dir = dir;
  lc.title = fmt::format("{} attention on {}", cfg.model.attention,
                         std::filesystem::path(cfg.data.empty() ? default_data_path() : cfg.data).filename().string());
  lc.resume = cfg.resume;
  lc.resume_from = resume_ck ? &*resume_ck : nullptr;
  lc.resume_flag = "--resume";
  lc.stop_after = cfg.stop_after;
  lc.tokens_per_step = B * T;
  lc.log_interval = cfg.log_interval;
  lc.quiet = cfg.quiet;
  lc.detect_anomaly = cfg.detect_anomaly;
  lc.profile = prof;
  lc.out = out;

  LoopFunctions fn;
  Tensor x = Tensor::empty(DType::i32, {B, T}), y = Tensor::empty(DType::i32, {B, T});
  fn.loss = [&](Tape& tape, int64_t it) {
    sample_batch(data.train, B, T, batch_rng, x.data<int32_t>(), y.data<int32_t>());
    if (prof) prof->mark("data: batch");
    return model.loss(tape, x, y, dropout_seed(cfg.model, cfg.seed, it));
  };
  fn.evaluate = [&](int64_t) {
    Tape train_tape, val_tape;
    AnomalyCheck train_check(train_tape, cfg.detect_anomaly);
    AnomalyCheck val_check(val_tape, cfg.detect_anomaly);
    return Evaluation{evaluate(model, train_tape, eval_train), evaluate(model, val_tape, eval_val)};
  };
  fn.save = [&](Checkpoint& ck) { add_run_metadata(ck, model, cfg, data, batch_rng.state()); };
  fn.restore = [&](const Checkpoint& ck) {
    batch_rng.set_state(std::stoull(training_metadata(ck, "tapegrad.rng", ck_path)));
  };
  fn.started = [&](int64_t first_step) {
    if (cfg.quiet) return;
    fmt::print(out, "tapegrad train: {} attention, {} layers, {} heads, {} wide, context {}, {} gelu, vocab {}, batch {}\n",
               cfg.model.attention, cfg.model.n_layer, cfg.model.n_head, cfg.model.n_embd, T,
               gelu_form_name(cfg.model.gelu), cfg.model.vocab_size, B);
    for (const auto& [part, n] : model.parameter_summary()) fmt::print(out, "  {:<24} {:>9} parameters\n", part, n);
    fmt::print(out, "  {:<24} {:>9} parameters\n", "total", res.parameters);
    fmt::print(out, "threads: {} (the engine's pool); BLAS {}\n{}\n", num_threads(), blas_summary(blas_info()),
               products_summary());
    fmt::print(out,
               "memory: about {} estimated for the run (parameters and gradients {}, AdamW {}, one step's tape {}) "
               "beside the program's {}; {}\n",
               bytes_text(need.total()), bytes_text(need.parameter_bytes), bytes_text(need.optimizer_bytes),
               bytes_text(need.tape_bytes), bytes_text(resident_at_start),
               available ? bytes_text(*available) + " available" : "available unknown");
    fmt::print(out, "data: {} ({} train / {} val tokens); run directory {}\n",
               cfg.data.empty() ? default_data_path() : cfg.data, data.train.size(), data.val.size(), dir);
    if (cfg.resume) fmt::print(out, "resuming from {} at step {}\n", ck_path, first_step);
    std::fflush(out);
  };

  // Sharpness on one batch of its own generator (the training batches and losses do not change with it).
  Tensor sharp_x, sharp_y;
  struct SharpnessRow {
    int64_t step;
    double lr;
    Sharpness s;
  };
  std::vector<SharpnessRow> sharp_rows;
  if (cfg.sharpness_every > 0) {
    Rng sharp_rng(cfg.seed ^ 0x5ba1d0e5ull);
    sharp_x = Tensor::empty(DType::i32, {B, T});
    sharp_y = Tensor::empty(DType::i32, {B, T});
    sample_batch(data.train, B, T, sharp_rng, sharp_x.data<int32_t>(), sharp_y.data<int32_t>());
    fn.after_step = [&](int64_t it, double lr) {
      if ((it + 1) % cfg.sharpness_every != 0) return;
      const Sharpness s = sharpness(model, [&](Tape& tape) { return model.loss(tape, sharp_x, sharp_y); },
                                    {.iterations = cfg.sharpness_iterations, .tolerance = 1e-3, .seed = cfg.seed});
      sharp_rows.push_back({it + 1, lr, s});
      if (!cfg.quiet)
        fmt::print(out, "{}sharpness after step {}: λ_max = {:.4g} ({} Hessian-vector products, residual {:.2g}; "
                        "loss {:.4f} on its batch)\n",
                   isatty(fileno(out)) ? "\r\033[K" : "", it + 1, s.largest, s.iterations, s.residual, s.loss);
      if (dir.empty()) return;
      std::string csv = "step,lr,sharpness,largest_magnitude,iterations,residual,loss\n";
      PlotSeries curve{"largest Hessian eigenvalue", {}};
      for (const SharpnessRow& r : sharp_rows) {
        csv += fmt::format("{},{},{},{},{},{},{}\n", r.step, r.lr, r.s.largest, r.s.magnitude, r.s.iterations,
                           r.s.residual, r.s.loss);
        curve.points.emplace_back(static_cast<double>(r.step), r.s.largest);
      }
      write_file_atomic(dir + "/sharpness.csv", csv);
      write_loss_svg(dir + "/sharpness.svg", fmt::format("sharpness of the training loss, {}", lc.title),
                     std::span<const PlotSeries>(&curve, 1), "step", "λ_max");
    };
  }

  LoopResult run = train_loop(model, opt, lc, fn);
  res.evals = std::move(run.evals);
  res.step_losses = std::move(run.step_losses);
  res.ms_per_step = run.ms_per_step;
  res.wall_seconds = run.wall_seconds;

  // The profile against the mean step time of the same steps (the rows add up to the mean, not the median).
  auto report_profile = [&] {
    if (!prof) return;
    write_file_atomic(dir + "/profile.json", profile_json(*prof, run.mean_ms_per_step).dump(2) + "\n");
    if (!cfg.quiet)
      fmt::print(out, "\n{}wrote {}/profile.json\n",
                 format_profile(*prof, run.mean_ms_per_step, "profile (training steps, evaluation excluded)"), dir);
  };
  if (run.stopped_early) {
    report_profile();
    return res;
  }
  if (cfg.sample_tokens > 0) {
    Rng rng(cfg.seed);
    auto ids = sample_tokens(model, data.encode("\n"), cfg.sample_tokens, 0.8, 0, rng);
    res.sample = data.decode(ids);
  }
  if (!cfg.quiet) {
    const EvalPoint& final_eval = res.evals.back();
    fmt::print(out, "done: {} steps, train loss {:.4f}, val loss {:.4f}, {:.1f} ms/step (median), {} wall, peak RSS {}\n",
               cfg.max_iters, final_eval.train_loss, final_eval.val_loss, res.ms_per_step,
               format_duration(res.wall_seconds), bytes_text(peak_resident_bytes()));
    fmt::print(out, "wrote {0}/checkpoint.safetensors, {0}/losses.csv, {0}/losses.svg\n", dir);
    if (!res.sample.empty()) fmt::print(out, "\nsample:\n{}\n", res.sample);
  }
  report_profile();
  return res;
}

std::string sample_from_checkpoint(const std::string& path, const SampleConfig& sc) {
  Checkpoint ck = load_checkpoint(path);
  GPT model = model_from_checkpoint(ck, path);
  TextData vocab = TextData::from_text(training_metadata(ck, "tapegrad.vocab", path), 1.0);
  if (!(sc.temperature > 0)) fail("temperature must be positive, got {}", sc.temperature);
  if (sc.tokens < 0 || sc.top_k < 0) fail("tokens and top-k must not be negative");
  Rng rng(sc.seed);
  std::vector<int32_t> ids = vocab.encode(sc.prompt.empty() ? std::string("\n") : sc.prompt);
  return vocab.decode(sample_tokens(model, ids, sc.tokens, sc.temperature, sc.top_k, rng));
}

}  // namespace tapegrad

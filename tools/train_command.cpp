// tapegrad train: a GPT on a text file (Tiny Shakespeare by default); tapegrad sample: text from a checkpoint.
#include <fmt/core.h>

#include <pthread.h>
#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <csignal>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>

#include "models/files.hpp"
#include "models/gpt.hpp"
#include "models/trainer.hpp"
#include "tools/commands.hpp"

namespace tapegrad::cli {

// The program's exit code when a command does not fail (gradcheck and claim set 1 for a failed check, train 130 or
// 143 after a signal). Defined here, in the file every build of the commands links (the program, the tests, the
// fuzz targets).
namespace {
int g_exit_code = 0;
}  // namespace

int exit_code() { return g_exit_code; }
void set_exit_code(int code) { g_exit_code = code; }

namespace {

// A number check with a one-line message ("--batch-size: must be positive, got 0"), in place of CLI11's
// PositiveNumber, whose message spells out the range up to DBL_MAX.
CLI::Validator number_check(bool (*ok)(double), const char* must) {
  return CLI::Validator(
      [ok, must](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        if (s.empty() || end != s.c_str() + s.size()) return fmt::format("expected a number, got '{}'", s);
        return ok(v) ? std::string() : fmt::format("must be {}, got {}", must, s);
      },
      must, "");
}

}  // namespace

// A floating option's value must be a finite number: CLI11 reads "inf", "nan" and 1e999 as doubles, and an
// infinite learning rate trains to NaN at the first step.
const CLI::Validator& finite() {
  static const CLI::Validator v =
      number_check([](double x) { return std::isfinite(x); }, "a finite number").description("");  // not in --help
  return v;
}

void refuse_non_finite_numbers(CLI::App& app) {
  for (CLI::Option* option : app.get_options())
    if (option->get_type_name().rfind("FLOAT", 0) == 0) option->check(finite());
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) refuse_non_finite_numbers(*sub);
}

const CLI::Validator& positive() {
  static const CLI::Validator v = number_check([](double x) { return x > 0; }, "positive");
  return v;
}
const CLI::Validator& existing_file() {
  static const CLI::Validator v(
      [](std::string& path) -> std::string {
        struct stat st {};
        if (::stat(path.c_str(), &st) != 0) {
          const int err = errno;
          if (err == ENOENT) return fmt::format("no such file: {}", path);
          return fmt::format("cannot reach {}: {}", path, std::generic_category().message(err));
        }
        if (S_ISDIR(st.st_mode)) return fmt::format("{} is a directory, not a file", path);
        // A fifo would block the read for ever, a device would never end: refused before anything opens them.
        if (!S_ISREG(st.st_mode)) return fmt::format("{} is not a regular file ({})", path, file_type_name(st.st_mode));
        return {};
      },
      "FILE", "");
  return v;
}

const CLI::Validator& non_negative() {
  static const CLI::Validator v = number_check([](double x) { return x >= 0; }, "non-negative");
  return v;
}

void add_model_options(CLI::App* cmd, GPTConfig& m, bool attention_option, const std::string& lead) {
  if (attention_option)
    cmd->add_option("--attention", m.attention, lead + "Attention kind:" + attention_kind_help())
        ->capture_default_str()
        ->check(CLI::IsMember(attention_kinds()));
  cmd->add_option("--n-layer", m.n_layer, lead + "Transformer blocks")->capture_default_str()->check(positive());
  cmd->add_option("--n-head", m.n_head, lead + "Attention heads per block")->capture_default_str()->check(positive());
  cmd->add_option("--n-embd", m.n_embd, lead + "Embedding width")->capture_default_str()->check(positive());
  cmd->add_option("--block-size", m.block_size, lead + "Context length T")->capture_default_str()->check(positive());
  cmd->add_option("--dropout", m.dropout, lead + "Dropout probability")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.99));
  cmd->add_flag("--bias,!--no-bias", m.bias, lead + "Biases in Linear and LayerNorm layers")->capture_default_str();
  cmd->add_option_function<std::string>(
         "--gelu", [&m](const std::string& name) { m.gelu = *gelu_form_named(name); },
         lead + "The MLP's GELU: exact, x·Φ(x) as nanoGPT's nn.GELU(), or GPT-2's tanh approximation")
      ->check(CLI::IsMember({"exact", "tanh"}))
      ->default_str(gelu_form_name(m.gelu));
}

void add_precision_option(CLI::App* cmd, ProductPrecision& precision) {
  cmd->add_option_function<std::string>(
         "--precision", [&precision](const std::string& name) { precision = parse_precision(name); },
         "Matrix products: f32, or bf16 operands with float32 accumulation on the CPU's bf16 units (AVX512_BF16 or "
         "AMX-BF16); everything else stays float32")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->default_str("f32");
}

void add_train_options(CLI::App* cmd, TrainConfig& c, bool attention_option) {
  add_model_options(cmd, c.model, attention_option, "");
  add_precision_option(cmd, c.precision);
  cmd->add_option("--data", c.data, "UTF-8 text file to train on (default: the bundled Tiny Shakespeare)")
      ->check(existing_file());
  cmd->add_option("--batch-size", c.batch_size, "Sequences per step")->capture_default_str()->check(positive());
  cmd->add_option("--max-iters", c.loop.max_steps, "Training steps")->capture_default_str()->check(non_negative());
  cmd->add_option("--lr", c.learning_rate, "Peak learning rate")->capture_default_str()->check(positive());
  cmd->add_option("--min-lr", c.min_lr, "Learning rate at the end of the cosine decay")
      ->capture_default_str()
      ->check(non_negative());
  cmd->add_option("--warmup-iters", c.warmup_iters, "Linear warm-up steps")
      ->capture_default_str()
      ->check(non_negative());
  cmd->add_option("--lr-decay-iters", c.lr_decay_iters, "Steps of the cosine decay (0: max-iters)")
      ->capture_default_str()
      ->check(non_negative());
  cmd->add_option("--beta1", c.beta1, "AdamW β₁")->capture_default_str()->check(CLI::Range(0.0, 0.999999));
  cmd->add_option("--beta2", c.beta2, "AdamW β₂")->capture_default_str()->check(CLI::Range(0.0, 0.999999));
  cmd->add_option("--weight-decay", c.weight_decay, "Decoupled weight decay on matrices")
      ->capture_default_str()
      ->check(non_negative());
  cmd->add_option("--grad-clip", c.loop.grad_clip, "Clip the global gradient norm to this (0: off)")
      ->capture_default_str()
      ->check(non_negative());
  cmd->add_option("--eval-interval", c.loop.eval_interval, "Evaluate every this many steps")
      ->capture_default_str()
      ->check(positive());
  cmd->add_option("--eval-iters", c.eval_iters, "Fixed batches per split for evaluation")
      ->capture_default_str()
      ->check(positive());
  cmd->add_option("--log-interval", c.loop.log_interval, "Steps between log lines when the output is not a terminal")
      ->capture_default_str()
      ->check(positive());
  cmd->add_option("--sample-tokens", c.sample_tokens, "Characters of sample text at the end")
      ->capture_default_str()
      ->check(non_negative());
  cmd->add_option("--seed", c.seed, "Seed of initialization, batches and sampling")
      ->capture_default_str()
      ->check(non_negative());
  cmd->add_option("--out", c.out_dir, "Directory of run directories")->capture_default_str();
  cmd->add_option("--name", c.name, "Run name, one directory name: files go to OUT/NAME (default: the attention kind)");
  cmd->add_flag("--overwrite", c.loop.overwrite,
                "Start over in OUT/NAME even if it holds a run (without it, such a directory is refused); the run's "
                "files must still not be its --data or --config, nor another run's files");
  cmd->add_flag("-q,--quiet", c.loop.quiet, "No progress output");
  cmd->add_option("--config",
                  "Read options from a file of key = value lines (keys are the long option names; the "
                  "command line overrides them)");
  cmd->add_flag("--detect-anomaly", c.loop.detect_anomaly,
                "Stop at the first NaN or infinity a node produces (forward or backward), naming its op and the step");
}

CLI::App* add_train_subcommand(CLI::App& app, TrainConfig& cfg) {
  CLI::App* cmd =
      app.add_subcommand("train", "Train a GPT on a text file; with no arguments, a small model on Tiny Shakespeare");
  add_train_options(cmd, cfg, true);
  cmd->add_flag("--resume", cfg.loop.resume,
                "Continue the run in OUT/NAME from its checkpoint, exactly where it stopped; the model, the text, "
                "--seed, --batch-size and --precision must be the run's, and --max-iters at least its step (not with "
                "--overwrite)");
  cmd->add_flag("--allow-change", cfg.allow_change,
                "With --resume: let --seed, --batch-size and --precision differ from the run's (the run then goes on "
                "as another would)");
  cmd->add_option("--stop-after", cfg.loop.stop_after,
                  "Stop after this many steps (at least 1) of this call, leaving a checkpoint to --resume from; a "
                  "value past --max-iters runs to the end")
      ->check(positive());
  cmd->add_option("--sharpness-every", cfg.sharpness_every,
                  "Every this many steps, the largest Hessian eigenvalue of the training loss on one fixed batch "
                  "(power iteration on exact Hessian-vector products); printed, and written to OUT/NAME/sharpness.csv "
                  "and sharpness.svg (0: never)")
      ->capture_default_str()
      ->check(non_negative());
  cmd->add_option("--sharpness-iterations", cfg.sharpness_iterations,
                  "Hessian-vector products per sharpness estimate, at most")
      ->capture_default_str()
      ->check(positive());
  cmd->add_flag("--profile", cfg.loop.profile,
                "Time every op (forward, backward) and the work between them; print the table per step at the end "
                "and write it to OUT/NAME/profile.json");
  return cmd;
}

namespace {

// SIGINT or SIGTERM during a run: stored here, and the run ends after the step in progress with a checkpoint (a
// second signal ends the process at once, as by default).
volatile std::sig_atomic_t g_signal = 0;

extern "C" void request_stop(int sig) {
  g_signal = sig;
  std::signal(sig, SIG_DFL);
}

// While a run trains, SIGINT and SIGTERM are taken by a thread that does nothing else. The threads that compute
// block them (the main thread here, the engine's workers always: engine/parallel.cpp): a handler run on a
// computing thread runs on its stack, below the frame of whatever kernel it interrupted, and oneDNN's generated
// kernels do not all survive that (the heap was found corrupted inside a oneDNN product after a SIGINT, now and
// then). The kernel delivers a process-wide signal to a thread that does not block it: this one (or a library's
// idle thread; the handler only stores the signal).
class StopSignals {
 public:
  StopSignals() {
    std::signal(SIGINT, request_stop);
    std::signal(SIGTERM, request_stop);
    taker_ = std::thread([this] {
      std::unique_lock lock(mutex_);
      done_cv_.wait(lock, [this] { return done_; });
    });
    sigset_t set = stop_set();
    pthread_sigmask(SIG_BLOCK, &set, &saved_);
  }
  ~StopSignals() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    done_cv_.notify_one();
    taker_.join();
    std::signal(SIGINT, SIG_DFL);
    std::signal(SIGTERM, SIG_DFL);
    pthread_sigmask(SIG_SETMASK, &saved_, nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  static sigset_t stop_set() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    return set;
  }
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::thread taker_;
  sigset_t saved_{};
};

void add_train_command(CLI::App& app) {
  auto cfg = std::make_shared<TrainConfig>();
  CLI::App* cmd = add_train_subcommand(app, *cfg);
  cmd->callback([cfg] {
    TrainConfig c = *cfg;
    c.config_files = config_files_read();
    c.loop.interrupt = &g_signal;
    const TrainResult r = [&] {
      StopSignals signals;
      return train(c, stdout);
    }();
    if (r.interrupted_by != 0) {  // the shell's convention: 128 + the signal (130 for SIGINT, 143 for SIGTERM)
      std::fflush(stdout);
      const char* what = r.interrupted_by == SIGINT ? "interrupted (SIGINT)" : "terminated (SIGTERM)";
      if (!r.stopped_early)  // the signal came while the finished run sampled
        fmt::print(stderr, "tapegrad: {} while sampling: the run is complete (wrote {}/checkpoint.safetensors)\n", what,
                   r.run_dir);
      else
        fmt::print(stderr, "tapegrad: {} after step {}: wrote {}/checkpoint.safetensors; --resume continues the run\n",
                   what, r.rows.empty() ? 0 : r.rows.back().step + 1, r.run_dir);
      set_exit_code(128 + r.interrupted_by);
    }
  });
}

void add_sample_command(CLI::App& app) {
  auto sc = std::make_shared<SampleConfig>();
  auto path = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand("sample", "Generate text from a checkpoint written by tapegrad train");
  cmd->add_option("--checkpoint", *path, "checkpoint.safetensors of a run")->required()->check(existing_file());
  cmd->add_option("--prompt", sc->prompt,
                  "Text to continue (default: a newline, or the vocabulary's first symbol "
                  "when the text had none)");
  cmd->add_option("--tokens", sc->tokens, "Characters to generate")->capture_default_str()->check(non_negative());
  cmd->add_option("--temperature", sc->temperature, "Softmax temperature")->capture_default_str()->check(positive());
  cmd->add_option("--top-k", sc->top_k, "Sample among the k likeliest characters (0: all)")
      ->capture_default_str()
      ->check(non_negative());
  cmd->add_option("--seed", sc->seed, "Seed of the sampler")->capture_default_str()->check(non_negative());
  cmd->callback([sc, path] { fmt::print("{}\n", sample_from_checkpoint(*path, *sc)); });
}

}  // namespace

void add_training_commands(CLI::App& app) {
  add_train_command(app);
  add_sample_command(app);
}

}  // namespace tapegrad::cli

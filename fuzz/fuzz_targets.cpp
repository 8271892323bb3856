#include "fuzz/fuzz_targets.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include "engine/rng.hpp"
#include "models/checkpoint.hpp"
#include "models/data.hpp"
#include "models/gpt.hpp"
#include "models/trainer.hpp"
#include "checker/formulas/claim.hpp"
#include "checker/formulas/expression.hpp"
#include "ops/ops.hpp"
#include "tools/commands.hpp"

namespace tapegrad::fuzz {

namespace {

[[noreturn]] void violated(const char* invariant) {
  std::fprintf(stderr, "fuzz invariant violated: %s\n", invariant);
  std::abort();
}

std::string_view bytes_of(const uint8_t* data, size_t size) { return {reinterpret_cast<const char*>(data), size}; }

}  // namespace

int checkpoint_input(const uint8_t* data, size_t size) {
  const std::string path = "fuzz.safetensors";
  try {
    const Checkpoint ck = parse_checkpoint(bytes_of(data, size), path);
    for (const auto& nt : ck.tensors)
      if (!nt.tensor.defined() && nt.tensor.numel() != 0) violated("a loaded tensor without data");
    const GPT model = model_from_checkpoint(ck, path);
    if (auto vocab = ck.metadata.find("tapegrad.vocab"); vocab != ck.metadata.end())
      (void)TextData::from_text(vocab->second, 1.0);
    Tape tape;
    NoGradGuard no_grad(tape);
    const int64_t T = std::min<int64_t>(model.config().block_size, 3);
    const Var logits = model.logits(tape, Tensor::zeros(DType::i32, {1, T}));
    if (!(logits.shape() == Shape{1, T, model.config().vocab_size})) violated("logits of the wrong shape");
  } catch (const Error&) {}
  return 0;
}

int config_input(const uint8_t* data, size_t size) {
  std::vector<std::string> args;
  try {
    args = cli::config_file_arguments("fuzz.ini", bytes_of(data, size));
  } catch (const Error&) {
    return 0;
  }
  // The app as tools/main.cpp makes it, with the train subcommand but no action.
  CLI::App app{"fuzz"};
  app.require_subcommand(1);
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  TrainConfig cfg;
  cli::add_train_subcommand(app, cfg);
  args.insert(args.begin(), "train");
  std::reverse(args.begin(), args.end());  // CLI11 takes the arguments last first
  try {
    app.parse(args);
    cfg.validate();
  } catch (const CLI::ParseError&) {
  } catch (const Error&) {
  } catch (const std::out_of_range&) {  // CLI11 2.1's std::stoll on a negated flag's value; main reports it
  }
  return 0;
}

int text_input(const uint8_t* data, size_t size) {
  const std::string_view text = bytes_of(data, size);
  try {
    const TextData d = TextData::from_text(text, 0.9);
    if (d.vocab.empty()) violated("an empty vocabulary for a non-empty text");
    for (size_t i = 1; i < d.vocab.size(); ++i)
      if (!(d.vocab[i - 1] < d.vocab[i])) violated("the vocabulary is not sorted and distinct");
    std::vector<int32_t> ids = d.train;
    ids.insert(ids.end(), d.val.begin(), d.val.end());
    for (int32_t id : ids)
      if (id < 0 || id >= d.vocab_size()) violated("a token id outside the vocabulary");
    if (d.decode(ids) != text) violated("decode(ids) is not the text");
    if (d.encode(text) != ids) violated("encode(text) is not the ids");
    const int64_t T = std::min<int64_t>(8, static_cast<int64_t>(d.train.size()) - 1);
    if (T >= 1) {
      std::vector<int32_t> x(static_cast<size_t>(2 * T)), y(x.size());
      Rng rng(size);
      sample_batch(d.train, 2, T, rng, x.data(), y.data());
      for (int32_t id : x)
        if (id < 0 || id >= d.vocab_size()) violated("a batch token outside the vocabulary");
    }
  } catch (const Error&) {}
  return 0;
}

// A formula's error quotes the text with its control bytes escaped: none but the line breaks between the message,
// the text and the caret, and no NUL to cut the message short where it is read as a C string (it ends with the
// caret).
void check_printable(const ExpressionError& e) {
  const std::string_view what(e.what());
  if (what.empty() || what.back() != '^') violated("an error message cut short");
  for (const char c : what)
    if ((static_cast<unsigned char>(c) < 0x20 && c != '\n') || c == 0x7f)
      violated("a raw control byte in an error message");
}

int formula_input(const uint8_t* data, size_t size) {
  const std::string_view text = bytes_of(data, size);
  try {
    const Formula f = Formula::parse(text, "fuzz");
    std::map<std::string, Shape> shapes;
    for (const std::string& name : f.names()) shapes[name] = Shape{2, 3};
    const Shape out = f.check(shapes);
    Tape tape;
    std::map<std::string, Var> values;
    uint64_t seed = 1;
    for (const auto& [name, shape] : shapes) values[name] = tape.leaf(Tensor::randn(DType::f64, shape, seed++));
    const Var y = f.evaluate(values);
    if (!(y.shape() == out)) violated("evaluate's shape differs from check's");
  } catch (const ExpressionError& e) {
    check_printable(e);
  } catch (const Error&) {}
  try {
    for (const ClaimText& c : parse_claims(text, "fuzz.txt")) {
      int64_t elements = 0;
      for (const InputSpec& in : c.inputs) elements += in.shape.numel();
      if (elements <= 4096) validate_claim(c);
    }
  } catch (const Error&) {}
  return 0;
}

}  // namespace tapegrad::fuzz

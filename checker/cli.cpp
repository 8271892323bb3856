#include "checker/cli.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <functional>
#include <string_view>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "checker/edges.hpp"
#include "checker/explain.hpp"
#include "checker/finding_sheet.hpp"
#include "checker/precision.hpp"
#include "checker/second_order.hpp"
#include "engine/parallel.hpp"

namespace tapegrad {

namespace {

// One op a line, its JVP under its VJP:  softmax  softmax  6 cases   VJP per row: x̄ += ...
//                                                                    JVP per row: ẏ = ...
void list_ops(const Registry& reg, std::FILE* out) {
  for (const OpSheet& op : reg.ops()) {
    const std::string head = fmt::format("{:<16} {:<17} {} case{}   ", op.name, op.family, op.cases.size(),
                                         op.cases.size() == 1 ? " " : "s");
    fmt::print(out, "{}VJP {}\n{:<{}}JVP {}\n", head, op.vjp.empty() ? "(not given)" : op.vjp, "", head.size(),
               op.jvp.empty() ? "(not given)" : op.jvp);
  }
}

void print_diagnosis(const GradcheckReport& r, std::FILE* out) {
  for (const auto& d : r.diagnoses) fmt::print(out, "    {}\n", d.str());
  for (const auto& note : r.notes) fmt::print(out, "    {}\n", note);
}

// The case's edge probes into its report: at the inputs its check ran at, the op's declared edges and the run's
// skipped.
void add_edge_probes(GradcheckReport& r, const OpSheet& op, const GradcheckCase& c, const GradcheckRun& a) {
  const CaseInputs in = case_inputs(c, a.options);
  UndefinedEdges undefined = parse_undefined_edges(op.undefined_edges);
  for (const auto& [edge, what] : parse_undefined_edges(a.undefined_edges)) undefined[edge] = what;
  probe_edges(r, c.build, in.values, in.names, in.options.seed, undefined);
}

constexpr const char* kUsage =
    "usage: {0} [gradcheck] [--op NAME]... [--list] [--kinds] [--json] [-v] [--order 1|2] [--precision f64|f32|bf16]\n"
    "          [--edges] [--undefined-edge EDGE=nan]... [--atol X] [--rtol X] [--eps X] [--seed N]\n"
    "          [--full-jacobian-limit N]\n"
    "Checks each registered op's VJP and JVP against central finite differences in float64; on a failure, says\n"
    "what the error looks like. Exit code 0 when every case passes, 1 when one fails, 2 on a usage error.\n"
    "  --op NAME                only this op (repeatable)\n"
    "  --list                   list the ops, their families, case counts, VJPs and JVPs\n"
    "  --kinds                  list the kinds of finding a report can name, as a Markdown table\n"
    "  --json                   a JSON list of {{op, case, input, check, max_abs_err, max_rel_err, passed}}\n"
    "  -v, --verbose            one row per input and check instead of one per case\n"
    "  --order 2                second order instead: Hessian-vector products against differences of the\n"
    "                           gradient, and the symmetry of the Hessian\n"
    "  --precision P            {1}\n"
    "  --edges                  also run each case's forward and VJP at the edges of its domain (a masked, constant,\n"
    "                           tied, zero, overflowing or tiny row) in float64: NaN or ∞ where the limit is finite,\n"
    "                           x̄ not 0 at ȳ = 0, x̄ away from central differences, each with a line reproducing it\n"
    "  --undefined-edge E=nan   an edge the op defines as undefined (nan, inf or undefined), not probed (repeatable)\n"
    "  --atol X, --rtol X       tolerances (default 1e-5, 1e-3): |analytic − numeric| ≤ atol + rtol·|numeric|\n"
    "  --eps X                  finite-difference step (default 1e-6)\n"
    "  --seed N                 seed of the random inputs and projections\n"
    "  --full-jacobian-limit N  full Jacobian when output size × input size ≤ N (default 40000), else projections\n"
    "       {0} explain OP [--case NAME] [--shape NAME=D,D,...]... [--json]\n"
    "One op on one screen: its forward, VJP and JVP, where they are written, what it keeps and costs at a shape,\n"
    "and its gradcheck there and then (exit 1 if that fails).\n";

// `text` broken into lines of at most `width` characters, every line after the first indented by `indent` spaces.
std::string wrapped(std::string_view text, size_t width, size_t indent) {
  std::string out, line;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find(' ', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view word = text.substr(start, end - start);
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      out += line + "\n" + std::string(indent, ' ');
      line.clear();
    }
    line += (line.empty() ? "" : " ") + std::string(word);
    start = end + 1;
  }
  return out + line;
}

void print_usage(const std::string& program) { fmt::print(kUsage, program, wrapped(precision_option_help(), 87, 27)); }

// The value after option argv[i]; i moves onto it.
std::string_view option_value(int& i, int argc, const char* const* argv) {
  if (i + 1 >= argc) fail("{} needs a value", argv[i]);
  return argv[++i];
}

// `explain OP [--case NAME] [--shape NAME=D,D,...]... [--json]` (argv[0] is "explain").
int explain_main(const Registry& registry, const std::string& program, int argc, const char* const* argv) {
  try {
    std::string op;
    bool json = false;
    ExplainOptions options;
    for (int i = 1; i < argc; ++i) {
      const std::string_view arg = argv[i];
      auto value = [&] { return option_value(i, argc, argv); };
      if (arg == "--help" || arg == "-h") {
        print_usage(program);
        return 0;
      } else if (arg == "--case") {
        options.case_name = value();
      } else if (arg == "--shape") {
        options.shapes.push_back(parse_named_shape("--shape", value()));
      } else if (arg == "--json") {
        json = true;
      } else if (!arg.starts_with("-") && op.empty()) {
        op = arg;
      } else {
        fail("explain: unknown argument '{}' (--help lists the options)", arg);
      }
    }
    if (op.empty()) fail("explain needs an op (gradcheck --list names them)");
    const Explanation e = explain(registry, op, options);
    fmt::print("{}", json ? explanation_json(e).dump(2) + "\n" : format_explanation(e));
    return e.check.passed && e.check_second_order.passed ? 0 : 1;
  } catch (const Error& e) {
    std::fflush(stdout);
    fmt::print(stderr, "{}: error: {}\n", program, e.what());
    return 2;
  }
}

template <class T>
T parse_number(std::string_view flag, std::string_view text) {
  T value{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size()) fail("{}: '{}' is not a number", flag, text);
  return value;
}

using RowStart = std::function<std::string(std::string_view, std::string_view, std::string_view, std::string_view)>;

// `gradcheck --precision f32|bf16`: each case at that precision against float64 (checker/precision.hpp).
int run_at_precision(const std::vector<const OpSheet*>& selected, const GradcheckRun& a, const RowStart& row,
                     std::FILE* out) {
  const ProductPrecision p = *a.precision;
  const auto t0 = std::chrono::steady_clock::now();
  nlohmann::json rows = nlohmann::json::array();
  int cases = 0, failed = 0;
  if (!a.json)
    fmt::print(out, "gradcheck at {}\n{} {:>11} {:>11}  {}\n", precision_header(p), row("op", "case", "input", "check"),
               "max_abs_err", "rounding", "result");
  for (const OpSheet* op : selected)
    for (const auto& c : op->cases) {
      const PrecisionReport r = gradcheck_at_precision(c, p, a.options, op->name);
      ++cases;
      failed += !r.passed;
      if (a.json) {
        for (const PrecisionRow& x : r.rows)
          if (!x.skipped)
            rows.push_back({{"op", op->name},
                            {"case", c.name},
                            {"input", x.input},
                            {"check", x.check},
                            {"precision", precision_name(p)},
                            {"max_abs_err", x.max_err},
                            {"bound", x.bound},
                            {"passed", x.passed}});
        continue;
      }
      if (!r.float64.passed) {
        fmt::print(out, "{} {:>11} {:>11}  FAIL in float64: the reference does not stand\n",
                   row(op->name, c.name, "all", "all"), "", "");
        print_diagnosis(r.float64, out);
        continue;
      }
      const PrecisionRow* closest = nullptr;  // the row nearest its bound
      for (const PrecisionRow& x : r.rows) {
        if (x.skipped) {
          if (a.verbose)
            fmt::print(out, "{} {:>11} {:>11}  skipped (no JVP)\n", row(op->name, c.name, x.input, x.check), "", "");
          continue;
        }
        if (!closest || x.max_err * closest->bound > closest->max_err * x.bound) closest = &x;
        if (a.verbose || !x.passed)
          fmt::print(out, "{} {:>11.2e} {:>11.2e}  {}\n", row(op->name, c.name, x.input, x.check), x.max_err, x.bound,
                     x.passed ? "ok" : "FAIL");
        if (!x.passed) fmt::print(out, "    {}\n", x.line(p));
      }
      if (!a.verbose && r.passed && closest)
        fmt::print(out, "{} {:>11.2e} {:>11.2e}  ok (nearest its bound: {} {})\n", row(op->name, c.name, "all", "all"),
                   closest->max_err, closest->bound, closest->check, closest->input);
      for (const Diagnosis& d : r.diagnoses) fmt::print(out, "    {}\n", d.str());
    }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (a.json) fmt::print(out, "{}\n", rows.dump(2));
  else
    fmt::print(out, "\n{} ops, {} cases at {}: {} passed, {} failed ({:.2f} s)\n", selected.size(), cases,
               precision_name(p), cases - failed, failed, secs);
  return failed ? 1 : 0;
}

}  // namespace

int run_gradcheck(const Registry& reg, const GradcheckRun& a, std::FILE* out) {
  // Gradcheck problems are a few dozen elements: the engine's threads would only add hand-offs (and, on a busy
  // machine, waits for descheduled workers), so the command runs serially and restores the count after.
  struct SerialEngine {
    int saved = num_threads();
    SerialEngine() { set_num_threads(1); }
    ~SerialEngine() { set_num_threads(saved); }
  } serial;
  if (a.list) {
    list_ops(reg, out);
    return 0;
  }
  if (a.kinds) {
    fmt::print(out, "{}", finding_kinds_table());
    return 0;
  }
  std::vector<const OpSheet*> selected;
  for (const auto& name : a.ops) {
    const OpSheet* op = reg.find(name);
    if (!op) fail("gradcheck: no op named '{}' (gradcheck --list shows them)", name);
    selected.push_back(op);
  }
  if (selected.empty())
    for (const auto& op : reg.ops()) selected.push_back(&op);

  // Columns as wide as the longest op and case name: at least 16 and 22, at most 24 and 32 (longer names overflow).
  size_t wo = 16, wc = 22;
  for (const OpSheet* op : selected) {
    wo = std::clamp(op->name.size(), wo, size_t{24});
    for (const auto& c : op->cases) wc = std::clamp(c.name.size(), wc, size_t{32});
  }
  auto row = [&](std::string_view op, std::string_view c, std::string_view input, std::string_view check) {
    return fmt::format("{:<{}} {:<{}} {:<8} {:<10}", op, wo, c, wc, input, check);
  };
  if (a.precision && a.edges) fail("gradcheck: --edges probes in float64; give it without --precision");
  if (a.precision) return run_at_precision(selected, a, row, out);

  auto t0 = std::chrono::steady_clock::now();
  nlohmann::json rows = nlohmann::json::array();
  int cases = 0, failed = 0, not_checked = 0, undeclared = 0;  // undeclared: not checked, and not at a declared kink
  if (!a.json)
    fmt::print(out, "{} {:>11} {:>11}  {}\n", row("op", "case", "input", "check"), "max_abs_err", "max_rel_err",
               "result");
  for (const OpSheet* op : selected) {
    for (const auto& c : op->cases) {
      GradcheckReport r =
          a.order == 2 ? gradcheck_second_order(c, a.options, op->name) : gradcheck(c, a.options, op->name);
      if (a.edges) add_edge_probes(r, *op, c, a);
      ++cases;
      const bool unchecked = !r.passed.not_checked.empty();  // every check skipped: neither passed nor failed
      failed += !r.passed && !unchecked;
      not_checked += unchecked;
      undeclared += unchecked && !c.at_kink;
      bool skipped = false;
      for (const auto& ch : r.checks) {
        skipped = skipped || ch.skipped;
        if (a.json) {
          if (ch.skipped) continue;
          rows.push_back({{"op", op->name},
                          {"case", c.name},
                          {"input", ch.input},
                          {"check", ch.check},
                          {"max_abs_err", ch.max_abs_err},
                          {"max_rel_err", ch.max_rel_err},
                          {"passed", ch.passed}});
        } else if (ch.skipped && a.verbose) {
          fmt::print(out, "{} {:>11} {:>11}  skipped ({})\n", row(op->name, c.name, ch.input, ch.check), "", "",
                     ch.worst.empty() ? "no JVP" : ch.worst);
        } else if (!ch.skipped && (a.verbose || !ch.passed)) {
          fmt::print(out, "{} {:>11.2e} {:>11.2e}  {}{}\n", row(op->name, c.name, ch.input, ch.check), ch.max_abs_err,
                     ch.max_rel_err, ch.passed ? "ok" : "FAIL at ", ch.passed ? "" : ch.worst);
        }
      }
      if (a.json) continue;
      if (unchecked && !a.verbose) {
        fmt::print(out, "{} {:>11} {:>11}  not checked: {}\n", row(op->name, c.name, "all", "all"), "", "",
                   r.passed.not_checked);
        continue;
      }
      if (!a.verbose && r.passed) {
        double worst = 0;
        for (const auto& ch : r.checks)
          if (!ch.skipped && (ch.check == "vjp" || ch.check == "jvp" || ch.check == "hvp"))
            worst = std::max(worst, ch.max_abs_err);
        std::string note;
        if (skipped) note = " (no JVP)";  // a passed case with a skipped check: first order, no JVP
        fmt::print(out, "{} {:>11.2e} {:>11}  ok{}\n", row(op->name, c.name, "all", "all"), worst, "", note);
      }
      if (!r.passed || a.verbose) print_diagnosis(r, out);
    }
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (a.json) fmt::print(out, "{}\n", rows.dump(2));
  else
    fmt::print(out, "\n{} ops, {} cases: {} passed, {} failed{} ({:.2f} s)\n", selected.size(), cases,
               cases - failed - not_checked, failed,
               not_checked ? fmt::format(", {} not checked", not_checked) : std::string(), secs);
  // A case registered at a kink is declared uncheckable at second order; any other case with nothing compared fails.
  return failed || undeclared ? 1 : 0;
}

std::optional<ProductPrecision> parse_check_precision(std::string_view name) {
  if (name != "f64" && name != "f32" && name != "bf16") fail("--precision '{}': expected f64, f32 or bf16", name);
  if (name == "f64") return std::nullopt;
  return parse_precision(std::string(name));
}

std::string precision_option_help() {
  return fmt::format(
      "f64 (the default): the float64 check alone. f32, bf16: each case's float64 check, then its VJP and JVP run in "
      "float32 tensors with float32 (f32) or bf16 (bf16: every product's operands rounded to bfloat16, whatever its "
      "size) products, against the same node in float64 on the same rounded inputs; a rule passes when its error is "
      "within {}x how far float64 moves when its inputs, values and products are rounded at that precision "
      "(measured, {} seeds). bf16 needs AVX512_BF16 or AMX-BF16 and oneDNN (exit 1 saying what is missing)",
      kBoundMultiple, kRoundingSeeds);
}

std::string precision_refusal(const GradcheckRun& run) {
  if (run.precision != ProductPrecision::bf16) return "";
  const std::string why = bf16_unavailable_reason();
  return why.empty() ? "" : "--precision bf16: " + why;
}

int gradcheck_main(const Registry& registry, int argc, const char* const* argv) {
  const std::string program = argc > 0 && argv[0] ? argv[0] : "gradcheck";
  GradcheckRun run;
  try {
    int i = 1;
    if (i < argc && std::string_view(argv[i]) == "explain") return explain_main(registry, program, argc - 1, argv + 1);
    if (i < argc && std::string_view(argv[i]) == "gradcheck") ++i;
    for (; i < argc; ++i) {
      const std::string_view arg = argv[i];
      auto value = [&] { return option_value(i, argc, argv); };
      if (arg == "--help" || arg == "-h") {
        print_usage(program);
        return 0;
      } else if (arg == "--op") {
        run.ops.emplace_back(value());
      } else if (arg == "--list") {
        run.list = true;
      } else if (arg == "--kinds") {
        run.kinds = true;
      } else if (arg == "--json") {
        run.json = true;
      } else if (arg == "-v" || arg == "--verbose") {
        run.verbose = true;
      } else if (arg == "--atol" || arg == "--rtol" || arg == "--eps") {
        const double x = parse_number<double>(arg, value());
        (arg == "--atol" ? run.options.atol : arg == "--rtol" ? run.options.rtol : run.options.eps) = x;
      } else if (arg == "--order") {
        run.order = parse_number<int>(arg, value());
        if (run.order != 1 && run.order != 2) fail("--order must be 1 or 2, got {}", run.order);
      } else if (arg == "--precision") {
        run.precision = parse_check_precision(value());
      } else if (arg == "--edges") {
        run.edges = true;
      } else if (arg == "--undefined-edge") {
        run.undefined_edges.emplace_back(value());
      } else if (arg == "--seed") {
        run.options.seed = parse_number<uint64_t>(arg, value());
      } else if (arg == "--full-jacobian-limit") {
        run.options.full_jacobian_limit = parse_number<int64_t>(arg, value());
      } else {
        fail("unknown argument '{}' (--help lists the options)", arg);
      }
    }
    validate(run.options);
    parse_undefined_edges(run.undefined_edges);
    if (const std::string why = precision_refusal(run); !why.empty()) {
      fmt::print(stderr, "{}: error: {}\n", program, why);
      return 1;
    }
    return run_gradcheck(registry, run);
  } catch (const Error& e) {
    std::fflush(stdout);
    fmt::print(stderr, "{}: error: {}\n", program, e.what());
    return 2;
  }
}

}  // namespace tapegrad

// tapegrad's Python module, _tapegrad (wrapped by the package tapegrad/, python/tapegrad/__init__.py): the C++
// gradchecker on a Python op (python/python_function.hpp), its report as Python objects, and the engine
// (python/engine_bindings.cpp). tapegrad::Error becomes tapegrad.Error, a ValueError, with the C++ message.
#include <algorithm>
#include <optional>

#include <pybind11/stl.h>

#include "checker/finding_sheet.hpp"
#include "checker/jacobian.hpp"
#include "checker/second_order.hpp"
#include "checker/formulas/claim.hpp"
#include "checker/formulas/edits.hpp"
#include "inspect/process_memory.hpp"
#include "python/engine_bindings.hpp"
#include "python/numpy_tensor.hpp"
#include "python/python_function.hpp"

namespace tapegrad::python {

namespace {

Finding finding_or_fail(std::string_view kind) {
  if (auto f = finding_named(kind)) return *f;
  fail("no finding kind '{}' (tapegrad.finding_kinds() lists them)", kind);
}

// The op's backward as formulas at (x, ȳ), from impl.vjp_formulas (tapegrad/_trace.py): {"lets": [(name,
// formula, label)], "vjp": [formula or None per input], "constants": {name: array}}, or None, or a str saying why
// the backward could not be written (kept in why_not).
std::optional<VjpFormulas> vjp_formulas_of(const py::object& impl, std::span<const Tensor> x, const Tensor& g,
                                           const std::vector<std::string>& names, std::string& why_not) {
  py::list arrays;
  for (const Tensor& xi : x) arrays.append(copy_to_numpy(xi));
  const py::object got = impl.attr("vjp_formulas")(arrays, copy_to_numpy(g), names);
  if (got.is_none()) return std::nullopt;
  if (py::isinstance<py::str>(got)) {
    why_not = got.cast<std::string>();
    return std::nullopt;
  }
  VjpFormulas formulas;
  for (const py::handle let : got["lets"]) {
    const auto [name, formula, label] = let.cast<std::tuple<std::string, std::string, std::string>>();
    formulas.lets.push_back({name, formula, label});
  }
  size_t i = 0;
  for (const py::handle v : got["vjp"]) {
    if (v.is_none()) formulas.vjp.emplace_back();
    else formulas.vjp.push_back(ClaimText::Line{names.at(i), v.cast<std::string>(), ""});
    ++i;
  }
  for (const auto& [name, value] : got["constants"].cast<py::dict>())
    formulas.constants.emplace(name.cast<std::string>(),
                               view_of(py::reinterpret_borrow<py::object>(value), "gradcheck").to(DType::f64));
  return formulas;
}

// Runs the first- or second-order check of a Python op at float64 inputs (arrays, copied into the checker).
GradcheckReport check(const py::object& impl, const std::string& name, const py::list& inputs,
                      const std::vector<std::string>& names, int order, const GradcheckOptions& options) {
  if (order != 1 && order != 2) fail("gradcheck: order must be 1 or 2, got {}", order);
  std::vector<Tensor> xs;
  for (const py::handle input : inputs) {
    const Tensor view = view_of(py::reinterpret_borrow<py::object>(input), "gradcheck");
    xs.push_back(view.to(DType::f64));
  }
  const PythonOp op{impl, name, order == 2};
  const Function f = python_function(op);
  const std::unique_ptr<RuleBlocks> blocks = python_blocks(op);
  GradcheckReport report = order == 2 ? gradcheck_second_order(f, xs, names, options, blocks.get())
                                      : gradcheck(f, xs, names, options, blocks.get());
  report.op = name;
  if (order == 1 && options.diagnose && !report.passed && py::hasattr(impl, "vjp_formulas")) {
    std::string why_not;
    diagnose_by_edits(report, {f, xs, names, options, blocks.get()}, [&](std::span<const Tensor> x, const Tensor& g) {
      return vjp_formulas_of(impl, x, g, names, why_not);
    });
    // Without formulas no edit was tried: the first "no known kind" says why, so that the op or line the trace
    // could not follow can be seen (and written otherwise).
    if (!why_not.empty())
      for (Diagnosis& d : report.diagnoses)
        if (d.kind == Finding::unexplained && d.check == "vjp") {
          d.message += fmt::format(" ({}; no edit of the backward was tried)", why_not);
          break;
        }
  }
  return report;
}

// A diagnosis found in Python (tapegrad/_forward.py) added to a report made here, where the kinds' sheets put it
// (add_finding, checker/finding_sheet.hpp).
void add_diagnosis(GradcheckReport& report, std::string_view kind, const std::string& input, const std::string& check,
                   const std::string& message, std::optional<double> factor) {
  add_finding(report, Diagnosis{finding_or_fail(kind), input, check, message, false, factor});
}

// The claims of a text in the format of docs/claims/README.md, each checked as `tapegrad claim` does.
std::vector<GradcheckReport> check_claims(const std::string& text, const GradcheckOptions& options) {
  const std::vector<ClaimText> claims = parse_claims(text, "the claim text");
  if (claims.empty()) fail("claim: the text holds no claim block (claim NAME, input ..., forward ..., vjp ...)");
  // As `tapegrad claim`: each claim's memory estimate against what may be used (TAPEGRAD_MEMORY_LIMIT included),
  // before its inputs are drawn.
  for (const ClaimText& c : claims) require_claim_memory(c);
  std::vector<GradcheckReport> reports;
  py::gil_scoped_release nogil;
  for (const ClaimText& c : claims) reports.push_back(check_claim(c, options));
  return reports;
}

// A report amended by the Python side (tapegrad/_gradcheck.py), for what only Python can check of a torch op: a
// row added (the backward at ȳ = 0), a diagnosis added or dropped, and the reports of a multi-output op's outputs
// merged into one whose rows name the output (input "x→y1"). Each recomputes the verdict.
// A row is a dict: input, check, mode, passed, error (its max_abs_err), worst (where), analytic and numeric (the
// two values there), and sides, what those two are as a failing row prints them ("analytic", "numeric" when absent).
void add_check(GradcheckReport& r, const py::dict& row) {
  const auto sides = row.contains("sides") ? row["sides"].cast<std::pair<std::string, std::string>>()
                                           : std::pair<std::string, std::string>("analytic", "numeric");
  const double error = row["error"].cast<double>();
  r.checks.push_back({row["input"].cast<std::string>(), row["check"].cast<std::string>(),
                      row["mode"].cast<std::string>(), error, error, row["worst"].cast<std::string>(),
                      row["analytic"].cast<double>(), row["numeric"].cast<double>(), row["passed"].cast<bool>(), false,
                      1, sides.first, sides.second});
  r.conclude();
}

// The diagnoses of one kind, of one input where `input` is given.
void drop_diagnoses(GradcheckReport& r, std::string_view kind, const std::optional<std::string>& input) {
  const Finding f = finding_or_fail(kind);
  std::erase_if(r.diagnoses, [&](const Diagnosis& d) { return d.kind == f && (!input || d.input == *input); });
  r.conclude();
}

// Advice in the diagnoses' messages reworded for the Python user (a C++ API named in it, say).
void reword(GradcheckReport& r, const std::string& from, const std::string& to) {
  for (Diagnosis& d : r.diagnoses)
    for (size_t at = d.message.find(from); at != std::string::npos; at = d.message.find(from, at + to.size()))
      d.message.replace(at, from.size(), to);
  r.conclude();
}

GradcheckReport merged(const std::vector<GradcheckReport>& parts, const std::vector<std::string>& outputs,
                       const std::string& op) {
  if (parts.size() != outputs.size()) fail("gradcheck: {} reports for {} outputs", parts.size(), outputs.size());
  GradcheckReport r;
  r.op = op;
  auto labelled = [](const std::string& input, const std::string& output) {
    return input.empty() ? input : input + "→" + output;
  };
  for (size_t i = 0; i < parts.size(); ++i) {
    for (CheckResult c : parts[i].checks) {
      c.input = labelled(c.input, outputs[i]);
      r.checks.push_back(std::move(c));
    }
    for (Diagnosis d : parts[i].diagnoses) {
      if (d.input.empty()) d.message = outputs[i] + ": " + d.message;
      d.input = labelled(d.input, outputs[i]);
      r.diagnoses.push_back(std::move(d));
    }
  }
  r.conclude();
  return r;
}

// The report's text, with the Python side's notes (a list of str in `_notes`) under its title line.
std::string report_text(const py::object& self) {
  std::string text = self.cast<const GradcheckReport&>().str();
  if (!py::hasattr(self, "_notes")) return text;
  std::string notes;
  for (const py::handle note : self.attr("_notes")) notes += "  " + note.cast<std::string>() + "\n";
  const size_t title_end = text.find('\n') + 1;
  return text.insert(title_end, notes);
}

void bind_report(py::module_& m) {
  py::class_<CheckResult>(m, "Check", "One row of the report: one check of one input")
      .def_readonly("input", &CheckResult::input)
      .def_readonly("check", &CheckResult::check)
      .def_readonly("mode", &CheckResult::mode)
      .def_readonly("max_abs_err", &CheckResult::max_abs_err)
      .def_readonly("max_rel_err", &CheckResult::max_rel_err)
      .def_readonly("worst", &CheckResult::worst)
      .def_readonly("analytic", &CheckResult::analytic)
      .def_readonly("numeric", &CheckResult::numeric)
      .def_readonly("analytic_is", &CheckResult::analytic_is)
      .def_readonly("numeric_is", &CheckResult::numeric_is)
      .def_readonly("passed", &CheckResult::passed)
      .def_readonly("skipped", &CheckResult::skipped)
      .def("__repr__", [](const CheckResult& c) {
        return fmt::format("Check(input='{}', check='{}', mode='{}', max_abs_err={:.3g}, passed={}{})", c.input,
                           c.check, c.mode, c.max_abs_err, c.passed ? "True" : "False", c.skipped ? ", skipped" : "");
      });
  py::class_<Diagnosis>(m, "Diagnosis", "What a failure looks like: one finding, with the numbers that back it")
      .def_property_readonly("kind", [](const Diagnosis& d) { return std::string(finding_key(d.kind)); })
      .def_property_readonly("title", [](const Diagnosis& d) { return std::string(finding_name(d.kind)); })
      .def_readonly("input", &Diagnosis::input)
      .def_readonly("check", &Diagnosis::check)
      .def_readonly("message", &Diagnosis::message)
      .def_readonly("factor", &Diagnosis::factor, "c where the finding is A = c·N (a scale), else None")
      .def("__str__", &Diagnosis::str)
      .def("__repr__", [](const Diagnosis& d) { return "<Diagnosis " + d.str() + ">"; });
  // dynamic_attr: the Python side may set `_notes`, lines printed under the title (how forward mode was checked).
  py::class_<GradcheckReport>(m, "Report", py::dynamic_attr(),
                              "The gradchecker's report: the checks, the diagnosis, the verdict")
      .def_readonly("op", &GradcheckReport::op)
      .def_readonly("checks", &GradcheckReport::checks)
      .def_readonly("diagnoses", &GradcheckReport::diagnoses)
      .def_property_readonly("passed", [](const GradcheckReport& r) { return r.passed.ok; })
      .def("__bool__", [](const GradcheckReport& r) { return r.passed.ok; })
      .def_property_readonly("kinds",
                             [](const GradcheckReport& r) {
                               std::vector<std::string> kinds;
                               for (const Diagnosis& d : r.diagnoses) kinds.emplace_back(finding_key(d.kind));
                               return kinds;
                             })
      .def(
          "has",
          [](const GradcheckReport& r, std::string_view kind, std::string_view input) {
            return r.has(finding_or_fail(kind), input);
          },
          py::arg("kind"), py::arg("input") = "", "Whether a diagnosis of that kind (for that input) is in the report")
      .def("__str__", &report_text)
      .def("__repr__", &report_text);
  m.def("_add_check", &add_check, py::arg("report"), py::arg("row"));
  m.def("_add_diagnosis", &add_diagnosis, py::arg("report"), py::arg("kind"), py::arg("input"), py::arg("check"),
        py::arg("message"), py::arg("factor") = py::none());
  m.def("_drop_diagnoses", &drop_diagnoses, py::arg("report"), py::arg("kind"), py::arg("input") = py::none());
  m.def("_reword", &reword, py::arg("report"), py::arg("old"), py::arg("new"));
  m.def("_merge", &merged, py::arg("reports"), py::arg("outputs"), py::arg("op"));
  m.def("finding_kinds", [] {
    std::vector<std::string> kinds;
    for (const Finding f : all_findings()) kinds.emplace_back(finding_key(f));
    return kinds;
  });
  // A factor as the reports write it: "0.125 = 1/8", "1.41421 = √2".
  m.def("_describe_factor", &gradcheck_detail::describe_factor, py::arg("c"));
  // The kinds whose finding names its input's failure (FindingSheet::explains).
  m.def("_explaining_kinds", [] {
    std::vector<std::string> kinds;
    for (const Finding f : all_findings())
      if (finding_sheet(f)->explains) kinds.emplace_back(f.key());
    return kinds;
  });
}

}  // namespace

}  // namespace tapegrad::python

PYBIND11_MODULE(_tapegrad, m) {
  using namespace tapegrad;
  using namespace tapegrad::python;
  m.doc() = "tapegrad's C++ core: the diagnosing gradchecker on Python ops, and the engine";
  m.attr("__version__") = TAPEGRAD_VERSION;  // the library's version, as `tapegrad --version` prints it
  static py::exception<Error> error(m, "Error", PyExc_ValueError);
  static py::exception<NoJvp> no_jvp(m, "NoJvp", error.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const NoJvp& e) {
      no_jvp(e.what());
    } catch (const Error& e) {
      error(e.what());
    } catch (const OutOfMemory& e) {
      PyErr_SetString(PyExc_MemoryError, e.what());
    }
  });
  bind_report(m);
  m.def("_check", &check, py::arg("impl"), py::arg("name"), py::arg("inputs"), py::arg("names"), py::arg("order"),
        py::arg("options"));
  m.def("_claim", &check_claims, py::arg("text"), py::arg("options"));
  // The CLI's refusal of work whose memory estimate exceeds what is available (inspect/process_memory.hpp).
  m.def("_require_memory", &require_memory, py::arg("bytes"), py::arg("what"), py::arg("advice"));
  py::class_<GradcheckOptions>(m, "_Options")
      .def(py::init<>())
      .def_readwrite("eps", &GradcheckOptions::eps)
      .def_readwrite("atol", &GradcheckOptions::atol)
      .def_readwrite("rtol", &GradcheckOptions::rtol)
      .def_readwrite("full_jacobian_limit", &GradcheckOptions::full_jacobian_limit)
      .def_readwrite("projections", &GradcheckOptions::projections)
      .def_readwrite("seed", &GradcheckOptions::seed)
      .def_readwrite("diagnose", &GradcheckOptions::diagnose)
      .def_readwrite("rounding", &GradcheckOptions::rounding);
  bind_engine(m);
}

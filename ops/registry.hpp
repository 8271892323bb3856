// The op registry: the sheets of the ops a program knows (ops/sheet.hpp: name, forward, derivatives,
// derivation sections, cost, gradcheck cases), which `tapegrad gradcheck`, explain, the profile and the test suite
// read; a test fails for an op without a case. The built-in ops' sheets are the sheet functions of the files of
// ops/, listed by the build (ops/all_ops.hpp).
//
// The same API serves ops defined outside tapegrad, in a user's own file (examples/custom-op/ is one):
//   node       y = tape.empty(...) + forward; tape.record(name, inputs, y, vjp, jvp, second)  (engine/tape.hpp)
//              vjp: (const Tensor& ȳ, span of x̄) adds J_iᵀȳ into each defined x̄_i;
//              jvp: (span of ẋ, const Tensor& ẏ) adds Σ_i J_i ẋ_i into ẏ (skip undefined ẋ_i).
//              An op without a forward-mode rule passes no_jvp(name) as its jvp (engine/no_jvp.hpp).
//   sheet      std::vector<OpSheet> my_ops() { return {{.name = ..., .family = ..., .forward = ..., .vjp = ...,
//              .jvp = ..., .second_order = ..., .cases = {{case, inputs, build}}}}; }  (ops/sheet.hpp)
//   register   Registry registry{my_ops()};  or  registry.add(my_ops());
//   by name    .inputs = 2, .call = [](std::span<const Var> x, const OpArgs& a) { ... } in its sheet:
//              registry.call("my_op", inputs, args) (Tape.op from Python calls the built-in ops so)
//   claim      claimed({name, forward, vjp, jvp, hvp}) registers like an op: a forward with the derivatives a paper
//              claims (checker/claimed.hpp).
//   check      gradcheck(f, inputs) (checker/gradcheck.hpp); gradcheck_main(registry, argc, argv) makes a program
//              of one's own ops answer `gradcheck --op NAME` as tapegrad does (checker/cli.hpp).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "../engine/no_jvp.hpp"
#include "../engine/source_place.hpp"
#include "sheet.hpp"
#include "../engine/tape.hpp"

namespace tapegrad {

// "ops/softmax.cpp:96": a source location from the repository's top folder on (engine/, ops/, inspect/,
// checker/, models/, tools/, tests/, examples/, fuzz/) where its path has one; "?" for an unknown location.
std::string source_text(const SourcePlace& where);

class Registry {
 public:
  Registry() = default;
  // The sheets of a few families at once: Registry{arithmetic_ops(), my_ops()}.
  Registry(std::initializer_list<std::vector<OpSheet>> sheets);
  void add(std::vector<OpSheet> sheets);  // throws naming an op registered twice or left without a name
  void add(OpSheet op, SourcePlace where = SourcePlace::current());
  void add_case(std::string_view op, GradcheckCase c);
  const std::vector<OpSheet>& ops() const { return ops_; }
  const OpSheet* find(std::string_view name) const;
  // The op `name` called by name (OpSheet::call, as Tape.op from Python does) on its inputs with keyword arguments.
  // Refuses, naming the op: one the registry does not have or that has no call, a count of inputs it does not take,
  // an input no longer live; an Error from the op gets "NAME on shapes (..), (..): " in front.
  Var call(std::string_view name, std::span<const Var> inputs, OpArgs args) const;
  std::vector<std::string> callable() const;  // the names of the ops with a call, sorted

 private:
  std::vector<OpSheet> ops_;
};

// Inputs for a case, drawn from a seeded generator in the given float dtype.
std::vector<Tensor> make_inputs(std::span<const InputSpec> specs, DType dtype, uint64_t seed);

// A case's map written with the primitive ops it replaces (`tapegrad graph --unfused`): the case's own form, else the
// op's, where its value at xs is the case's to 1e-12 relative (the op's form is written at its first case's
// options); empty where the op and the case have none, or where it is not the case's map at xs.
Function unfused_form_at(const OpSheet& op, const GradcheckCase& c, std::span<const Tensor> xs);

}  // namespace tapegrad

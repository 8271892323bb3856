// Parameters and modules: what a model is made of, apart from the tape that differentiates it.
//
// A Parameter is a named tensor with its gradient. Tensors are shared handles, so a copy of a Parameter reads and
// writes the same numbers: a module, its parent, an optimizer and a checkpoint writer all hold the same weights.
// A Module lists its parameters under full dotted names, as PyTorch's named_parameters() does
// (transformer.h.0.attn.c_attn.weight): a layer named "transformer.h.0.attn.c_attn" owns
// "transformer.h.0.attn.c_attn.weight", and a parent that adopts it lists that parameter after its own earlier ones.
// The forward pass puts the weights on a tape with tape.param(value, grad) each time it runs; backward adds into
// the grads, which outlive the tape's clear(); zero_grad() resets them.
//
//   MLP mlp("mlp", {2, 16, 16, 2}, 42);          // models/layers.hpp
//   for (const Parameter& p : mlp.parameters()) fmt::print("{} {}\n", p.name, p.value.shape());
//   //   mlp.0.weight (16, 2)  mlp.0.bias (16)  mlp.1.weight (16, 16) ...
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "../engine/tape.hpp"

namespace tapegrad {

struct Parameter {
  std::string name;  // the full dotted name, e.g. transformer.h.0.attn.c_attn.weight
  Tensor value, grad;
  bool decay;  // weight decay applies (matrices and embeddings, not norms or biases)

  Var on(Tape& tape) const { return tape.param(value, grad); }
};

class Module {
 public:
  explicit Module(std::string name = {}) : name_(std::move(name)) {}
  virtual ~Module() = default;
  Module(Module&&) = default;
  Module& operator=(Module&&) = default;
  Module(const Module&) = delete;  // a copy would share the weights under a second owner: copy parameters() instead
  Module& operator=(const Module&) = delete;

  // The module's full name ("" for a top-level model) and the name of a part of it: child("c_fc") is
  // "transformer.h.0.mlp.c_fc" in the module "transformer.h.0.mlp", and "c_fc" in a module without a name.
  const std::string& name() const { return name_; }
  std::string child(std::string_view part) const;

  // Every parameter, its own and its children's, in the order they were made.
  std::vector<Parameter>& parameters() { return params_; }
  const std::vector<Parameter>& parameters() const { return params_; }
  // The parameter called `name` (its full name); throws an Error naming the module and the name.
  Parameter& parameter(std::string_view name);
  const Parameter& parameter(std::string_view name) const;
  // Number of scalars in all parameters.
  int64_t num_parameters() const;
  void zero_grad();

 protected:
  // A new parameter called child(part), holding `value` (see the init_* functions below), with a zero gradient.
  Parameter& add_parameter(std::string_view part, Tensor value, bool decay);
  // Lists a part's parameters (the part keeps its own list too); returns how many, which a caller seeding its parts
  // one after another adds to its seed.
  size_t adopt(const Module& part);
  // An Error about an input of the wrong shape: "<name>: input of shape <got>: <expected>".
  [[noreturn]] void bad_input(const Shape& got, std::string_view expected) const;

 private:
  std::string name_;
  std::vector<Parameter> params_;
};

}  // namespace tapegrad

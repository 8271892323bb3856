#include "models/module.hpp"

#include "engine/rng.hpp"

namespace tapegrad {

std::string Module::child(std::string_view part) const {
  return name_.empty() ? std::string(part) : name_ + "." + std::string(part);
}

Parameter& Module::parameter(std::string_view name) {
  for (auto& p : params_)
    if (p.name == name) return p;
  fail("{} has no parameter named '{}'", name_.empty() ? std::string("the model") : "module '" + name_ + "'", name);
}

const Parameter& Module::parameter(std::string_view name) const { return const_cast<Module*>(this)->parameter(name); }

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : params_) n += p.value.numel();
  return n;
}

void Module::zero_grad() {
  for (auto& p : params_) p.grad.fill_zero();
}

Parameter& Module::add_parameter(std::string_view part, Tensor value, bool decay) {
  params_.push_back({child(part), value, Tensor::zeros(DType::f32, value.shape()), decay});
  return params_.back();
}

size_t Module::adopt(const Module& part) {
  params_.insert(params_.end(), part.params_.begin(), part.params_.end());
  return part.params_.size();
}

void Module::bad_input(const Shape& got, std::string_view expected) const {
  fail("{}: input of shape {}: {}", name_.empty() ? std::string("module") : name_, got, expected);
}

}  // namespace tapegrad

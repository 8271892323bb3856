#include "engine/registry.hpp"

#include "engine/rng.hpp"

namespace tapegrad {

void Registry::add(OpInfo op) {
  if (op.name.empty()) fail("registry: an op needs a name");
  if (find(op.name)) fail("registry: op '{}' is registered twice", op.name);
  ops_.push_back(std::move(op));
}

void Registry::add_case(std::string_view op, GradcheckCase c) {
  for (auto& o : ops_)
    if (o.name == op) {
      o.cases.push_back(std::move(c));
      return;
    }
  fail("registry: gradcheck case '{}' names op '{}', which is not registered", c.name, op);
}

const OpInfo* Registry::find(std::string_view name) const {
  for (const auto& o : ops_)
    if (o.name == name) return &o;
  return nullptr;
}

std::vector<Tensor> make_inputs(std::span<const InputSpec> specs, DType dtype, uint64_t seed) {
  Rng rng(seed);
  std::vector<Tensor> xs;
  for (const InputSpec& s : specs) {
    if (s.fill == Fill::indices) {
      if (s.index_bound <= 0) fail("input '{}': indices need a positive index_bound", s.name);
      Tensor t = Tensor::empty(DType::i32, s.shape);
      auto* p = t.data<int32_t>();
      for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<int32_t>(rng.below(s.index_bound));
      xs.push_back(t);
      continue;
    }
    Tensor t = Tensor::empty(DType::f64, s.shape);
    auto* p = t.data<double>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      switch (s.fill) {
        case Fill::normal: p[i] = rng.normal(); break;
        case Fill::positive: p[i] = rng.uniform(0.5, 2.0); break;
        case Fill::away_from_zero: p[i] = (rng.uniform() < 0.5 ? -1 : 1) * rng.uniform(0.2, 2.0); break;
        case Fill::zeros: p[i] = 0; break;
        case Fill::indices: break;
      }
    }
    xs.push_back(dtype == DType::f64 ? t : t.to(dtype));
  }
  return xs;
}

}  // namespace tapegrad

// A small seeded generator (splitmix64 + Box–Muller): the same numbers on every platform and library,
// so that runs and gradcheck inputs reproduce exactly.
#pragma once

#include <cmath>
#include <cstdint>

namespace tapegrad {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0x7a9e6d) : state_(seed) {}
  uint64_t next_u64() { return mix(state_ += kStep); }
  double uniform() { return unit(next_u64()); }  // [0, 1)
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  int64_t below(int64_t n) { return static_cast<int64_t>(next_u64() % static_cast<uint64_t>(n)); }
  double normal() {
    const double u1 = uniform(), u2 = uniform();
    return box_muller(u1, u2);
  }
  uint64_t state() const { return state_; }
  void set_state(uint64_t s) { state_ = s; }

  // splitmix64 is a counter: the k-th next_u64() from state s is mix(s + k·kStep), so the draws of a tensor can be
  // made in any order, on any thread, and agree bit for bit with one made by one. ahead(k) is that k-th value (k ≥ 1)
  // without moving the generator; skip(n) moves it past n draws.
  uint64_t ahead(uint64_t k) const { return mix(state_ + k * kStep); }
  void skip(uint64_t n) { state_ += n * kStep; }
  static double unit(uint64_t z) { return static_cast<double>(z >> 11) * 0x1.0p-53; }  // [0, 1)
  // Box–Muller: a standard normal from two uniforms in [0, 1).
  static double box_muller(double u1, double u2) {
    return std::sqrt(-2.0 * std::log1p(-u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  static constexpr uint64_t kStep = 0x9e3779b97f4a7c15ULL;
  static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  uint64_t state_;
};

}  // namespace tapegrad

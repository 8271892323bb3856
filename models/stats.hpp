// Summary statistics of timings, shared by the trainer and the bench.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace tapegrad {

// The median of v: the middle value when v.size() is odd, the mean of the two middle values when even; NaN when v
// is empty (no value to summarize, rather than a time of 0).
inline double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace tapegrad

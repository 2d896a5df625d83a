#include "runtime/metrics.h"

#include <algorithm>

namespace klinear {

void Histogram::observe(double v) {
  const size_t bucket = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  ++counts_[bucket];
  sum_ += v;
  ++count_;
}

std::vector<double> latency_buckets_s() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};
}

std::vector<double> step_buckets_s() {
  return {0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2, 5};
}

const char* step_kind_name(StepKind k) {
  static constexpr const char* kNames[kStepKinds] = {"decode", "prefill", "mixed"};  // StepKind's order
  return kNames[static_cast<int>(k)];
}

}  // namespace klinear

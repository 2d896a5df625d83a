#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

namespace klinear {

Status validate_sampling(const SamplingParams& p) {
  if (!std::isfinite(p.temperature) || p.temperature < 0)
    return Status::InvalidArgument("temperature must be a finite number >= 0, got " + std::to_string(p.temperature));
  if (p.top_k < 0) return Status::InvalidArgument("top_k must be >= 0, got " + std::to_string(p.top_k));
  if (!(p.top_p > 0 && p.top_p <= 1)) return Status::InvalidArgument("top_p must be in (0, 1], got " + std::to_string(p.top_p));
  return Status();
}

int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  return best;
}

int32_t Sampler::sample(std::span<const float> logits) {
  if (params_.temperature <= 0) return argmax(logits);
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] != logits[b] ? logits[a] > logits[b] : a < b; });
  size_t keep = order.size();
  if (params_.top_k > 0) keep = std::min(keep, static_cast<size_t>(params_.top_k));
  std::vector<double> prob(keep);
  const double mx = logits[order[0]];
  double z = 0;
  for (size_t i = 0; i < keep; ++i) z += (prob[i] = std::exp((logits[order[i]] - mx) / params_.temperature));
  double cum = 0;
  size_t nucleus = keep;
  for (size_t i = 0; i < keep; ++i) {
    cum += prob[i] / z;
    if (cum >= params_.top_p) {
      nucleus = i + 1;
      break;
    }
  }
  std::discrete_distribution<size_t> dist(prob.begin(), prob.begin() + static_cast<std::ptrdiff_t>(nucleus));
  return order[dist(rng_)];
}

}  // namespace klinear

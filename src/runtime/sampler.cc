#include "runtime/sampler.h"

#include <algorithm>
#include <cstddef>
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

// Candidates are found without sorting the whole vocabulary: top-k by nth_element, the top-p
// nucleus by sorting a growing prefix (×4 each round) until it holds p of the probability mass,
// and plain temperature sampling draws from all ids directly.
int32_t Sampler::sample(std::span<const float> logits) {
  if (params_.temperature <= 0) return argmax(logits);
  const size_t vocab = logits.size();
  const double inv_t = 1.0 / params_.temperature;
  const double mx = logits[argmax(logits)];
  auto weight = [&](int32_t id) { return std::exp((logits[id] - mx) * inv_t); };
  auto by_logit = [&](int32_t a, int32_t b) { return logits[a] != logits[b] ? logits[a] > logits[b] : a < b; };

  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  size_t pool = vocab;  // candidates are order[0, pool)
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < vocab) {
    pool = static_cast<size_t>(params_.top_k);
    std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(pool), order.end(), by_logit);
  }
  double z = 0;
  for (size_t i = 0; i < pool; ++i) z += weight(order[i]);

  size_t keep = pool;
  if (params_.top_p < 1.0f) {
    for (size_t sorted = std::min<size_t>(pool, 256);; sorted = std::min(pool, sorted * 4)) {
      const auto mid = order.begin() + static_cast<std::ptrdiff_t>(sorted);
      std::nth_element(order.begin(), mid, order.begin() + static_cast<std::ptrdiff_t>(pool), by_logit);
      std::sort(order.begin(), mid, by_logit);
      double cum = 0;
      size_t i = 0;
      while (i < sorted && cum < params_.top_p * z) cum += weight(order[i++]);
      if (cum >= params_.top_p * z || sorted == pool) {
        keep = i;
        break;
      }
    }
  }
  std::vector<double> w(keep);
  for (size_t i = 0; i < keep; ++i) w[i] = weight(order[i]);
  std::discrete_distribution<size_t> dist(w.begin(), w.end());
  return order[dist(rng_)];
}

}  // namespace klinear

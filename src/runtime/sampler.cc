#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <climits>
#include <limits>
#include <cstddef>
#include <numeric>
#include <string>
#include <unordered_set>
#include <vector>

namespace klinear {

Status validate_sampling(const SamplingParams& p) {
  auto range = [](const char* name, float v, float lo, float hi) {
    return Status::InvalidArgument(std::string(name) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                                   "], got " + std::to_string(v));
  };
  if (!std::isfinite(p.temperature) || p.temperature < 0)
    return Status::InvalidArgument("temperature must be a finite number >= 0, got " + std::to_string(p.temperature));
  if (p.top_k < 0) return Status::InvalidArgument("top_k must be >= 0, got " + std::to_string(p.top_k));
  if (!(p.top_p > 0 && p.top_p <= 1)) return Status::InvalidArgument("top_p must be in (0, 1], got " + std::to_string(p.top_p));
  if (!(p.min_p >= 0 && p.min_p <= 1)) return range("min_p", p.min_p, 0, 1);
  if (!(p.presence_penalty >= -2 && p.presence_penalty <= 2)) return range("presence_penalty", p.presence_penalty, -2, 2);
  if (!(p.frequency_penalty >= -2 && p.frequency_penalty <= 2)) return range("frequency_penalty", p.frequency_penalty, -2, 2);
  if (!(p.repetition_penalty > 0 && std::isfinite(p.repetition_penalty)))
    return Status::InvalidArgument("repetition_penalty must be a finite number > 0, got " +
                                   std::to_string(p.repetition_penalty));
  std::unordered_set<int32_t> biased;
  for (const TokenBias& b : p.logit_bias) {
    if (b.id < 0) return Status::InvalidArgument("logit_bias: token id " + std::to_string(b.id) + " is negative");
    if (!biased.insert(b.id).second) return Status::InvalidArgument("logit_bias: token id " + std::to_string(b.id) + " given twice");
    if (!(b.bias >= -100 && b.bias <= 100)) return range("logit_bias", b.bias, -100, 100);
  }
  if (p.min_tokens < 0) return Status::InvalidArgument("min_tokens must be >= 0, got " + std::to_string(p.min_tokens));
  return Status();
}

bool device_samplable(const SamplingParams& p, int top_logprobs) {
  return top_logprobs < 0 && p.min_p == 0.0f && !adjusts_logits(p);
}

bool adjusts_logits(const SamplingParams& p) {
  return !p.logit_bias.empty() || p.min_tokens > 0 || p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f ||
         p.frequency_penalty != 0.0f;
}

SampleRow sample_row(const SamplingParams& p, int64_t index) {
  KL_CHECK(index >= 0 && index <= INT32_MAX, "sample_row: token index " + std::to_string(index));
  return SampleRow{p.temperature, p.top_k, p.top_p, p.seed, static_cast<int32_t>(index)};
}

int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  return best;
}

void adjust_logits(const SamplingParams& p, const TokenHistory& history, std::span<float> logits) {
  auto in_range = [&](int32_t id) { return id >= 0 && static_cast<size_t>(id) < logits.size(); };
  for (const TokenBias& b : p.logit_bias)
    if (in_range(b.id)) logits[static_cast<size_t>(b.id)] += b.bias;
  if (history.generated < p.min_tokens)
    for (int32_t id : p.min_tokens_ids)
      if (in_range(id)) logits[static_cast<size_t>(id)] = -std::numeric_limits<float>::infinity();
  if (p.repetition_penalty != 1.0f) {
    auto penalize = [&](int32_t id) {
      float& l = logits[static_cast<size_t>(id)];
      l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
    };
    for (int32_t id : history.prompt)
      if (in_range(id)) penalize(id);
    for (const auto& [id, count] : history.output)
      if (in_range(id) && !history.prompt.count(id)) penalize(id);
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f)
    for (const auto& [id, count] : history.output)
      if (in_range(id)) logits[static_cast<size_t>(id)] -= p.presence_penalty + p.frequency_penalty * static_cast<float>(count);
}

Sampled logprobs_of(std::span<const float> logits, int32_t id, int k) {
  const double mx = logits[static_cast<size_t>(argmax(logits))];
  double z = 0;
  for (float l : logits) z += std::exp(static_cast<double>(l) - mx);
  const double log_z = mx + std::log(z);
  Sampled s;
  s.id = id;
  s.logprob = static_cast<float>(logits[static_cast<size_t>(id)] - log_z);
  const float mine = logits[static_cast<size_t>(id)];
  s.rank = 1;
  for (size_t j = 0; j < logits.size(); ++j)
    s.rank += logits[j] > mine || (logits[j] == mine && static_cast<int32_t>(j) < id) ? 1 : 0;
  const size_t n = std::min(static_cast<size_t>(std::max(k, 0)), logits.size());
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n), order.end(), [&](int32_t a, int32_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  for (size_t i = 0; i < n; ++i) s.top.push_back({order[i], static_cast<float>(logits[order[i]] - log_z)});
  return s;
}

void Sampler::set_prompt(std::span<const int32_t> prompt) { history_.prompt.insert(prompt.begin(), prompt.end()); }

Sampled Sampler::next(std::span<const float> logits, int top_logprobs) {
  int32_t id;
  if (adjusts_logits(params_)) {
    std::vector<float> adjusted(logits.begin(), logits.end());
    adjust_logits(params_, history_, adjusted);
    id = draw(adjusted);
  } else {
    id = draw(logits);
  }
  ++history_.output[id];
  ++history_.generated;
  if (top_logprobs < 0) return Sampled{id, 0, {}};
  return logprobs_of(logits, id, top_logprobs);
}

// Candidates are found without sorting the whole vocabulary: top-k by nth_element, the top-p
// nucleus by sorting a growing prefix (×4 each round) until it holds p of the probability mass,
// and plain temperature sampling draws from all ids directly.
int32_t Sampler::draw(std::span<const float> logits) {
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
  // min_p: the most likely id has weight 1, so the threshold is min_p itself.
  std::vector<double> w(keep);
  for (size_t i = 0; i < keep; ++i) {
    const double wi = weight(order[i]);
    w[i] = wi >= params_.min_p ? wi : 0.0;
  }
  std::discrete_distribution<size_t> dist(w.begin(), w.end());
  return order[dist(rng_)];
}

}  // namespace klinear

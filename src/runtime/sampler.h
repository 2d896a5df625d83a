// Sampler: picks the next token from one row of logits. Temperature 0 is greedy argmax (ties go to
// the lowest id); otherwise softmax(logits / T), restricted to the top-k ids and then to the
// smallest set whose probability reaches top-p, sampled with a seeded generator so that a fixed
// seed reproduces a run.
#pragma once

#include <cstdint>
#include <random>
#include <span>

#include "core/status.h"

namespace klinear {

struct SamplingParams {
  float temperature = 0.0f;  // <= 0: greedy
  int top_k = 0;             // 0: no limit
  float top_p = 1.0f;        // 1: no limit
  uint64_t seed = 0;
};

// InvalidArgument naming the field when a parameter is out of range.
Status validate_sampling(const SamplingParams& p);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p) : params_(p), rng_(p.seed) {}
  int32_t sample(std::span<const float> logits);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
};

int32_t argmax(std::span<const float> logits);

}  // namespace klinear

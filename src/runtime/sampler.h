// Sampler: picks the next token of one sequence from one row of logits.
//
// Order of processing (each step optional), on a copy of the logits: the logit bias, then the
// min-tokens suppression (the stop ids get -inf while fewer than min_tokens ids are generated),
// then the penalties (repetition over prompt and generated ids, then presence and frequency over
// generated ids), temperature (<= 0 is
// greedy argmax, ties to the lowest id), then the candidate set: the top-k ids, the smallest
// prefix (by logit) whose tempered probability reaches top-p, and of those the ids whose
// probability is at least min_p times the most likely one. The draw uses a per-sampler generator
// seeded from `seed`, so a fixed seed reproduces a run.
//
// Log-probabilities, when asked for, are those of the model's distribution: log_softmax of the
// raw logits, before penalties, temperature and truncation (what OpenAI clients read as the
// model's confidence); top_logprobs lists the most likely ids of that same distribution.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"

namespace klinear {

struct TokenBias {
  int32_t id = 0;
  float bias = 0;  // added to the id's logit; [-100, 100] (OpenAI's logit_bias)
};

struct SamplingParams {
  float temperature = 0.0f;  // <= 0: greedy
  int top_k = 0;             // 0: no limit
  float top_p = 1.0f;        // 1: no limit
  uint64_t seed = 0;
  float min_p = 0.0f;               // 0: no limit; in [0, 1]
  float presence_penalty = 0.0f;    // subtracted once from the logit of every generated id; [-2, 2]
  float frequency_penalty = 0.0f;   // subtracted per occurrence in the generated ids; [-2, 2]
  float repetition_penalty = 1.0f;  // > 0; ids in prompt or output: logit / p if positive, * p if not
  std::vector<TokenBias> logit_bias = {};  // each id once, in [0, vocab) (the engine checks the vocabulary)
  int64_t min_tokens = 0;             // >= 0: the first min_tokens generated ids are none of `min_tokens_ids`
  std::vector<int32_t> min_tokens_ids = {};  // the request's stop ids (eos unless ignored, stop_token_ids): the engine sets them
};

// InvalidArgument naming the field when a parameter is out of range.
Status validate_sampling(const SamplingParams& p);

// Whether the backend's sample op can draw for a request: temperature, top-k, top-p and the seed
// only (no logit bias, no min_tokens, no penalties, no min_p, no log-probabilities). Such a request's token i is then the op's
// draw `i` of its seed (SampleArgs), not this Sampler's: the same seed still gives the same
// tokens, but other ones than the host sampler gives.
bool device_samplable(const SamplingParams& p, int top_logprobs);
// The op's row for token `index` (0 = the first generated) of a request with `p`.
SampleRow sample_row(const SamplingParams& p, int64_t index);

// Ids seen so far by one sequence, for the penalties.
struct TokenHistory {
  std::unordered_set<int32_t> prompt;
  std::unordered_map<int32_t, int> output;  // id -> times generated
  int64_t generated = 0;                     // ids generated in all
};

// Whether `p` changes the logits before the draw (bias, min_tokens while active, penalties).
bool adjusts_logits(const SamplingParams& p);
// Applies the logit bias, the min_tokens suppression (while `history` holds fewer generated ids)
// and the penalties of `p` to `logits` [V] in place, in the file comment's order.
void adjust_logits(const SamplingParams& p, const TokenHistory& history, std::span<float> logits);

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0;
};

struct Sampled {
  int32_t id = 0;
  float logprob = 0;               // of `id`; set when top_logprobs >= 0
  std::vector<TokenLogprob> top;   // the top_logprobs most likely ids, most likely first
  int64_t rank = 0;                // logprobs_of: 1 + the ids ranked before `id` (more likely, or as likely and lower)
};

// Not thread-safe: one sampler per sequence.
class Sampler {
 public:
  explicit Sampler(const SamplingParams& p) : params_(p), rng_(p.seed) {}

  // Records the prompt ids (the repetition penalty covers them).
  void set_prompt(std::span<const int32_t> prompt);
  // Picks the next id from `logits` [V] and records it as generated. With top_logprobs >= 0 it
  // also reports the log-probability of the pick and of the top_logprobs most likely ids.
  Sampled next(std::span<const float> logits, int top_logprobs);
  int32_t sample(std::span<const float> logits) { return next(logits, -1).id; }
  const SamplingParams& params() const { return params_; }

 private:
  int32_t draw(std::span<const float> logits);

  SamplingParams params_;
  std::mt19937_64 rng_;
  TokenHistory history_;
};

int32_t argmax(std::span<const float> logits);

// log_softmax(logits) at `id`, and the `k` most likely ids with theirs (ties to the lowest id).
Sampled logprobs_of(std::span<const float> logits, int32_t id, int k);

}  // namespace klinear

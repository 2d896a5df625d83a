// generate(): the offline generation loop for one sequence: prefill the prompt, then decode one
// token at a time through the model's decode path, sampling each next token.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "model/model.h"
#include "runtime/sampler.h"

namespace klinear {

struct GenerateOptions {
  int max_tokens = 16;
  SamplingParams sampling;
  bool ignore_eos = false;
  std::vector<int32_t> stop_ids;  // extra stop ids besides the config's eos
};

enum class FinishReason { kLength, kStop };

struct GenerateResult {
  std::vector<int32_t> ids;  // generated ids (a stop id that ended generation is included)
  FinishReason finish = FinishReason::kLength;
  int64_t prompt_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;
};

// Whether `id` ends generation under `options`: the config's eos or one of the stop ids, unless
// ignore_eos.
bool is_stop_token(const ModelConfig& config, const GenerateOptions& options, int32_t id);

// Called after each generated token (a stop token too); returning false stops generation early.
using TokenCallback = std::function<bool(int32_t id)>;

// Runs `prompt` from `state` (continuing whatever it holds) and generates up to max_tokens.
Result<GenerateResult> generate(Model& model, SequenceState& state, std::span<const int32_t> prompt,
                                const GenerateOptions& options, const TokenCallback& on_token);
// The same from a fresh sequence.
Result<GenerateResult> generate(Model& model, std::span<const int32_t> prompt, const GenerateOptions& options,
                                const TokenCallback& on_token);

}  // namespace klinear

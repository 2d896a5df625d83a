// generate(): the offline generation loop for one sequence: prefill the prompt in chunks of
// bounded size (memory stays bounded whatever the prompt's length), then decode one token at a
// time through the model's decode path, sampling each next token.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "model/model.h"
#include "runtime/step_executor.h"
#include "runtime/sampler.h"

namespace klinear {

struct GenerateOptions {
  int max_tokens = 16;
  SamplingParams sampling;
  bool ignore_eos = false;
  std::vector<int32_t> stop_ids;  // extra stop ids besides the config's eos
  int64_t prefill_chunk = 2048;   // prompt tokens per prefill step
};

// kLength: max_tokens reached; kStop: a stop id; kContext: the model's context is full (what was
// generated is kept).
enum class FinishReason { kLength, kStop, kContext };

struct GenerateResult {
  std::vector<int32_t> ids;  // generated ids (a stop id that ended generation is included)
  FinishReason finish = FinishReason::kLength;
  int64_t prompt_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;
};

// Whether `id` ends generation under `options`: the config's eos or one of the stop ids, unless
// ignore_eos.
bool is_stop_token(const ModelConfig& config, const GenerateOptions& options, int32_t id);

// Logits [V] or [T, V] (host F32) whose rows are positions first_position, first_position + 1, ...:
// Corruption naming the first non-finite value's position and token. A step whose logits hold NaN
// or Inf is an error, never a silent token 0 or a file of NaN.
Status check_finite_logits(const Tensor& logits, int64_t first_position);

// Called after each generated token (a stop token too); returning false stops generation early.
using TokenCallback = std::function<bool(int32_t id)>;

// Runs `prompt` on sequence `seq` of the executor's cache (continuing whatever it holds) and
// generates up to max_tokens. A prompt that does not fit in the context is an error before
// anything runs; the last generated token is sampled but not run (the caller feeds it on if it
// continues).
Result<GenerateResult> generate(StepExecutor& executor, SeqId seq, std::span<const int32_t> prompt,
                                const GenerateOptions& options, const TokenCallback& on_token);
// The same from a fresh sequence in a cache of its own.
Result<GenerateResult> generate(Model& model, std::span<const int32_t> prompt, const GenerateOptions& options,
                                const TokenCallback& on_token);

}  // namespace klinear

#include "runtime/generate.h"

#include <algorithm>
#include <chrono>

namespace klinear {

bool is_stop_token(const ModelConfig& config, const GenerateOptions& options, int32_t id) {
  return !options.ignore_eos &&
         (config.is_eos(id) || std::find(options.stop_ids.begin(), options.stop_ids.end(), id) != options.stop_ids.end());
}

Result<GenerateResult> generate(Model& model, SequenceState& state, std::span<const int32_t> prompt,
                                const GenerateOptions& options, const TokenCallback& on_token) {
  KL_RETURN_IF_ERROR(validate_sampling(options.sampling));
  if (options.max_tokens < 0) return Status::InvalidArgument("max_tokens must be >= 0");
  GenerateResult r;
  r.prompt_tokens = static_cast<int64_t>(prompt.size());
  Sampler sampler(options.sampling);
  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  KL_ASSIGN_OR_RETURN(Tensor logits, model.forward(prompt, state, LogitsMode::kLast));
  r.prefill_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  t0 = Clock::now();
  const int64_t vocab = model.config().vocab_size;
  for (int i = 0; i < options.max_tokens; ++i) {
    const int32_t next = sampler.sample(std::span<const float>(logits.f32(), static_cast<size_t>(vocab)));
    r.ids.push_back(next);
    const bool stop = is_stop_token(model.config(), options, next);
    if (on_token && !on_token(next)) break;
    if (stop) {
      r.finish = FinishReason::kStop;
      break;
    }
    if (i + 1 == options.max_tokens) break;
    const int32_t one[1] = {next};
    KL_ASSIGN_OR_RETURN(logits, model.forward(one, state, LogitsMode::kLast));
  }
  r.decode_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

Result<GenerateResult> generate(Model& model, std::span<const int32_t> prompt, const GenerateOptions& options,
                                const TokenCallback& on_token) {
  SequenceState state = model.new_sequence();
  return generate(model, state, prompt, options, on_token);
}

}  // namespace klinear

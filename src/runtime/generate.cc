#include "runtime/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace klinear {

namespace {
// The error for non-finite logits at `position`; `detail` says which value when the host saw it.
Status non_finite_logits(int64_t position, const std::string& detail) {
  return Status::Corruption("the logits at position " + std::to_string(position) + " are not finite" + detail +
                            ": the weights or the computation went non-finite (try `klinear info --verify`, or "
                            "--check-finite to name the first layer)");
}
}  // namespace

Status check_finite_logits(const Tensor& logits, int64_t first_position) {
  const float* p = logits.f32();
  const int64_t vocab = logits.dim(logits.rank() - 1);
  for (int64_t i = 0; i < logits.numel(); ++i)
    if (!std::isfinite(p[i]))
      return non_finite_logits(first_position + i / vocab,
                               " (" + std::to_string(p[i]) + " for token " + std::to_string(i % vocab) + ")");
  return Status();
}

bool is_stop_token(const ModelConfig& config, const GenerateOptions& options, int32_t id) {
  return !options.ignore_eos &&
         (config.is_eos(id) || std::find(options.stop_ids.begin(), options.stop_ids.end(), id) != options.stop_ids.end());
}

Result<GenerateResult> generate(StepExecutor& executor, SeqId seq, std::span<const int32_t> prompt,
                                const GenerateOptions& options, const TokenCallback& on_token) {
  Model& model = executor.model();
  Cache& cache = executor.cache();
  KL_RETURN_IF_ERROR(validate_sampling(options.sampling));
  if (options.max_tokens < 0) return Status::InvalidArgument("max_tokens must be >= 0");
  if (options.prefill_chunk < 1) return Status::InvalidArgument("prefill_chunk must be >= 1");
  if (prompt.empty()) return Status::InvalidArgument("the prompt is empty");
  const ModelConfig& c = model.config();
  const int64_t context = c.max_position_embeddings;
  const int64_t start = cache.tokens(seq), prompt_len = static_cast<int64_t>(prompt.size());
  if (context > 0 && start + prompt_len > context)
    return Status::InvalidArgument("the prompt of " + std::to_string(prompt_len) + " tokens" +
                                   (start > 0 ? " after " + std::to_string(start) + " earlier ones" : std::string()) +
                                   " does not fit the model's context of " + std::to_string(context) + " tokens");
  GenerateResult r;
  r.prompt_tokens = prompt_len;
  Sampler sampler(options.sampling);
  // Requests the device sampler serves draw there (token i is draw i of the seed) and only the
  // id comes back; the others copy their logits row and sample on the host.
  const bool on_device = device_samplable(options.sampling, -1);
  // Runs `ids` on the sequence; with `sample`, returns the next token (else -1).
  auto run = [&](std::span<const int32_t> ids, bool sample) -> Result<int32_t> {
    const SeqStep step{seq, ids, LogitsMode::kLast};
    KL_RETURN_IF_ERROR(cache.reserve(std::span<const SeqStep>(&step, 1)));
    KL_ASSIGN_OR_RETURN(Batch batch, cache.plan(std::span<const SeqStep>(&step, 1)));
    const SampleRow draw = sample_row(options.sampling, static_cast<int64_t>(r.ids.size()));
    KL_ASSIGN_OR_RETURN(StepOutput out, executor.run(batch, sample && on_device ? std::span<const SampleRow>(&draw, 1)
                                                                                 : std::span<const SampleRow>()));
    if (!sample) return -1;
    const int64_t position = cache.tokens(seq) - 1;
    // −1: non-finite logits, agreed on by every rank like a token.
    int32_t id = -1;
    Status finite;
    if (on_device) {
      id = model.backend().to_host(out.ids).data_as<const int32_t>()[0];
    } else {
      const Tensor logits = model.backend().to_host(out.logits);
      finite = check_finite_logits(logits, position);
      if (finite.ok()) id = sampler.sample(std::span<const float>(logits.f32(), static_cast<size_t>(logits.numel())));
    }
    KL_ASSIGN_OR_RETURN(id, model.first_rank_token(id));
    if (id < 0) return finite.ok() ? non_finite_logits(position, "") : finite;
    return id;
  };
  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  int32_t next = -1;
  for (int64_t done = 0; done < prompt_len; done += options.prefill_chunk) {
    const int64_t n = std::min(options.prefill_chunk, prompt_len - done);
    KL_ASSIGN_OR_RETURN(next, run(prompt.subspan(done, n), done + n == prompt_len && options.max_tokens > 0));
  }
  r.prefill_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  t0 = Clock::now();
  for (int i = 0; i < options.max_tokens; ++i) {
    r.ids.push_back(next);
    const bool stop = is_stop_token(c, options, next);
    if (on_token && !on_token(next)) break;
    if (stop) {
      r.finish = FinishReason::kStop;
      break;
    }
    if (i + 1 == options.max_tokens) break;
    if (context > 0 && cache.tokens(seq) + 1 > context) {
      r.finish = FinishReason::kContext;
      break;
    }
    const int32_t one[1] = {next};
    KL_ASSIGN_OR_RETURN(next, run(one, true));
  }
  r.decode_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

Result<GenerateResult> generate(Model& model, std::span<const int32_t> prompt, const GenerateOptions& options,
                                const TokenCallback& on_token) {
  KL_ASSIGN_OR_RETURN(std::unique_ptr<Cache> cache, Cache::create(model.config(), model.backend(), CacheOptions{}));
  KL_ASSIGN_OR_RETURN(SeqId seq, cache->open());
  StepExecutor executor(model, *cache);
  return generate(executor, seq, prompt, options, on_token);
}

}  // namespace klinear

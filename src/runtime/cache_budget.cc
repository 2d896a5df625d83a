#include "runtime/cache_budget.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "runtime/model_runner.h"

namespace klinear {

namespace {
std::string mib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f MiB", static_cast<double>(bytes) / 1048576.0);
  return buf;
}
}  // namespace

Result<uint64_t> cache_budget(const MemoryFraction& m) {
  if (!(m.fraction > 0 && m.fraction <= 1))
    return Status::InvalidArgument("memory fraction must be in (0, 1], got " + std::to_string(m.fraction));
  const uint64_t share = static_cast<uint64_t>(m.fraction * static_cast<double>(m.free_at_start));
  const uint64_t taken = m.free_at_start > m.free_after_load ? m.free_at_start - m.free_after_load : 0;
  if (share <= taken)
    return Status::ResourceExhausted("the weights and the step arena take " + mib(taken) + " of the " + mib(m.free_at_start) +
                                     " free at start-up; a memory fraction of " + std::to_string(m.fraction) +
                                     " leaves nothing for the caches (raise it or give --cache-memory)");
  return share - taken;
}

Status profile_step(Model& model, int64_t max_num_tokens, int64_t max_num_seqs, int64_t page_size) {
  const int64_t seqs = std::max<int64_t>(1, std::min(max_num_tokens, max_num_seqs));
  const PrefixCacheOptions no_prefix{PrefixCaching::kOff, 256};
  KL_ASSIGN_OR_RETURN(auto probe, ModelRunner::create(model, CacheOptions{1, page_size, 0}, no_prefix));
  const int64_t per_seq = std::min((max_num_tokens + seqs - 1) / seqs, probe->max_model_len());
  const CacheSizes z = probe->sizes();
  probe.reset();
  const uint64_t budget = seqs * (z.bytes_per_slot + static_cast<uint64_t>(pages_for(per_seq, page_size)) * z.bytes_per_page);
  KL_ASSIGN_OR_RETURN(auto runner, ModelRunner::create(model, CacheOptions{seqs, page_size, budget}, no_prefix));
  std::vector<std::vector<int32_t>> ids;
  std::vector<RunnerStep> steps;
  for (int64_t i = 0, left = max_num_tokens; i < seqs && left > 0; ++i) {
    const int64_t n = std::min(per_seq, left);
    left -= n;
    ids.emplace_back(static_cast<size_t>(n), 0);
    KL_ASSIGN_OR_RETURN(RunnerSeq seq, runner->open());
    if (!runner->reserve(seq, n))
      return Status::ResourceExhausted("profiling a step: " + std::to_string(n) + " positions do not fit the probe's cache");
    steps.push_back(RunnerStep{seq, {}, StepLogits::kLast, n, std::nullopt});
  }
  for (size_t i = 0; i < steps.size(); ++i) steps[i].ids = ids[i];
  Status ran = runner->run(steps).status();
  for (const RunnerStep& s : steps) runner->close(s.seq);
  return ran.with_context("profiling a step of " + std::to_string(max_num_tokens) + " tokens");
}

}  // namespace klinear

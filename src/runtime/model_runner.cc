#include "runtime/model_runner.h"

#include <cstring>
#include <limits>
#include <vector>

namespace klinear {

Result<std::unique_ptr<ModelRunner>> ModelRunner::create(Model& model, const CacheOptions& options,
                                                         const PrefixCacheOptions& prefix) {
  KL_ASSIGN_OR_RETURN(std::unique_ptr<CacheManager> manager,
                      CacheManager::create(model.config(), model.backend(), options, prefix));
  return std::unique_ptr<ModelRunner>(new ModelRunner(model, std::move(manager)));
}

int64_t ModelRunner::max_model_len() const {
  const int64_t m = model_.config().max_position_embeddings;
  return m > 0 ? m : std::numeric_limits<int32_t>::max();
}

// Every step asks for its last row (the batch always has one per sequence) or, with kAll, for all
// of them; the rows the engine did not ask for (prefill chunks that do not reach the end of the
// known tokens) are dropped. Drawn rows stay on the device: only their ids come back, in one copy
// at the end of the step, and only the other wanted rows' logits are copied.
Result<SampledStep> ModelRunner::run(std::span<const RunnerStep> steps) {
  std::vector<SeqStep> plan;
  std::vector<std::vector<Snapshot>> snaps(steps.size());
  plan.reserve(steps.size());
  int64_t rows = 0, device_rows = 0;
  bool any_draw = false, any_all = false;
  std::vector<SampleRow> draws;  // one per step (greedy where none is asked)
  std::vector<int64_t> first_row(steps.size());  // where each step's rows start in the forward's logits
  for (size_t i = 0; i < steps.size(); ++i) {
    const RunnerStep& s = steps[i];
    snaps[i] = manager_->begin_step(s);
    const bool all = s.logits == StepLogits::kAll;
    plan.push_back(SeqStep{s.seq, s.ids, all ? LogitsMode::kAll : LogitsMode::kLast, snaps[i]});
    const bool draw = s.logits == StepLogits::kLast && s.draw;
    rows += s.host_rows();
    first_row[i] = device_rows;
    device_rows += all ? static_cast<int64_t>(s.ids.size()) : 1;
    any_draw = any_draw || draw;
    any_all = any_all || all;
    draws.push_back(draw ? *s.draw : SampleRow{});
  }
  KL_CHECK(!(any_draw && any_all), "a step that returns every row of a sequence draws on the device");
  auto run_step = [&]() -> Result<StepOutput> {
    KL_ASSIGN_OR_RETURN(Batch batch, manager_->cache().plan(plan));
    return executor_.run(batch, any_draw ? std::span<const SampleRow>(draws) : std::span<const SampleRow>());
  };
  Result<StepOutput> step = run_step();
  if (!step.ok()) {
    manager_->abandon();
    return step.status();
  }
  Backend& be = model_.backend();
  const int64_t vocab = vocab_size();
  KL_CHECK(step->logits.dim(0) == device_rows && step->logits.dim(1) == vocab,
           "forward returned logits " + shape_to_string(step->logits.shape()) + " for " + std::to_string(device_rows) +
               " rows");
  SampledStep out;
  out.logits = Tensor::empty(DType::kF32, {rows, vocab});
  // Runs of consecutive wanted host rows, one copy each.
  int64_t row = 0;
  for (size_t i = 0; i < steps.size();) {
    if (steps[i].host_rows() == 0) {
      ++i;
      continue;
    }
    size_t e = i;
    int64_t n = 0;
    for (; e < steps.size() && steps[e].host_rows() > 0; ++e) n += steps[e].host_rows();
    // A kLast step's row is the last of its rows in the forward's logits (one row: first_row).
    const int64_t begin = first_row[i];
    const Tensor part = be.to_host(step->logits.rows(begin, begin + n));
    std::memcpy(out.logits.f32() + row * vocab, part.f32(), part.nbytes());
    row += n;
    i = e;
  }
  if (any_draw) {
    const Tensor ids = be.to_host(step->ids);  // the step has finished
    for (size_t i = 0; i < steps.size(); ++i)
      if (steps[i].logits == StepLogits::kLast && steps[i].draw) out.ids.push_back(ids.data_as<const int32_t>()[i]);
  }
  manager_->publish(steps);
  return out;
}

}  // namespace klinear

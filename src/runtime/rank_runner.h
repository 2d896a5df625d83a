// The serving engine over a model split over ranks (runtime/model_world.h): rank 0 schedules, the
// other ranks follow its schedule.
//
// Decision: one engine, on rank 0 (its scheduler, sampler, HTTP port and files); the other ranks
// run no engine at all. Rank 0's engine drives a LeaderRunner, which makes every call that changes
// the runner's state (open, open_prefix, close, reserve, run) on rank 0's own ModelRunner and sends
// it over the host world (a broadcast); each other rank makes the same call on its ModelRunner
// (follow_leader), so every rank's caches hold the same sequences, slots and pages, and every
// step's forward meets the others' in the model's sums and gathers. Calls that only read (lookup,
// usage) stay on rank 0. A follower whose call answers differently from rank 0's (a slot, a
// reservation) stops with an error naming the call and both answers: mpirun then ends the launch,
// rather than ranks waiting on each other forever.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "dist/comm.h"
#include "runtime/model_runner.h"
#include "runtime/step_runner.h"

namespace klinear {

class LeaderRunner final : public StepRunner {
 public:
  // `runner` and `host` (every rank of the launch) must outlive this runner.
  LeaderRunner(ModelRunner& runner, Comm& host) : runner_(runner), host_(host) {}
  // Tells the followers to stop.
  ~LeaderRunner() override;

  int64_t vocab_size() const override { return runner_.vocab_size(); }
  int64_t max_model_len() const override { return runner_.max_model_len(); }
  CacheUsage usage() const override { return runner_.usage(); }
  Result<RunnerSeq> open() override;
  PrefixHit lookup(std::span<const int32_t> tokens) const override { return runner_.lookup(tokens); }
  Result<RunnerSeq> open_prefix(std::span<const int32_t> tokens, int64_t cached) override;
  void close(RunnerSeq seq) override;
  bool reserve(RunnerSeq seq, int64_t tokens) override;
  bool samples_on_device() const override { return runner_.samples_on_device(); }
  Result<SampledStep> run(std::span<const RunnerStep> steps) override;

 private:
  // Sends one call to the followers; a failure of the host world is kept and returned by the
  // next run (open and open_prefix return it at once).
  void send(std::vector<int64_t> message);

  ModelRunner& runner_;
  Comm& host_;
  Status failed_;
};

// On a rank other than 0: makes every call rank 0's LeaderRunner sends on `runner` until it stops.
// OK when rank 0 stopped; otherwise the first call that failed or answered differently, or the host
// world's error.
Status follow_leader(ModelRunner& runner, Comm& host);

}  // namespace klinear

// Serving metrics the engine keeps and the server exports (Prometheus text in server/metrics.cc):
// counters, gauges and fixed-bucket histograms. Plain values: the engine updates them under its
// own lock and hands out copies.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/step_runner.h"

namespace klinear {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v);
  const std::vector<double>& bounds() const { return bounds_; }  // upper bounds, ascending
  const std::vector<uint64_t>& counts() const { return counts_; }  // per bucket, last = +Inf
  double sum() const { return sum_; }
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t count_ = 0;
};

// Latency buckets in seconds, 1 ms to 10 min.
std::vector<double> latency_buckets_s();
// Engine step buckets in seconds, 1 ms to 5 s (a decode step of the 48B model on an H200 is 5-60
// ms, a step with an 8k-token prefill chunk ~0.2 s).
std::vector<double> step_buckets_s();

// What an engine step ran: only the newest token of sequences that are generating (decode), only
// prompt or recompute chunks (prefill), or both (mixed).
enum class StepKind : uint8_t { kDecode, kPrefill, kMixed };
inline constexpr int kStepKinds = 3;
const char* step_kind_name(StepKind k);

struct StepMetrics {
  Histogram seconds{step_buckets_s()};          // the whole step: schedule, forward, sampling, post-processing
  Histogram forward_seconds{step_buckets_s()};  // the runner's forward (with any device sampling) alone
  uint64_t tokens = 0;                          // tokens the steps computed
};

struct EngineMetrics {
  std::map<std::string, uint64_t> requests;  // finished requests by status: stop, length, cancelled, error
  uint64_t prompt_tokens = 0, generation_tokens = 0, preemptions = 0;
  // Prefix cache: tokens of admitted sequences, and those of them restored from the cache.
  uint64_t prefix_query_tokens = 0, prefix_hit_tokens = 0;
  int64_t running = 0, waiting = 0;
  CacheUsage cache;
  Histogram ttft_s{latency_buckets_s()};
  Histogram inter_token_s{latency_buckets_s()};
  Histogram e2e_s{latency_buckets_s()};
  Histogram queue_s{latency_buckets_s()};
  std::array<StepMetrics, kStepKinds> steps;  // by StepKind
};

}  // namespace klinear

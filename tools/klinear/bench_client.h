// bench-serve: load generator for an OpenAI-compatible server. `concurrency` workers send
// `requests` streaming /v1/completions requests of `input_len` random token ids (the first
// `prefix_len` shared by all requests, to exercise prefix caching) asking for exactly
// `output_len` tokens (ignore_eos), and time every streamed chunk. The prompts come from `seed`,
// a fresh one per run unless given: two runs against one server must not share prompts, or the
// second is served from the first one's prefix cache.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace klinear {

struct BenchOptions {
  std::string url = "http://127.0.0.1:8000";
  std::string api_key;
  int concurrency = 1, requests = 16;
  int input_len = 128, output_len = 128, prefix_len = 0;
  std::optional<uint64_t> seed;  // unset: drawn from std::random_device
};

struct BenchResult {
  uint64_t seed = 0;  // of the prompts
  int completed = 0, failed = 0;
  std::string first_error;
  double seconds = 0;
  int64_t input_tokens = 0, output_tokens = 0;
  std::vector<double> ttft_s, itl_s, e2e_s;
};

// InvalidArgument for bad options, IOError when the server cannot be reached.
Result<BenchResult> run_bench(const BenchOptions& options);
// The human-readable summary: throughput and p50/p90/p99 of TTFT, ITL and end-to-end latency.
std::string bench_report(const BenchOptions& options, const BenchResult& r);

}  // namespace klinear

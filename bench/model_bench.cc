// Whole-model throughput on any backend, for each model directory given: prefill tokens/s (one
// sequence, in steps of at most --prefill-chunk tokens, as the engine's --max-num-tokens cuts them;
// by default the engine's default on the device) and decode tokens/s with B sequences decoding
// together in each step (B = 1 and each --batch value).
//
// Decisions: the same fixed token ids for every model (ids modulo the vocabulary, a fixed seed) and
// the best of several runs, so numbers are comparable across commits; a table, not a test. Each
// decoding sequence starts after its own prefill of the --prefill ids, or, with --context C, after
// C positions that are reserved in its state and cache but not computed: a decode step costs the
// same whatever those positions hold, and this keeps 256 sequences x 4k positions of a 48B model
// out of the benchmark's time. Steps end with a one-row copy of the logits to the host (the step
// has finished; the full logits copy is the sampler's business).
//
// Usage: model_bench [--device D] [--dtype T] [--load-format F] [--prefill T] [--prefill-chunk K]
//                    [--decode N] [--batch B]... [--context C] [--runs R] MODEL_DIR...
//   e.g. ./build/model_bench --batch 8 tests/fixtures/kimi-linear-tiny/model tests/fixtures/k3-tiny/model
//        build-gpu/model_bench --device cuda --load-format dummy --prefill 8192 --batch 64 --context 4096 48b/
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"
#include "runtime/scheduler.h"
#include "runtime/step_executor.h"

#if KLINEAR_WITH_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

namespace {

using Clock = std::chrono::steady_clock;
using namespace klinear;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

[[noreturn]] void die(const Status& s) {
  std::fprintf(stderr, "model_bench: %s\n", s.to_string().c_str());
  std::exit(1);
}
void ok_or_die(const Status& s) {
  if (!s.ok()) die(s);
}
template <typename T>
T value_or_die(Result<T> r) {
  if (!r.ok()) die(r.status());
  return std::move(r).value();
}

// What one slot and one page of a model's pools take (a one-sequence cache, made once per model).
CacheSizes unit_sizes(Model& m, Backend& be) {
  return value_or_die(Cache::create(m.config(), be, CacheOptions{1, 64, 0}))->sizes();
}

// Pools for `batch` sequences of `positions` each (the default budget assumes the full context).
CacheOptions options_for(const CacheSizes& unit, int batch, int64_t positions) {
  const uint64_t pages = static_cast<uint64_t>((positions + 63) / 64 + 1);
  return CacheOptions{batch, 64, static_cast<uint64_t>(batch) * (unit.bytes_per_slot + pages * unit.bytes_per_page)};
}

// An NVTX range over the timed steps ("prefill", "decode b64"), so a profiler can take exactly them
// (scripts/gpu-check.sh's profile_48b: ncu --nvtx --nvtx-include "decode b64/"); nothing without one.
class Range {
 public:
  explicit Range([[maybe_unused]] const std::string& name) {
#if KLINEAR_WITH_CUDA
    nvtxRangePushA(name.c_str());
#endif
  }
  ~Range() {
#if KLINEAR_WITH_CUDA
    nvtxRangePop();
#endif
  }
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;
};

// Waits for the step that made `logits` (a one-row copy).
void finish(Backend& be, const Tensor& logits) { be.to_host(logits.rows(0, 1)); }

// Runs `ids` on `seq` in steps of at most `chunk` tokens (the step arena holds one step's
// activations, so the chunk bounds it, as the engine's --max-num-tokens does).
void prefill_in_chunks(Model& m, Cache& cache, SeqId seq, std::span<const int32_t> ids, int64_t chunk) {
  for (size_t at = 0; at < ids.size(); at += static_cast<size_t>(chunk))
    value_or_die(m.forward_one(cache, seq, ids.subspan(at, std::min(ids.size() - at, static_cast<size_t>(chunk))),
                               LogitsMode::kLast));  // copies one row of logits
}

// Seconds for `decode` steps of `batch` sequences, each prefilled with `ids` first (not timed) or
// with `context` positions reserved (see the top of the file).
double time_decode(Model& m, Backend& be, const CacheSizes& unit, const std::vector<int32_t>& ids, int64_t chunk,
                   int64_t context, int batch, int decode, std::mt19937& rng) {
  const int64_t positions = (context > 0 ? context : static_cast<int64_t>(ids.size())) + decode;
  auto cache = value_or_die(Cache::create(m.config(), be, options_for(unit, batch, positions)));
  std::vector<SeqId> seqs;
  const std::vector<int32_t> reserved(static_cast<size_t>(std::max<int64_t>(context, 0)), 0);
  for (int b = 0; b < batch; ++b) {
    seqs.push_back(value_or_die(cache->open()));
    if (context > 0) {
      const SeqStep step{seqs.back(), reserved, LogitsMode::kLast};
      ok_or_die(cache->reserve(std::span<const SeqStep>(&step, 1)));
      cache->advance(value_or_die(cache->plan(std::span<const SeqStep>(&step, 1))));
    } else {
      prefill_in_chunks(m, *cache, seqs.back(), ids, chunk);
    }
  }
  std::vector<int32_t> next(static_cast<size_t>(batch));
  StepExecutor executor(m, *cache);  // the engine's decode path: padded buckets, graphs on CUDA
  const Range range("decode b" + std::to_string(batch));
  const auto t0 = Clock::now();
  for (int i = 0; i < decode; ++i) {
    std::vector<SeqStep> steps;
    for (int b = 0; b < batch; ++b) {
      next[b] = static_cast<int32_t>(rng() % m.config().vocab_size);
      steps.push_back(SeqStep{seqs[b], std::span<const int32_t>(&next[b], 1), LogitsMode::kLast});
    }
    ok_or_die(cache->reserve(steps));
    Batch plan = value_or_die(cache->plan(steps));
    finish(be, value_or_die(executor.run(plan)).logits);
  }
  return seconds_since(t0);
}

}  // namespace

int main(int argc, char** argv) {
  int prefill = 150, decode = 32, runs = 3;
  int64_t context = 0, chunk = 0;  // 0: the engine's default step budget on the device
  std::string device = "cpu", dtype, load_format = "safetensors", attention = "best";
  std::vector<int> batches{1};
  std::vector<std::string> dirs;
  const char* usage =
      "usage: model_bench [--device cpu|cuda] [--dtype float32|bfloat16] [--load-format safetensors|dummy]\n"
      "                   [--prefill T] [--prefill-chunk K] [--decode N] [--batch B]... [--context C] [--runs R]\n"
      "                   [--attention-kernels best|own]\n"
      "                   MODEL_DIR...\n";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has = i + 1 < argc;
    if (a == "--prefill" && has) prefill = std::atoi(argv[++i]);
    else if (a == "--decode" && has) decode = std::atoi(argv[++i]);
    else if (a == "--batch" && has) batches.push_back(std::atoi(argv[++i]));
    else if (a == "--context" && has) context = std::atoll(argv[++i]);
    else if (a == "--prefill-chunk" && has) chunk = std::atoll(argv[++i]);
    else if (a == "--runs" && has) runs = std::atoi(argv[++i]);
    else if (a == "--device" && has) device = argv[++i];
    else if (a == "--dtype" && has) dtype = argv[++i];
    else if (a == "--load-format" && has) load_format = argv[++i];
    else if (a == "--attention-kernels" && has) attention = argv[++i];
    else if (a == "--help" || a == "-h") {
      std::printf("%s", usage);
      return 0;
    } else if (a.rfind("--", 0) == 0) {
      std::fprintf(stderr, "model_bench: unknown option or missing value: %s\n%s", a.c_str(), usage);
      return 2;
    } else dirs.push_back(a);
  }
  if (dirs.empty() || prefill < 1 || chunk < 0 || decode < 1 || runs < 1 || context < 0 ||
      std::any_of(batches.begin(), batches.end(), [](int b) { return b < 1 || b > 4096; })) {
    std::fprintf(stderr, "model_bench: give at least one model directory and positive counts (see --help)\n");
    return 2;
  }
  BackendOptions options;
  options.device = value_or_die(parse_device(device));
  options.dtype = value_or_die(parse_compute_dtype(dtype, options.device));
  options.attention = value_or_die(parse_attention_kernels(attention));
  const LoadFormat format = value_or_die(parse_load_format(load_format));
  if (chunk == 0) chunk = default_max_num_tokens(options.device);
  auto backend = value_or_die(make_backend(options));
  std::printf("%-44s %8s %14s %6s %8s %8s %14s %12s\n", "model", "prefill", "prefill tok/s", "batch", "context", "decode",
              "decode tok/s", "ms/step");
  for (const std::string& dir : dirs) {
    const uint64_t free_before = backend->available_bytes();
    auto model = value_or_die(Model::load(dir, *backend, format));
    const uint64_t free_after = backend->available_bytes();
    std::fprintf(stderr, "%s: the weights took %.2f GiB of the device's memory (available %.2f GiB before the load)\n",
                 dir.c_str(), static_cast<double>(free_before - free_after) / (1u << 30),
                 static_cast<double>(free_before) / (1u << 30));
    const CacheSizes unit = unit_sizes(*model, *backend);
    std::mt19937 rng(1);
    std::vector<int32_t> ids(static_cast<size_t>(prefill));
    for (int32_t& id : ids) id = static_cast<int32_t>(rng() % model->config().vocab_size);
    double best_prefill = 1e30;
    for (int r = 0; r < runs; ++r) {
      auto cache = value_or_die(Cache::create(model->config(), *backend, options_for(unit, 1, prefill)));
      const SeqId s = value_or_die(cache->open());
      const Range range("prefill");
      const auto t0 = Clock::now();
      prefill_in_chunks(*model, *cache, s, ids, chunk);
      best_prefill = std::min(best_prefill, seconds_since(t0));
    }
    for (int batch : batches) {
      double best = 1e30;
      for (int r = 0; r < runs; ++r) best = std::min(best, time_decode(*model, *backend, unit, ids, chunk, context, batch, decode, rng));
      std::printf("%-44s %8d %14.1f %6d %8lld %8d %14.1f %12.3f\n", dir.c_str(), prefill, prefill / best_prefill, batch,
                  static_cast<long long>(context > 0 ? context : prefill), decode, double(batch) * decode / best,
                  1e3 * best / decode);
    }
  }
  return 0;
}

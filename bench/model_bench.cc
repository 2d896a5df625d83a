// Whole-model throughput on the CPU reference backend, for each model directory given: prefill
// tokens/s (one multi-token step of one sequence) and decode tokens/s with B sequences decoding
// together in each step (B = 1 and each --batch value), every sequence after its own prefill.
//
// Decision: the same fixed token ids for every model (ids modulo the vocabulary, a fixed seed) and
// the best of several runs, so numbers are comparable across commits; a table, not a test.
//
// Usage: model_bench [--prefill T] [--decode N] [--batch B]... [--runs R] MODEL_DIR...
//   e.g. ./build/model_bench --batch 8 tests/fixtures/kimi-linear-tiny/model tests/fixtures/k3-tiny/model
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

namespace {

using Clock = std::chrono::steady_clock;
using namespace klinear;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

[[noreturn]] void die(const Status& s) {
  std::fprintf(stderr, "model_bench: %s\n", s.to_string().c_str());
  std::exit(1);
}
template <typename T>
T value_or_die(Result<T> r) {
  if (!r.ok()) die(r.status());
  return std::move(r).value();
}

// Seconds for `decode` steps of `batch` sequences (each prefilled with `ids` first, not timed).
double time_decode(Model& m, Backend& be, const std::vector<int32_t>& ids, int batch, int decode, std::mt19937& rng) {
  auto cache = value_or_die(Cache::create(m.config(), be, CacheOptions{batch, 64, 0}));
  std::vector<SeqId> seqs;
  for (int b = 0; b < batch; ++b) {
    seqs.push_back(value_or_die(cache->open()));
    value_or_die(m.forward_one(*cache, seqs.back(), ids, LogitsMode::kLast));
  }
  std::vector<int32_t> next(static_cast<size_t>(batch));
  const auto t0 = Clock::now();
  for (int i = 0; i < decode; ++i) {
    std::vector<SeqStep> steps;
    for (int b = 0; b < batch; ++b) {
      next[b] = static_cast<int32_t>(rng() % m.config().vocab_size);
      steps.push_back(SeqStep{seqs[b], std::span<const int32_t>(&next[b], 1), LogitsMode::kLast});
    }
    Batch plan = value_or_die(cache->plan(steps));
    be.to_host(value_or_die(m.forward(plan, *cache)));
  }
  return seconds_since(t0);
}

}  // namespace

int main(int argc, char** argv) {
  int prefill = 150, decode = 32, runs = 3;
  std::vector<int> batches{1};
  std::vector<std::string> dirs;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--prefill" && i + 1 < argc) prefill = std::atoi(argv[++i]);
    else if (a == "--decode" && i + 1 < argc) decode = std::atoi(argv[++i]);
    else if (a == "--batch" && i + 1 < argc) batches.push_back(std::atoi(argv[++i]));
    else if (a == "--runs" && i + 1 < argc) runs = std::atoi(argv[++i]);
    else if (a == "--help" || a == "-h") {
      std::printf("usage: model_bench [--prefill T] [--decode N] [--batch B]... [--runs R] MODEL_DIR...\n");
      return 0;
    } else dirs.push_back(a);
  }
  if (dirs.empty() || prefill < 1 || decode < 1 || runs < 1 ||
      std::any_of(batches.begin(), batches.end(), [](int b) { return b < 1 || b > 4096; })) {
    std::fprintf(stderr, "model_bench: give at least one model directory and positive counts (see --help)\n");
    return 2;
  }
  auto backend = value_or_die(make_backend(BackendOptions{}));
  std::printf("%-44s %8s %14s %6s %8s %14s\n", "model", "prefill", "prefill tok/s", "batch", "decode", "decode tok/s");
  for (const std::string& dir : dirs) {
    auto model = value_or_die(Model::load(dir, *backend));
    std::mt19937 rng(1);
    std::vector<int32_t> ids(static_cast<size_t>(prefill));
    for (int32_t& id : ids) id = static_cast<int32_t>(rng() % model->config().vocab_size);
    double best_prefill = 1e30;
    for (int r = 0; r < runs; ++r) {
      auto cache = value_or_die(Cache::create(model->config(), *backend, CacheOptions{}));
      const SeqId s = value_or_die(cache->open());
      const auto t0 = Clock::now();
      value_or_die(model->forward_one(*cache, s, ids, LogitsMode::kLast));
      best_prefill = std::min(best_prefill, seconds_since(t0));
    }
    for (int batch : batches) {
      double best = 1e30;
      for (int r = 0; r < runs; ++r) best = std::min(best, time_decode(*model, *backend, ids, batch, decode, rng));
      std::printf("%-44s %8d %14.1f %6d %8d %14.1f\n", dir.c_str(), prefill, prefill / best_prefill, batch, decode,
                  double(batch) * decode / best);
    }
  }
  return 0;
}

// Whole-model CPU throughput: prefill tokens/s (one multi-token step) and decode tokens/s (one
// token at a time after the prefill) for each model directory given, on the CPU reference backend.
//
// Decision: the same fixed token ids for every model (ids modulo the vocabulary, a fixed seed) and
// the best of several runs, so numbers are comparable across commits; a table, not a test.
//
// Usage: model_bench [--prefill T] [--decode N] [--runs R] MODEL_DIR...
//   e.g. ./build/model_bench tests/fixtures/kimi-linear-tiny/model tests/fixtures/k3-tiny/model
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

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

int main(int argc, char** argv) {
  int prefill = 150, decode = 32, runs = 3;
  std::vector<std::string> dirs;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--prefill" && i + 1 < argc) prefill = std::atoi(argv[++i]);
    else if (a == "--decode" && i + 1 < argc) decode = std::atoi(argv[++i]);
    else if (a == "--runs" && i + 1 < argc) runs = std::atoi(argv[++i]);
    else if (a == "--help" || a == "-h") {
      std::printf("usage: model_bench [--prefill T] [--decode N] [--runs R] MODEL_DIR...\n");
      return 0;
    } else dirs.push_back(a);
  }
  if (dirs.empty() || prefill < 1 || decode < 0 || runs < 1) {
    std::fprintf(stderr, "model_bench: give at least one model directory (see --help)\n");
    return 2;
  }
  auto backend = klinear::make_backend(klinear::BackendOptions{});
  std::printf("%-44s %8s %14s %8s %14s\n", "model", "prefill", "prefill tok/s", "decode", "decode tok/s");
  for (const std::string& dir : dirs) {
    auto model = klinear::Model::load(dir, **backend);
    if (!model.ok()) {
      std::fprintf(stderr, "model_bench: %s\n", model.status().to_string().c_str());
      return 1;
    }
    klinear::Model& m = **model;
    std::mt19937 rng(1);
    std::vector<int32_t> ids(static_cast<size_t>(prefill));
    for (int32_t& id : ids) id = static_cast<int32_t>(rng() % m.config().vocab_size);
    double best_prefill = 1e30, best_decode = 1e30;
    for (int r = 0; r < runs; ++r) {
      auto cache = klinear::Cache::create(m.config(), **backend, klinear::CacheOptions{});
      if (!cache.ok()) {
        std::fprintf(stderr, "model_bench: %s\n", cache.status().to_string().c_str());
        return 1;
      }
      const klinear::SeqId s = (*cache)->open().value();
      auto t0 = Clock::now();
      auto logits = m.forward_one(**cache, s, ids, klinear::LogitsMode::kLast);
      best_prefill = std::min(best_prefill, seconds_since(t0));
      t0 = Clock::now();
      for (int i = 0; i < decode && logits.ok(); ++i) {
        const int32_t next[1] = {static_cast<int32_t>(rng() % m.config().vocab_size)};
        logits = m.forward_one(**cache, s, next, klinear::LogitsMode::kLast);
      }
      if (!logits.ok()) {
        std::fprintf(stderr, "model_bench: %s\n", logits.status().to_string().c_str());
        return 1;
      }
      best_decode = std::min(best_decode, seconds_since(t0));
    }
    std::printf("%-44s %8d %14.1f %8d %14.1f\n", dir.c_str(), prefill, prefill / best_prefill, decode,
                decode > 0 ? decode / best_decode : 0.0);
  }
  return 0;
}

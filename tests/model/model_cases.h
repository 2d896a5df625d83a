// Random-weight checkpoints for the model tests on configs the fixtures do not cover, with routing
// that varies from token to token yet never sits on a top-k tie.
//
// A router decision is discontinuous: two experts within rounding of each other at the top-k
// boundary may be picked differently by two fp32 evaluation orders, and then the logits
// legitimately differ. Freezing the routing (biases far apart) hides that but also hides uneven
// expert loads. Instead the router weights are spread (×10, many distinct expert sets) and the
// checkpoint is redrawn with the next seed until the CPU reference, running the test's prompts
// and the greedy tokens the test generates after them, never decides between two experts (or
// groups) closer than kRouteMargin. Two greedy picks within rounding are a tie of the same kind
// (the text after them differs), so those are redrawn too (kGreedyMargin).
#pragma once

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/backend.h"
#include "io/presets.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "runtime/sampler.h"
#include "test_util.h"

namespace klinear::testing {

// ~1e4 times the rounding noise of the scores (≤ 1) the decisions are made on.
constexpr float kRouteMargin = 1e-4f;
// ~10 times the drift of a logit between two fp32 evaluation orders of these models (~1e-6).
constexpr float kGreedyMargin = 1e-5f;
// Draws before a test fails. On k3-tiny's ~300 prompt tokens about one draw in 15 keeps
// kRouteMargin (13 runs took 0-49 redraws), so a limit of 50 would fail ~3 % of runs.
constexpr int kMaxDraws = 400;

// Multiplies every router gate weight of `dir`/model.safetensors by `scale` (rewritten in place).
inline void scale_router_weights(const std::string& dir, float scale) {
  const std::string path = dir + "/model.safetensors";
  auto file = SafetensorsFile::open(path);
  KL_CHECK(file.ok(), file.status().to_string());
  std::vector<std::pair<std::string, Tensor>> tensors;
  const std::string suffix = "block_sparse_moe.gate.weight";
  for (const SafetensorsEntry& e : file->entries()) {
    Tensor src = file->tensor(e);
    Tensor t = Tensor::empty(src.dtype(), src.shape());
    std::memcpy(t.data(), src.data(), src.nbytes());
    if (e.name.size() >= suffix.size() && e.name.compare(e.name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      std::vector<float> v(static_cast<size_t>(t.numel()));
      convert_to_f32(t.dtype(), t.data(), v.data(), v.size());
      for (size_t i = 0; i < v.size(); ++i) {
        if (t.dtype() == DType::kF32) t.f32()[i] = v[i] * scale;
        else t.data_as<uint16_t>()[i] = f32_to_bf16(v[i] * scale);
      }
    }
    tensors.emplace_back(e.name, t);
  }
  // Written beside and renamed over: the mapping of the old file stays valid until it is dropped.
  KL_CHECK(write_safetensors(path + ".tmp", tensors).ok(), "rewrite " + path);
  std::filesystem::rename(path + ".tmp", path);
}

// The narrowest decisions of the CPU reference running each prompt of `prompts` on the checkpoint
// in `dir` (one prefill each), then `greedy` greedy tokens after it (greedy − 1 decode steps).
struct Margins {
  float route;   // between two experts (or groups) at a router's top-k boundary
  float greedy;  // between a greedy pick's logit and the next one's (infinite without picks)
};
inline Margins decision_margins(const std::string& dir, const std::vector<std::vector<int32_t>>& prompts, int greedy) {
  cpu::CpuBackend be;
  auto model = Model::load(dir, be);
  KL_CHECK(model.ok(), model.status().to_string());
  auto cache = Cache::create((*model)->config(), be, CacheOptions{1, 64, 64 << 20});
  KL_CHECK(cache.ok(), cache.status().to_string());
  be.reset_route_margin();
  float greedy_margin = std::numeric_limits<float>::infinity();
  for (const std::vector<int32_t>& ids : prompts) {
    const SeqId s = (*cache)->open().value();
    auto logits = (*model)->forward_one(**cache, s, ids, LogitsMode::kLast);
    for (int i = 0; i < greedy; ++i) {
      KL_CHECK(logits.ok(), "reference run");
      std::vector<float> row(logits->f32(), logits->f32() + logits->numel());
      const int32_t next[1] = {argmax(row)};
      std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<>());
      greedy_margin = std::min(greedy_margin, row[0] - row[1]);
      if (i + 1 < greedy) logits = (*model)->forward_one(**cache, s, next, LogitsMode::kLast);
    }
    KL_CHECK(logits.ok(), "reference run");
    (*cache)->close(s);
  }
  return {be.min_route_margin(), greedy_margin};
}

// Writes a checkpoint of `config` into `dir` whose routing of each prompt in `prompts` and of its
// `greedy` greedy tokens keeps kRouteMargin, and whose greedy picks keep kGreedyMargin, trying
// seeds seed, seed+1, ...; returns the seed written (a test failure after kMaxDraws).
inline uint64_t write_untied_checkpoint(const Json& config, const std::string& dir,
                                        const std::vector<std::vector<int32_t>>& prompts, uint64_t seed,
                                        int greedy = 0) {
  for (int attempt = 0; attempt < kMaxDraws; ++attempt, ++seed) {
    KL_CHECK(write_random_checkpoint(config, dir, seed).ok(), "write checkpoint");
    scale_router_weights(dir, 10.0f);
    const Margins m = decision_margins(dir, prompts, greedy);
    if (m.route >= kRouteMargin && m.greedy >= kGreedyMargin) {
      std::printf("[ route ] weights seed %llu after %d redraws, margins %g (route), %g (greedy)\n",
                  (unsigned long long)seed, attempt, m.route, m.greedy);
      return seed;
    }
  }
  ADD_FAILURE() << "no seed in " << kMaxDraws << " gives routing and greedy picks clear of ties";
  return seed;
}

// For a checkpoint whose weights are given (a fixture): prompts `make(seed)`, redrawn with seed+1,
// ... until the routing keeps kRouteMargin (a test failure after kMaxDraws).
template <typename MakePrompts>
std::vector<std::vector<int32_t>> untied_prompts(const std::string& dir, uint64_t seed, MakePrompts make) {
  for (int attempt = 0; attempt < kMaxDraws; ++attempt, ++seed) {
    std::vector<std::vector<int32_t>> prompts = make(seed);
    const float margin = decision_margins(dir, prompts, 0).route;
    if (margin >= kRouteMargin) {
      std::printf("[ route ] prompt seed %llu after %d redraws, margin %g\n", (unsigned long long)seed, attempt, margin);
      return prompts;
    }
  }
  ADD_FAILURE() << "no seed in " << kMaxDraws << " gives prompts routed clear of ties";
  return make(seed);
}

// Where a model test's checkpoint comes from.
struct Source {
  std::string name;
  std::string fixture;  // a fixture model directory, or
  std::string preset;   // a preset with a patch (random weights)
  Json patch;
};
inline void PrintTo(const Source& s, std::ostream* os) { *os << s.name; }

// The config.json of a preset with `text_patch` merged into its text config.
inline Json patched_preset(const std::string& preset, const Json& text_patch) {
  Json cfg = preset_config(preset).value();
  Json& text = cfg.contains("text_config") ? cfg["text_config"] : cfg;
  text.merge_patch(text_patch);
  return cfg;
}

// Random ids inside the vocabulary of `config`.
inline std::vector<int32_t> random_ids(const Json& config, int64_t n, uint64_t seed) {
  const Json& text = config.contains("text_config") ? config["text_config"] : config;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> tok(0, text["vocab_size"].get<int32_t>() - 1);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& id : ids) id = tok(rng);
  return ids;
}

}  // namespace klinear::testing

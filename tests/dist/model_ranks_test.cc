// One model split over the launch's ranks (model/shard.h) against the whole model on one rank, on
// the CPU: every rank loads the whole fixture checkpoint alone (no communicator) and its part of it
// (the world's communicator), runs the same random prompt through both and compares. Layouts: tensor
// parallel over every rank with and without the vocabulary split, and tensor + expert parallel; on
// the Kimi Linear and K3 fixtures (K3's MXFP4 experts too) and K3 dummy weights. Each is exact up to
// the order of the sums over ranks: logits within a whole model's fp32 tolerance (testing::kModel,
// 1e-4; Kimi Linear stays within 1e-5, K3's random layers amplify the other order to 1.2e-5 on
// k3-tiny-mxfp4 over 2 ranks), and the same greedy tokens wherever the whole model's own top two
// are not within rounding of each other.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "dist/ranks.h"
#include "model/model.h"
#include "runtime/generate.h"
#include "test_util.h"

namespace klinear {
namespace {

struct Layout {
  const char* name;
  bool vocab;   // embedding and lm head split too
  bool experts; // routed experts split too
};
constexpr Layout kLayouts[] = {{"tensor parallel", true, false},
                               {"tensor parallel, whole vocabulary", false, false},
                               {"tensor + expert parallel", true, true}};
// The fixtures' checkpoints, and dummy weights (each rank makes its part of the one-rank values).
struct Source {
  const char* dir;
  LoadFormat format;
};
constexpr Source kSources[] = {{"kimi-linear-tiny/model", LoadFormat::kSafetensors},
                               {"k3-tiny/model", LoadFormat::kSafetensors},
                               {"k3-tiny-mxfp4/model", LoadFormat::kSafetensors},
                               {"k3-tiny/model", LoadFormat::kDummy}};

class ModelRanksTest : public testing::RanksTest {
 protected:
  ParallelSizes sizes(const Layout& l) const {
    const int p = size();
    return ParallelSizes{p, p, 1, l.experts ? p : 1, l.vocab ? p : 1, l.vocab ? p : 1};
  }
  std::unique_ptr<Model> load(const Source& source, const ModelRanks& ranks) {
    auto m = Model::load(testing::fixture_path(source.dir), *backend_, source.format, ranks);
    EXPECT_TRUE(m.ok()) << m.status().to_string();
    return m.ok() ? std::move(*m) : nullptr;
  }
  std::unique_ptr<Backend> backend_ = std::move(make_backend(BackendOptions{})).value();
};

// The logits of every position of `ids` (host [T, V]).
Tensor all_logits(Model& model, const std::vector<int32_t>& ids) {
  auto cache = Cache::create(model.config(), model.backend(), CacheOptions{});
  KL_CHECK(cache.ok(), cache.status().to_string());
  auto seq = (*cache)->open();
  KL_CHECK(seq.ok(), seq.status().to_string());
  auto logits = model.forward_one(**cache, *seq, ids, LogitsMode::kAll);
  EXPECT_TRUE(logits.ok()) << logits.status().to_string();
  return logits.ok() ? *logits : Tensor::empty(DType::kF32, {1, model.config().vocab_size});
}

TEST_F(ModelRanksTest, LogitsAndGreedyTokensEqualOneRank) {
  std::mt19937_64 rng(seed());
  for (const Source& source : kSources) {
    auto config = load_model_config(testing::fixture_path(source.dir));
    ASSERT_TRUE(config.ok()) << config.status().to_string();
    // A prompt length no rank count divides, of random ids.
    std::vector<int32_t> prompt(37);
    for (int32_t& id : prompt) id = static_cast<int32_t>(rng() % static_cast<uint64_t>(config->vocab_size));
    std::unique_ptr<Model> whole = load(source, {});
    ASSERT_TRUE(whole);
    GenerateOptions greedy;
    greedy.max_tokens = 12;
    greedy.ignore_eos = true;
    auto want = generate(*whole, prompt, greedy, nullptr);
    ASSERT_TRUE(want.ok()) << want.status().to_string();
    // The whole model's logits over the prompt and its tokens: the reference, and the margins of
    // its greedy picks.
    std::vector<int32_t> run = prompt;
    run.insert(run.end(), want->ids.begin(), want->ids.end() - 1);
    const Tensor reference = all_logits(*whole, run);
    for (const Layout& layout : kLayouts) {
      SCOPED_TRACE(std::string(source.dir) + (source.format == LoadFormat::kDummy ? " (dummy)" : "") + ", " + layout.name + " over " + std::to_string(size()) + " rank(s)");
      const ParallelSizes s = sizes(layout);
      ASSERT_TRUE(check_parallel(*config, s).ok()) << check_parallel(*config, s).to_string();
      std::unique_ptr<Model> part = load(source, ModelRanks{shard_of(s, rank()), &world()});
      ASSERT_TRUE(part);
      EXPECT_EQ(part->config().kda_heads * size(), config->kda_heads);
      EXPECT_TRUE(testing::all_close(all_logits(*part, run), reference, testing::kModel.rel(DType::kF32),
                                     testing::ErrorShape::kAmplified));
      auto got = generate(*part, prompt, greedy, nullptr);
      ASSERT_TRUE(got.ok()) << got.status().to_string();
      ASSERT_EQ(got->ids.size(), want->ids.size());
      // Up to the first difference, which only a near-tie of the whole model's may explain.
      const int64_t V = config->vocab_size, first = static_cast<int64_t>(prompt.size()) - 1;
      for (size_t i = 0; i < want->ids.size(); ++i) {
        if (got->ids[i] == want->ids[i]) continue;
        const float* row = reference.f32() + (first + static_cast<int64_t>(i)) * V;
        const float top = row[want->ids[i]], other = row[got->ids[i]];
        EXPECT_LT(top - other, 1e-5f * std::max(1.0f, std::fabs(top)))
            << "token " << i << ": " << got->ids[i] << " instead of " << want->ids[i] << " (logits " << other << " vs "
            << top << ")";
        break;
      }
    }
  }
}

}  // namespace
}  // namespace klinear

// --load-format dummy: real shapes from config.json alone. Dummy weights are deterministic (the
// same logits from two loads, on every backend row: counter-based values), well scaled (finite,
// moderate logits through both families, MXFP4 configs as dense experts), and counted exactly
// (the published Kimi-Linear-48B-A3B count less its 26 router bias vectors, which dummy weights
// leave at zero).
#include <gtest/gtest.h>

#include <cmath>

#include "backend_cases.h"
#include "io/presets.h"
#include "model/model.h"
#include "model/weights.h"
#include "test_util.h"

namespace klinear {
namespace {

class DummyWeights : public testing::BackendTest {};

TEST_P(DummyWeights, DeterministicAndWellScaled) {
  for (const char* fixture : {"kimi-linear-tiny", "k3-tiny", "k3-tiny-mxfp4"}) {
    SCOPED_TRACE(fixture);
    const std::string dir = testing::fixture_path(std::string(fixture) + "/model");
    Tensor first;
    for (int load = 0; load < 2; ++load) {
      auto model = Model::load(dir, be(), LoadFormat::kDummy);
      ASSERT_TRUE(model.ok()) << model.status().to_string();
      auto cache = Cache::create((*model)->config(), be(), CacheOptions{1, 64, 16 << 20});
      ASSERT_TRUE(cache.ok());
      auto logits = (*model)->forward_one(**cache, (*cache)->open().value(), std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7},
                                          LogitsMode::kAll);
      ASSERT_TRUE(logits.ok()) << logits.status().to_string();
      float mx = 0;
      for (int64_t i = 0; i < logits->numel(); ++i) {
        ASSERT_TRUE(std::isfinite(logits->f32()[i]));
        mx = std::max(mx, std::fabs(logits->f32()[i]));
      }
      EXPECT_GT(mx, 1e-3f);
      EXPECT_LT(mx, 100.0f);
      if (load == 0) first = *logits;
      else
        EXPECT_TRUE(testing::close_rel(*logits, first, testing::kExact.rel(DType::kF32))) << "two dummy loads differ";
    }
  }
}

KL_BACKEND_SUITE(DummyWeights);

TEST(DummyWeights, CountsThePublishedParameters) {
  auto cfg = parse_model_config(preset_config("kimi-linear-48b-a3b").value(), "preset").value();
  auto cpu = make_backend(BackendOptions{});
  // MODEL.md 1.1: 49,122,681,728 parameters in the checkpoint, 26 MoE layers × 256 router biases.
  EXPECT_EQ(count_parameters(cfg, **cpu), 49122681728ull - 26 * 256);
}

TEST(DummyWeights, ThroughTheCli) {
  const testing::ScratchDir dir;
  ASSERT_EQ(testing::run_cli("init --preset kimi-linear-48b-a3b --config-only --out " + dir.str()).exit_code, 0);
  const auto info = testing::run_cli("info --model " + dir.str() + " --load-format dummy");
  EXPECT_EQ(info.exit_code, 0) << info.all();
  EXPECT_NE(info.out.find("dummy weights: 49122675072 parameters"), std::string::npos) << info.out;
  const auto refused = testing::run_cli("init --preset kimi-linear-48b-a3b --out " + dir.file("big"));
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.err.find("--config-only"), std::string::npos) << refused.err;
  const auto gen = testing::run_cli("generate --model " + testing::fixture_path("k3-tiny/model") +
                                    " --load-format dummy --prompt-ids 1,2,3 --max-tokens 4 --ignore-eos --json");
  EXPECT_EQ(gen.exit_code, 0) << gen.all();
  EXPECT_NE(gen.out.find("\"ids\""), std::string::npos) << gen.out;
}

}  // namespace
}  // namespace klinear

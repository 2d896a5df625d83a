// --load-format dummy: real shapes from config.json alone. Dummy weights are deterministic (the
// same logits from two loads, on every backend row: counter-based values), well scaled (finite,
// moderate logits through both families, MXFP4 configs with MXFP4 experts: packed where the
// backend keeps them so), and counted exactly (the published Kimi-Linear-48B-A3B count less its 26
// router bias vectors, which dummy weights leave at zero; MXFP4 experts at 17/32 of a byte a
// weight when held packed).
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
  // MODEL.md 1.1: 49,122,681,728 parameters in the checkpoint, 26 MoE layers × 256 router biases.
  EXPECT_EQ(count_parameters(cfg), 49122681728ull - 26 * 256);
}

TEST(DummyWeights, CountsMxfp4ExpertsPacked) {
  auto cfg = parse_model_config(preset_config("kimi-linear-48b-a3b-mxfp4").value(), "preset").value();
  ASSERT_EQ(cfg.expert_format, ExpertFormat::kMxfp4);
  const uint64_t routed = 26ull * 256 * 3 * 2304 * 1024;  // MoE layers × experts × (w1, w3, w2)
  const WeightCount packed = count_weights(cfg, WeightStorage{DType::kBF16, Mxfp4Storage::kPacked});
  const WeightCount widened = count_weights(cfg, WeightStorage{DType::kBF16, Mxfp4Storage::kWidened});
  EXPECT_EQ(packed.parameters, 49122681728ull - 26 * 256);
  EXPECT_EQ(packed.bytes.at(DType::kU8), routed / 2 + routed / 32);
  EXPECT_EQ(widened.bytes.count(DType::kU8), 0u);
  EXPECT_EQ(widened.total_bytes() - packed.total_bytes(), routed * 2 - (routed / 2 + routed / 32));
}

TEST(DummyWeights, ThroughTheCli) {
  const testing::ScratchDir dir;
  ASSERT_EQ(testing::run_cli("init --preset kimi-linear-48b-a3b --config-only --out " + dir.str()).exit_code, 0);
  const auto info = testing::run_cli("info --model " + dir.str() + " --load-format dummy");
  EXPECT_EQ(info.exit_code, 0) << info.all();
  EXPECT_NE(info.out.find("on the device (bfloat16, MXFP4 experts packed): 49122675072 parameters"), std::string::npos) << info.out;
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

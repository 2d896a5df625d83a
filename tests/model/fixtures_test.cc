// The whole model against the golden fixtures (tests/fixtures/*/cases.json): prefill, continue
// (a second multi-token step from the cached state) and greedy decoding through the decode path.
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "runtime/sampler.h"
#include "test_util.h"

namespace klinear {
namespace {

using testing::close_rel;
using testing::fixture_path;

// The bar (the fixtures' own README allows 1e-3).
constexpr double kTol = 1e-4;

std::vector<int32_t> ids_of(const Json& j) { return j.get<std::vector<int32_t>>(); }

class FixtureTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string dir = fixture_path(GetParam());
    auto cases = read_json_file(dir + "/cases.json");
    ASSERT_TRUE(cases.ok()) << cases.status().to_string();
    cases_ = *cases;
    auto golden = SafetensorsFile::open(dir + "/golden.safetensors");
    ASSERT_TRUE(golden.ok()) << golden.status().to_string();
    golden_ = std::make_unique<SafetensorsFile>(std::move(golden).value());
    auto backend = make_backend(DeviceKind::kCpu);
    ASSERT_TRUE(backend.ok());
    backend_ = std::move(backend).value();
    auto model = Model::load(dir + "/" + cases_["model"].get<std::string>(), *backend_);
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    model_ = std::move(model).value();
  }
  Tensor golden(const std::string& name) {
    const SafetensorsEntry* e = golden_->find(name);
    KL_CHECK(e != nullptr, "golden tensor " + name);
    return golden_->tensor(*e);
  }
  Tensor run(SequenceState& s, const std::vector<int32_t>& ids) {
    auto r = model_->forward(ids, s, LogitsMode::kAll);
    KL_CHECK(r.ok(), r.status().to_string());
    return *r;
  }

  Json cases_;
  std::unique_ptr<SafetensorsFile> golden_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
};

TEST_P(FixtureTest, Prefill) {
  int n = 0;
  for (const Json& c : cases_["cases"]) {
    if (c["kind"] != "prefill") continue;
    SequenceState s = model_->new_sequence();
    EXPECT_TRUE(close_rel(run(s, ids_of(c["input_ids"])), golden(c["name"]), kTol)) << c["name"];
    ++n;
  }
  EXPECT_GT(n, 0);
}

TEST_P(FixtureTest, Continue) {
  int n = 0;
  for (const Json& c : cases_["cases"]) {
    if (c["kind"] != "continue") continue;
    SequenceState s = model_->new_sequence();
    EXPECT_TRUE(close_rel(run(s, ids_of(c["first_ids"])), golden(c["name"].get<std::string>() + "_first"), kTol));
    EXPECT_TRUE(close_rel(run(s, ids_of(c["second_ids"])), golden(c["name"].get<std::string>() + "_second"), kTol));
    ++n;
  }
  EXPECT_GT(n, 0);
}

TEST_P(FixtureTest, Greedy) {
  int n = 0;
  for (const Json& c : cases_["cases"]) {
    if (c["kind"] != "greedy") continue;
    const std::vector<int32_t> expected = ids_of(c["expected_tokens"]);
    const Tensor steps = golden("greedy_step_logits");
    const int64_t vocab = steps.dim(1);
    SequenceState s = model_->new_sequence();
    auto logits = model_->forward(ids_of(c["prompt_ids"]), s, LogitsMode::kLast);
    ASSERT_TRUE(logits.ok());
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_TRUE(close_rel(*logits, steps.rows(static_cast<int64_t>(i), static_cast<int64_t>(i) + 1), kTol))
          << "step " << i;
      const int32_t next = argmax(std::span<const float>(logits->f32(), static_cast<size_t>(vocab)));
      ASSERT_EQ(next, expected[i]) << "greedy token " << i;
      const int32_t one[1] = {next};
      logits = model_->forward(one, s, LogitsMode::kLast);
      ASSERT_TRUE(logits.ok());
    }
    ++n;
  }
  EXPECT_GT(n, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FixtureTest,
                         ::testing::Values("kimi-linear-tiny", "kimi-linear-tiny-bf16", "k3-tiny", "k3-tiny-mxfp4"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n) if (ch == '-') ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace klinear

// generate(): a prompt prefilled in chunks of any size (1, 7, 64, 100 or all at once) gives the
// same greedy continuation, so long prompts can run in bounded pieces; the options are validated.
#include <gtest/gtest.h>

#include "model/model_cases.h"
#include "runtime/generate.h"
#include "test_util.h"

namespace klinear {
namespace {

TEST(Generate, PrefillChunkSizeDoesNotChangeTheResult) {
  const testing::ScratchDir dir;
  const uint64_t seed = testing::fresh_seed();
  const Json cfg = testing::patched_preset("k3-tiny", Json::object());
  const std::vector<int32_t> prompt = testing::random_ids(cfg, 150, seed);
  constexpr int kTokens = 8;
  testing::write_untied_checkpoint(cfg, dir.str(), {prompt}, seed, kTokens);
  auto be = make_backend(BackendOptions{});
  ASSERT_TRUE(be.ok());
  auto model = Model::load(dir.str(), **be);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  GenerateOptions o;
  o.max_tokens = kTokens;
  o.ignore_eos = true;
  o.prefill_chunk = 4096;
  const auto whole = generate(**model, prompt, o, nullptr);
  ASSERT_TRUE(whole.ok()) << whole.status().to_string();
  ASSERT_EQ(whole->ids.size(), static_cast<size_t>(kTokens));
  for (int64_t chunk : {1, 7, 64, 100}) {
    o.prefill_chunk = chunk;
    const auto r = generate(**model, prompt, o, nullptr);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->ids, whole->ids) << "prefill chunk " << chunk;
  }
  o.prefill_chunk = 0;
  EXPECT_FALSE(generate(**model, prompt, o, nullptr).ok());
  o.prefill_chunk = 64;
  EXPECT_FALSE(generate(**model, std::vector<int32_t>{}, o, nullptr).ok()) << "an empty prompt";
}

}  // namespace
}  // namespace klinear

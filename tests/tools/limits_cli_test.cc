// Limits through the CLI: generation that reaches the model's context keeps what it made
// (finish_reason "length", context_full), a prompt longer than the context is refused before
// anything runs, chat says the context is full and stays usable after /reset, and non-finite
// weights give an error instead of tokens (with --check-finite naming the first bad layer).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "io/json.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace klinear {
namespace {

using testing::CliRun;
using testing::run_cli;

// A copy of a fixture model in `dir` with config.json patched by `patch`.
void copy_model(const std::string& fixture, const std::string& dir, const Json& patch) {
  const std::string src = testing::fixture_path(fixture + "/model");
  std::filesystem::copy_file(src + "/model.safetensors", dir + "/model.safetensors");
  Json cfg = read_json_file(src + "/config.json").value();
  cfg.merge_patch(patch);
  std::ofstream(dir + "/config.json") << cfg.dump(2);
}

std::string ids(int from, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += (i ? "," : "") + std::to_string(from + i);
  return s;
}

TEST(Limits, GenerateKeepsWhatItMadeAtTheContext) {
  const testing::ScratchDir dir;
  copy_model("kimi-linear-tiny", dir.str(), Json{{"max_position_embeddings", 16}});
  for (int prompt : {10, 15}) {
    const CliRun r = run_cli("generate --model " + dir.str() + " --prompt-ids " + ids(3, prompt) +
                             " --max-tokens 50 --ignore-eos --json");
    ASSERT_EQ(r.exit_code, 0) << r.all();
    const Json out = Json::parse(r.out);
    EXPECT_EQ(out["finish_reason"], "length");
    EXPECT_EQ(out["context_full"], true);
    // Every position of the context is used, and the token sampled after the last one is kept.
    EXPECT_EQ(out["ids"].size(), static_cast<size_t>(16 - prompt + 1)) << r.out;
  }
  const CliRun ok = run_cli("generate --model " + dir.str() + " --prompt-ids 1,2 --max-tokens 3 --ignore-eos --json");
  ASSERT_EQ(ok.exit_code, 0) << ok.all();
  EXPECT_EQ(Json::parse(ok.out)["context_full"], false);
}

TEST(Limits, PromptLongerThanTheContextIsRefused) {
  const testing::ScratchDir dir;
  copy_model("k3-tiny", dir.str(), Json{{"text_config", {{"max_position_embeddings", 12}}}});
  for (int prompt : {13, 40}) {
    const CliRun r = run_cli("generate --model " + dir.str() + " --prompt-ids " + ids(1, prompt) + " --max-tokens 2");
    EXPECT_EQ(r.exit_code, 2) << r.all();
    EXPECT_NE(r.err.find("does not fit the model's context of 12 tokens"), std::string::npos) << r.err;
  }
}

TEST(Limits, ChatSaysTheContextIsFullAndResets) {
  const testing::ScratchDir dir;
  const std::string model = dir.file("m");
  ASSERT_EQ(run_cli("init --preset kimi-linear-tiny --tokenizer " + testing::kimi_tokenizer_dir() + " --out " + model).exit_code, 0);
  Json cfg = read_json_file(model + "/config.json").value();
  cfg["max_position_embeddings"] = 40;
  std::ofstream(model + "/config.json") << cfg.dump(2);
  std::ofstream(dir.file("in")) << "hello there\nand again\n/reset\nhi\n";
  const CliRun r = run_cli("chat --model " + model + " --max-tokens 60 --ignore-eos --temperature 0 < " + dir.file("in"));
  EXPECT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.err.find("now fills the model's context"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("reset it to go on"), std::string::npos) << r.err;  // "and again" is refused
  EXPECT_NE(r.err.find("a new conversation"), std::string::npos) << r.err;
  // "hi" after the reset fills the context again: the session answered it.
  const size_t reset = r.err.find("a new conversation");
  EXPECT_NE(r.err.find("now fills the model's context", reset), std::string::npos) << r.err;
}

TEST(Limits, NonFiniteWeightsAreAnErrorNamingTheLayer) {
  std::mt19937_64 rng(testing::fresh_seed());
  for (const char* fixture : {"kimi-linear-tiny", "k3-tiny"}) {
    const testing::ScratchDir dir;
    copy_model(fixture, dir.str(), Json::object());
    // Poison one element of one weight of a random layer's FFN down projection.
    auto file = SafetensorsFile::open(dir.file("model.safetensors"));
    ASSERT_TRUE(file.ok());
    const int layer = 1 + static_cast<int>(rng() % 3);
    std::vector<std::pair<std::string, Tensor>> tensors;
    std::string poisoned;
    for (const SafetensorsEntry& e : file->entries()) {
      Tensor src = file->tensor(e);
      Tensor t = Tensor::empty(src.dtype(), src.shape());
      std::memcpy(t.data(), src.data(), src.nbytes());
      if (poisoned.empty() && e.name.find("layers." + std::to_string(layer) + ".") != std::string::npos &&
          e.name.find("down_proj") != std::string::npos && (t.dtype() == DType::kBF16 || t.dtype() == DType::kF32)) {
        if (t.dtype() == DType::kF32) t.f32()[0] = std::numeric_limits<float>::infinity();
        else t.data_as<uint16_t>()[0] = 0x7fc0;  // bf16 NaN
        poisoned = e.name;
      }
      tensors.emplace_back(e.name, t);
    }
    ASSERT_FALSE(poisoned.empty());
    file = Status::NotFound("closed");
    ASSERT_TRUE(write_safetensors(dir.file("model.safetensors"), tensors).ok());
    SCOPED_TRACE(std::string(fixture) + ": " + poisoned);

    const CliRun plain = run_cli("generate --model " + dir.str() + " --prompt-ids 1,2,3 --max-tokens 4 --json");
    EXPECT_NE(plain.exit_code, 0) << plain.all();
    EXPECT_NE(plain.err.find("not finite"), std::string::npos) << plain.err;
    const CliRun checked = run_cli("generate --model " + dir.str() + " --prompt-ids 1,2,3 --max-tokens 4 --check-finite");
    EXPECT_NE(checked.exit_code, 0) << checked.all();
    EXPECT_NE(checked.err.find("layer " + std::to_string(layer) + " ("), std::string::npos) << checked.err;
    EXPECT_NE(checked.err.find("FFN output is not finite"), std::string::npos) << checked.err;
    // logits wrote the NaN rows and exited 0; now it fails as generate does, writing nothing.
    const CliRun logits = run_cli("logits --model " + dir.str() + " --ids 1,2,3 --out " + dir.file("l.npy"));
    EXPECT_NE(logits.exit_code, 0) << logits.all();
    EXPECT_NE(logits.err.find("not finite"), std::string::npos) << logits.err;
    EXPECT_FALSE(std::filesystem::exists(dir.file("l.npy")));
    const CliRun logits_checked =
        run_cli("logits --model " + dir.str() + " --ids 1,2,3 --check-finite --out " + dir.file("l.npy"));
    EXPECT_NE(logits_checked.err.find("layer " + std::to_string(layer) + " ("), std::string::npos) << logits_checked.err;
  }
}

}  // namespace
}  // namespace klinear

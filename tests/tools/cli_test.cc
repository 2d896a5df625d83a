// The klinear CLI end to end: the interfaces the issues spell out (logits, generate --json, info,
// init, --help everywhere) against the fixtures, and bad input (missing or corrupt files, malformed
// ids, ids outside the vocabulary) giving a clear message and a non-zero exit, never a crash.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "io/json.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace klinear {
namespace {

using testing::CliRun;

CliRun run(const std::string& args) { return testing::run_cli(args); }

std::string join(const Json& ids) {
  std::string s;
  for (const auto& id : ids) {
    if (!s.empty()) s += ',';
    s += std::to_string(id.get<int>());
  }
  return s;
}

const Json& find_case(const Json& cases, const std::string& name) {
  for (const Json& c : cases["cases"])
    if (c["name"] == name) return c;
  KL_CHECK(false, "no case " + name);
  return cases;
}

std::string tmp(const std::string& name) { return ::testing::TempDir() + "klinear_cli_" + name; }

TEST(Cli, HelpOnEveryCommand) {
  for (const char* sub : {"", "logits", "generate", "chat", "info", "init", "tokenize", "detokenize", "serve", "run",
                          "bench-serve", "kda"}) {
    const CliRun r = run(std::string(sub) + " --help");
    EXPECT_EQ(r.exit_code, 0) << sub << ": " << r.all();
    EXPECT_NE(r.all().find("--"), std::string::npos) << sub;
  }
}

TEST(Cli, LogitsThenMatchesGolden) {
  const std::string dir = testing::fixture_path("k3-tiny");
  const Json cases = read_json_file(dir + "/cases.json").value();
  const Json& c = find_case(cases, "continue");
  const std::string out = tmp("logits.npy");
  const CliRun r = run("logits --model " + dir + "/model --ids " + join(c["first_ids"]) + " --then " +
                    join(c["second_ids"]) + " --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  auto got = read_npy(out);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  auto golden = SafetensorsFile::open(dir + "/golden.safetensors");
  ASSERT_TRUE(golden.ok());
  EXPECT_TRUE(testing::close_rel(*got, golden->tensor(*golden->find("continue_second")),
                                  testing::kModel.rel(DType::kF32)));
}

TEST(Cli, GenerateGreedyJsonMatchesFixture) {
  const std::string dir = testing::fixture_path("kimi-linear-tiny");
  const Json cases = read_json_file(dir + "/cases.json").value();
  const Json& c = find_case(cases, "greedy");
  const CliRun r = run("generate --model " + dir + "/model --prompt-ids " + join(c["prompt_ids"]) + " --max-tokens " +
                    std::to_string(c["expected_tokens"].size()) + " --temperature 0 --ignore-eos --json");
  ASSERT_EQ(r.exit_code, 0) << r.all();
  auto out = parse_json(r.all(), "generate output");
  ASSERT_TRUE(out.ok()) << r.all();
  EXPECT_EQ((*out)["ids"], c["expected_tokens"]);
}

TEST(Cli, InitInfoAndSeededSampling) {
  const std::string dir = tmp("init_k3");
  std::filesystem::remove_all(dir);
  ASSERT_EQ(run("init --preset k3-tiny-mxfp4 --out " + dir + " --seed 7").exit_code, 0);
  const CliRun info = run("info --model " + dir);
  ASSERT_EQ(info.exit_code, 0) << info.all();
  EXPECT_NE(info.all().find("MXFP4"), std::string::npos) << info.all();
  EXPECT_NE(info.all().find("(seal)"), std::string::npos) << info.all();
  const std::string gen = "generate --model " + dir + " --prompt-ids 1,2,3 --max-tokens 6 --temperature 0.9 "
                          "--top-k 50 --top-p 0.9 --ignore-eos --json --seed ";
  const CliRun a = run(gen + "5"), b = run(gen + "5");
  ASSERT_EQ(a.exit_code, 0) << a.all();
  EXPECT_EQ(parse_json(a.all(), "a").value()["ids"], parse_json(b.all(), "b").value()["ids"]);
  EXPECT_EQ(parse_json(a.all(), "a").value()["ids"].size(), 6u);
  std::filesystem::remove_all(dir);
}

// A preset of the real vocabulary gets its family's tokenizer files without --tokenizer (K3's for
// k3-demo: its markers are K3's specials); --tokenizer still picks another; tiny presets get none.
TEST(Cli, InitGivesDemoPresetsTheirTokenizer) {
  const testing::ScratchDir dir;
  auto config_of = [](const std::string& d) {
    std::ifstream f(d + "/tokenizer_config.json");
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  ASSERT_EQ(run("init --preset k3-demo --config-only --out " + dir.file("k3")).exit_code, 0);
  EXPECT_TRUE(std::filesystem::exists(dir.file("k3") + "/tiktoken.model"));
  EXPECT_NE(config_of(dir.file("k3")).find("<|end_of_msg|>"), std::string::npos);
  ASSERT_EQ(run("init --preset kimi-linear-demo --config-only --out " + dir.file("k2")).exit_code, 0);
  EXPECT_NE(config_of(dir.file("k2")).find("<|im_end|>"), std::string::npos);
  EXPECT_EQ(config_of(dir.file("k2")).find("<|end_of_msg|>"), std::string::npos);
  ASSERT_EQ(run("init --preset k3-demo --config-only --out " + dir.file("k3k2") + " --tokenizer " +
                testing::source_path("tokenizers/kimi-k2")).exit_code, 0);
  EXPECT_EQ(config_of(dir.file("k3k2")).find("<|end_of_msg|>"), std::string::npos);
  ASSERT_EQ(run("init --preset kimi-linear-tiny --config-only --out " + dir.file("tiny")).exit_code, 0);
  EXPECT_FALSE(std::filesystem::exists(dir.file("tiny") + "/tiktoken.model"));
}

// The README flow: a demo checkpoint carrying the real tokenizer, text in and text out.
TEST(Cli, InitWithTokenizerThenPromptAndChat) {
  const testing::ScratchDir dir;
  const std::string model = dir.file("demo");
  ASSERT_EQ(run("init --preset kimi-linear-tiny --out " + model + " --tokenizer " +
                testing::source_path("tokenizers/kimi-k2")).exit_code, 0);
  EXPECT_TRUE(std::filesystem::exists(model + "/tiktoken.model"));
  const CliRun info = run("info --model " + model);
  EXPECT_NE(info.all().find("vocab 163840"), std::string::npos) << info.all();

  const CliRun gen = run("generate --model " + model + " --prompt 'Hello, world!' --max-tokens 5 --json --ignore-eos");
  ASSERT_EQ(gen.exit_code, 0) << gen.all();
  const Json out = parse_json(gen.all(), "generate output").value();
  EXPECT_EQ(out["ids"].size(), 5u);
  EXPECT_EQ(out["prompt_tokens"], 4);  // "Hello", ",", " world", "!"
  EXPECT_TRUE(out["text"].is_string());

  const CliRun chat = run("chat --model " + model + " --max-tokens 4 < <(printf 'Hi\\nMore\\n')");
  EXPECT_EQ(chat.exit_code, 0) << chat.all();
  // Two turns of the K2 format: at least both user turns, their markers and 4 reply tokens each.
  const size_t at = chat.all().rfind("klinear chat: ");
  ASSERT_NE(at, std::string::npos) << chat.all();
  EXPECT_GT(std::stoi(chat.all().substr(at + 14)), 20) << chat.all();
}

// A checkpoint larger than memory is refused before loading starts (a sparse 256 GiB file).
TEST(Cli, CheckpointLargerThanMemoryIsRefused) {
  const testing::ScratchDir dir;
  std::filesystem::copy_file(testing::fixture_path("kimi-linear-tiny/model/config.json"), dir.file("config.json"));
  const uint64_t bytes = uint64_t{1} << 38;
  std::string header = Json{{"huge", {{"dtype", "F32"}, {"shape", {uint64_t{1} << 18, uint64_t{1} << 18}},
                                      {"data_offsets", {0, bytes}}}}}.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  {
    std::ofstream out(dir.file("model.safetensors"), std::ios::binary);
    const uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>(n >> (8 * i)));
    out << header;
  }
  std::filesystem::resize_file(dir.file("model.safetensors"), 8 + header.size() + bytes);
  const CliRun r = run("logits --model " + dir.str() + " --ids 1 --out /dev/null");
  EXPECT_EQ(r.exit_code, 1) << r.all();
  EXPECT_NE(r.all().find("ResourceExhausted"), std::string::npos) << r.all();
  EXPECT_NE(r.all().find("GiB is available"), std::string::npos) << r.all();
}

TEST(Cli, BadInputIsAClearErrorNotACrash) {
  const std::string model = testing::fixture_path("kimi-linear-tiny/model");
  struct Case {
    std::string args, expect;
  };
  const std::string corrupt = tmp("corrupt");
  std::filesystem::remove_all(corrupt);
  std::filesystem::create_directories(corrupt);
  std::filesystem::copy_file(model + "/config.json", corrupt + "/config.json");
  {
    // A checkpoint cut in half.
    std::ifstream in(model + "/model.safetensors", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(corrupt + "/model.safetensors", std::ios::binary).write(bytes.data(), bytes.size() / 2);
  }
  const std::vector<Case> cases = {
      {"logits --model /nonexistent/dir --ids 1 --out /dev/null", "/nonexistent/dir"},
      {"logits --model " + model + " --ids 1,x,3 --out /dev/null", "'x'"},
      {"logits --model " + model + " --ids 1,99999 --out /dev/null", "99999"},
      {"logits --model " + corrupt + " --ids 1 --out /dev/null", "truncated"},
      {"generate --model " + model + " --prompt-ids 1 --temperature -1", "temperature"},
      {"generate --model " + model + " --prompt-ids 1 --top-p 0", "top_p"},
      {"logits --model " + model + " --ids 1 --device tpu --out /dev/null", "tpu"},
      {"logits --model " + model + " --ids 1 --attention-kernels fastest --out /dev/null", "fastest"},
      {"init --preset nope --out " + tmp("nope"), "nope"},
  };
  for (const Case& c : cases) {
    const CliRun r = run(c.args);
    EXPECT_GT(r.exit_code, 0) << c.args << "\n" << r.all();
    EXPECT_NE(r.all().find(c.expect), std::string::npos) << c.args << "\n" << r.all();
  }
  std::filesystem::remove_all(corrupt);
}

}  // namespace
}  // namespace klinear

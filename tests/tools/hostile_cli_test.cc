// Hostile input to the klinear CLI, as generated tables: every case runs under `ulimit -v` (2 GB,
// except under ASan) and `timeout`, and must exit with the documented code (2 bad input, 1 other
// failure) and a message naming the problem, never hang, crash or exhaust memory. Covers config
// values, filesystem surprises, tokenizer files, numeric flags, non-finite weights (info
// --verify), the init preset's ids, and output that cannot be written.
#include <gtest/gtest.h>

#include <cstring>

#include "hostile_util.h"
#include "io/config.h"
#include "io/json.h"
#include "io/presets.h"

namespace klinear {
namespace {

using testing::CliRun;
using testing::Hostile;
using testing::ScratchDir;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

constexpr int64_t kMemoryKb = 2 << 20;  // 2 GB of address space
constexpr int kSeconds = 60;

// `klinear args` under the memory and time limits (timeout exits 124 when the time runs out).
CliRun run_limited(const std::string& args) {
  const std::string limits = (testing::kAsan ? std::string() : "ulimit -v " + std::to_string(kMemoryKb) + "; ") +
                             "timeout " + std::to_string(kSeconds) + " ";
  return testing::run_cli_prefixed(limits, args);
}

const std::string kModel = testing::fixture_path("kimi-linear-tiny/model");
const std::string kK3Model = testing::fixture_path("k3-tiny/model");

// A copy of a fixture checkpoint directory whose config.json gets `edit`.
void copy_model(const std::string& from, const std::string& to) {
  std::filesystem::copy(from, to, std::filesystem::copy_options::recursive);
}

// ---- config values -------------------------------------------------------------------------------

TEST(HostileCli, ConfigValuesAreBoundedBeforeAnythingRuns) {
  struct Case {
    const char* field;
    Json value;
  };
  const std::vector<Case> cases = {
      {"num_hidden_layers", int64_t{1000000000000}}, {"num_attention_heads", int64_t{1} << 60},
      {"vocab_size", (int64_t{1} << 62) + 1},        {"hidden_size", int64_t{1} << 40},
      {"max_position_embeddings", -1},               {"rms_norm_eps", 1e300},
      {"routed_scaling_factor", -2.0},               {"eos_token_id", "x2"},
      {"bos_token_id", -7},                          {"num_experts", int64_t{1} << 61},
  };
  for (const char* family : {"kimi-linear-tiny", "k3-tiny"}) {
    for (const Case& c : cases) {
      const ScratchDir dir;
      const std::string model = dir.file("model");
      copy_model(testing::fixture_path(std::string(family) + "/model"), model);
      Json cfg = read_json_file(model + "/config.json").value();
      (cfg.contains("text_config") ? cfg["text_config"] : cfg)[c.field] = c.value;
      if (std::string(c.field).find("token_id") != std::string::npos) cfg[c.field] = c.value;
      testing::write_file(model + "/config.json", cfg.dump());
      for (const char* cmd : {"info --model ", "generate --prompt-ids 1,2 --max-tokens 2 --model "}) {
        const CliRun r = run_limited(cmd + model);
        EXPECT_EQ(r.exit_code, 2) << family << " " << c.field << "=" << c.value.dump() << ": " << r.all();
        EXPECT_TRUE(contains(r.err, c.field) && contains(r.err, "InvalidArgument"))
            << family << " " << c.field << ": " << r.err;
      }
    }
  }
}

// ---- filesystem surprises ------------------------------------------------------------------------

TEST(HostileCli, OnlyRegularFilesAreRead) {
  struct Slot {
    const char* file;
    const char* command;  // run with the directory appended
    bool size_limited;
  };
  const std::vector<Slot> slots = {
      {"config.json", "info --model ", true},
      {"model.safetensors", "info --model ", false},
      {"tiktoken.model", "tokenize --text hi --tokenizer ", true},
      {"tokenizer_config.json", "tokenize --text hi --tokenizer ", true},
  };
  const std::string tokenizer = testing::kimi_tokenizer_dir();
  for (const Slot& s : slots) {
    for (Hostile h : testing::all_hostile()) {
      if (h == Hostile::kOversize && !s.size_limited) continue;
      const ScratchDir dir;
      const std::string target = dir.file("d");
      if (std::string(s.command).rfind("info", 0) == 0) {
        copy_model(kModel, target);
      } else {
        std::filesystem::create_directory(target);
        for (const char* f : {"tiktoken.model", "tokenizer_config.json"})
          std::filesystem::copy_file(tokenizer + "/" + f, target + "/" + f);
      }
      const std::string path = target + "/" + s.file;
      testing::make_hostile(path, h, (64ll << 20) + 1);
      const CliRun r = run_limited(s.command + target);
      const std::string what = std::string(s.file) + " as " + testing::hostile_name(h);
      EXPECT_EQ(r.exit_code, h == Hostile::kOversize ? 1 : 2) << what << ": " << r.all();
      EXPECT_TRUE(contains(r.err, path) && contains(r.err, testing::hostile_reason(h))) << what << ": " << r.err;
    }
  }
}

TEST(HostileCli, UnexaminablePathsAreErrors) {
  const ScratchDir dir;
  const std::string loop = dir.file("loop");
  testing::make_hostile(loop, Hostile::kSymlinkLoop, 0);
  std::string deep = dir.str();
  for (int i = 0; i < 1100; ++i) deep += "/abc";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {dir.file(std::string(300, 'm')), std::strerror(ENAMETOOLONG)},
      {deep, std::strerror(ENAMETOOLONG)},
      {loop, std::strerror(ELOOP)},
  };
  for (const auto& [path, reason] : cases) {
    for (const char* cmd : {"info --model ", "generate --prompt-ids 1 --model ", "tokenize --text x --tokenizer ",
                            "generate --prompt-ids 1 --model " /* tokenizer below */}) {
      const CliRun r = run_limited(cmd + path);
      EXPECT_EQ(r.exit_code, 2) << cmd << path.substr(0, 60) << ": " << r.all().substr(0, 400);
      EXPECT_TRUE(contains(r.err, reason)) << cmd << ": " << r.err.substr(0, 400);
    }
    const CliRun r = run_limited("generate --prompt hi --model " + kModel + " --tokenizer " + path);
    EXPECT_EQ(r.exit_code, 2) << r.all().substr(0, 400);
    EXPECT_TRUE(contains(r.err, reason)) << r.err.substr(0, 400);
  }
}

// init --tokenizer copies the tokenizer's files; an optional one that cannot be examined (a
// symlink loop) used to escape as an uncaught std::filesystem_error.
TEST(HostileCli, InitTokenizerFilesThatCannotBeExamined) {
  const ScratchDir dir;
  const std::string tok = dir.file("tok");
  std::filesystem::create_directory(tok);
  for (const char* f : {"tiktoken.model", "tokenizer_config.json"})
    std::filesystem::copy_file(testing::kimi_tokenizer_dir() + "/" + f, tok + "/" + f);
  testing::make_hostile(tok + "/NOTICE.md", Hostile::kSymlinkLoop, 0);
  const CliRun r = run_limited("init --preset kimi-linear-tiny --out " + dir.file("m") + " --tokenizer " + tok);
  EXPECT_EQ(r.exit_code, 2) << r.all();
  EXPECT_TRUE(contains(r.err, tok + "/NOTICE.md") && contains(r.err, std::strerror(ELOOP))) << r.err;
}

// A FIFO as a shard named by the index used to block in open() for ever.
TEST(HostileCli, FifoShardDoesNotHang) {
  const ScratchDir dir;
  const std::string model = dir.file("m");
  copy_model(kModel, model);
  std::filesystem::rename(model + "/model.safetensors", model + "/real.safetensors");
  Json index{{"weight_map", Json::object()}};
  const auto file = SafetensorsFile::open(model + "/real.safetensors").value();
  for (const auto& e : file.entries()) index["weight_map"][e.name] = e.name.size() % 2 ? "real.safetensors" : "fifo.safetensors";
  testing::write_file(model + "/model.safetensors.index.json", index.dump());
  testing::make_hostile(model + "/fifo.safetensors", Hostile::kFifo, 0);
  for (const char* cmd : {"info --model ", "generate --prompt-ids 1 --model "}) {
    const CliRun r = run_limited(cmd + model);
    EXPECT_EQ(r.exit_code, 2) << r.all();
    EXPECT_TRUE(contains(r.err, model + "/fifo.safetensors: is a FIFO")) << r.err;
  }
}

// ---- tokenizer files -------------------------------------------------------------------------------

TEST(HostileCli, TokenizerRanksAreBoundedByTheFile) {
  for (const char* rank : {"999999999", "500000000", "300000000", "2147483000"}) {
    const ScratchDir dir;
    testing::write_file(dir.file("tiktoken.model"), testing::small_ranks() + testing::base64("qq") + " " + rank + "\n");
    testing::write_file(dir.file("tokenizer_config.json"), "{}");
    const CliRun r = run_limited("tokenize --text hi --tokenizer " + dir.str());
    EXPECT_EQ(r.exit_code, 2) << rank << ": " << r.all();
    EXPECT_TRUE(contains(r.err, "tiktoken.model") && contains(r.err, "is missing")) << r.err;
  }
}

// ---- numeric flags ---------------------------------------------------------------------------------

TEST(HostileCli, NumericFlagsAreRangeChecked) {
  const std::string gen = "generate --model " + kModel + " --prompt-ids 1,2 --max-tokens 1 ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {gen + "--seed -1", "--seed"},
      {gen + "--seed 18446744073709551616", "--seed"},
      {gen + "--seed 0x10", "--seed"},
      {gen + "--seed 1e3", "--seed"},
      {gen + "--max-tokens -1", "--max-tokens"},
      {gen + "--max-tokens 99999999999", "--max-tokens"},
      {gen + "--top-k -3", "--top-k"},
      {gen + "--temperature nan", "--temperature"},
      {gen + "--temperature -0.5", "--temperature"},
      {gen + "--top-p 1.5", "--top-p"},
      {"init --preset kimi-linear-tiny --out /nonexistent/x --seed -5", "--seed"},
      {"generate --model " + kModel + " --prompt-ids 1,-2", "--prompt-ids: item 1"},
      {"generate --model " + kModel + " --prompt-ids 1,2147483648", "--prompt-ids: item 1"},
      {"logits --model " + kModel + " --ids 3,x --out /dev/null", "--ids: item 1"},
      {"detokenize --tokenizer " + testing::kimi_tokenizer_dir() + " --ids 99999999999999999999", "--ids: item 0"},
      {gen + "--page-size 0", "--page-size"},
      {gen + "--page-size 100000", "--page-size"},
      // serve checks it before loading (it took any positive size and served)
      {"serve --model " + kModel + " --port 0 --page-size 0", "--page-size"},
      {"serve --model " + kModel + " --port 0 --page-size 99999", "--page-size"},
      // serve's own flags: each was taken before (a port over 65535 bound another port, a negative
      // queue answered 503 to everything, a huge one aborted, an empty key turned authentication off)
      {"serve --model " + kModel + " --port 70000", "--port"},
      {"serve --model " + kModel + " --port 99999", "--port"},
      {"serve --model " + kModel + " --port 0 --max-queue -1", "--max-queue"},
      {"serve --model " + kModel + " --port 0 --max-queue 1000000000", "--max-queue"},
      {"serve --model " + kModel + " --port 0 --max-queue 1e9", "--max-queue"},
      {"serve --model " + kModel + " --port 0 --api-key ''", "--api-key"},
  };
  for (const auto& [args, flag] : cases) {
    const CliRun r = run_limited(args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.all();
    EXPECT_TRUE(contains(r.err, flag)) << args << ": " << r.err;
  }
  // The largest seed is a seed, not an error.
  EXPECT_EQ(run_limited(gen + "--seed 18446744073709551615 --temperature 1").exit_code, 0);
}

// Each flag error names the flag, what was expected and what was given (issue 34 item 10), when
// the command line is parsed where it can be. Before: --max-num-tokens 0 said only "must be >= 1"
// and any larger value passed; --max-body-bytes took any value; --cache-memory 99999999999G
// wrapped to another size and a 23-digit one aborted (std::stoull threw); --device, --dtype and
// --load-format did not name the flag; run's penalties were not checked, so each line failed
// naming the JSON field; generate and tokenize said "one of" without what was given; tokenize's
// --file did not name the flag.
TEST(HostileCli, MessagesNameTheFlagTheExpectedAndTheActual) {
  const ScratchDir dir;
  testing::write_file(dir.file("in.jsonl"), R"({"prompt_ids": [1]})" "\n");
  const std::string run = "run --model " + kModel + " --input " + dir.file("in.jsonl") + " --output " + dir.file("out.jsonl") + " ";
  const std::string serve = "serve --model " + kModel + " --port 0 ";
  const std::string gen = "generate --model " + kModel + " ";
  const std::string chat = "chat --model " + kModel + " --tokenizer " + testing::kimi_tokenizer_dir() + " ";
  const std::string tok = "tokenize --tokenizer " + testing::kimi_tokenizer_dir() + " ";
  struct Row {
    std::string args;
    int exit_code;
    std::vector<std::string> message;  // substrings of stderr
  };
  const std::vector<Row> rows = {
      {run + "--max-num-tokens 0", 2, {"--max-num-tokens", "'0'", "[1, 1048576]"}},
      {serve + "--max-num-tokens 99999999999", 2, {"--max-num-tokens", "'99999999999'", "[1, 1048576]"}},
      {serve + "--max-body-bytes 0", 2, {"--max-body-bytes", "'0'", "[1024, 1073741824]"}},
      {serve + "--max-body-bytes 99999999999", 2, {"--max-body-bytes", "'99999999999'", "[1024, 1073741824]"}},
      {run + "--cache-memory 99999999999G", 2, {"--cache-memory", "'99999999999G'", "largest size, 8589934591G"}},
      {run + "--cache-memory 99999999999999999999999", 2,
       {"--cache-memory", "'99999999999999999999999'", "largest size, 9223372036854775807"}},
      {run + "--cache-memory 12X", 2, {"--cache-memory", "'12X'", "expected bytes with an optional K, M, G or T"}},
      {gen + "--prompt-ids 1 --device gpu", 2, {"--device", "'gpu'", "cpu, cuda"}},
      {serve + "--dtype fp16", 2, {"--dtype", "'fp16'", "float32, bfloat16"}},
      {run + "--load-format pickle", 2, {"--load-format", "'pickle'", "safetensors, dummy"}},
      {chat + "--cuda-graphs maybe </dev/null", 2, {"--cuda-graphs", "'maybe'", "on, off"}},
      {gen + "--prompt-ids 1 --attention-kernels fast", 2, {"--attention-kernels", "'fast'", "best, own"}},
      {run + "--min-p 5", 2, {"--min-p", "'5'", "[0, 1]"}},
      {run + "--presence-penalty -3", 2, {"--presence-penalty", "'-3'", "[-2, 2]"}},
      {run + "--repetition-penalty 0", 2, {"--repetition-penalty", "'0'", "expected a finite decimal number in"}},
      {gen, 2, {"--prompt-ids and --prompt", "expected exactly one", "got neither"}},
      {gen + "--prompt-ids 1 --prompt hi", 2, {"--prompt-ids and --prompt", "expected exactly one", "got both"}},
      {gen + "--chat --prompt-ids 1", 2, {"--chat", "expected --prompt text", "got --prompt-ids"}},
      {tok, 2, {"--text or --file", "expected one", "got neither"}},
      {tok + "--text a --file " + dir.file("in.jsonl"), 2, {"--text excludes --file"}},
      {tok + "--file /dev/zero", 2, {"--file: /dev/zero", "is a character device", "expected a regular file"}},
  };
  for (const Row& row : rows) {
    const CliRun r = run_limited(row.args);
    EXPECT_EQ(r.exit_code, row.exit_code) << row.args << ": " << r.all();
    for (const std::string& part : row.message) EXPECT_TRUE(contains(r.err, part)) << row.args << ": " << part << "\n" << r.err;
  }
}

// chat checks its flags before reading the first message (with no input at all, too).
TEST(HostileCli, ChatValidatesFlagsAtStart) {
  for (const char* flags : {"--temperature -1", "--top-p 0", "--top-k -1", "--max-tokens -4", "--seed -9"}) {
    const CliRun r = run_limited("chat --model " + kModel + " --tokenizer " + testing::kimi_tokenizer_dir() + " " +
                                 flags + " </dev/null");
    EXPECT_EQ(r.exit_code, 2) << flags << ": " << r.all();
    EXPECT_FALSE(contains(r.err, "type a message")) << flags << ": " << r.err;
  }
}

// chat with another model's tokenizer (the Kimi tokenizer's 163,840 ids over a 512-id model) is
// refused at start, naming both sizes; it exited 0 after every turn had failed.
TEST(HostileCli, ChatRefusesATokenizerLargerThanTheVocabulary) {
  const CliRun r = run_limited("chat --model " + kModel + " --tokenizer " + testing::kimi_tokenizer_dir() +
                               " --max-tokens 2 < <(printf 'Hi\\nMore\\n')");
  EXPECT_EQ(r.exit_code, 2) << r.all();
  EXPECT_TRUE(contains(r.err, "163840 tokens, more than the model's vocabulary of 512")) << r.err;
  EXPECT_FALSE(contains(r.err, "type a message")) << r.err;
}

// ---- presets ----------------------------------------------------------------------------------------

TEST(HostileCli, InitWithoutTokenizerKeepsIdsInsideTheVocabulary) {
  for (const auto& preset : preset_names()) {
    const ScratchDir dir;
    const std::string out = dir.file("m");
    // The ids live in config.json (the real-size preset writes nothing else).
    const CliRun r = run_limited("init --preset " + preset + " --config-only --out " + out);
    ASSERT_EQ(r.exit_code, 0) << preset << ": " << r.all();
    const Json cfg = read_json_file(out + "/config.json").value();
    for (const Json* j : {&cfg, cfg.contains("text_config") ? &cfg["text_config"] : &cfg}) {
      const int64_t vocab = (cfg.contains("text_config") ? cfg["text_config"] : cfg)["vocab_size"];
      for (const char* id : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
        ASSERT_TRUE(j->contains(id)) << preset << " " << id;
        EXPECT_LT((*j)[id].get<int64_t>(), vocab) << preset << " " << id;
      }
    }
    EXPECT_TRUE(load_model_config(out).ok()) << preset;
  }
}

// ---- non-finite weights ------------------------------------------------------------------------------

TEST(HostileCli, InfoVerifyNamesNonFiniteTensors) {
  struct Case {
    const char* preset;
    const char* tensor;
    std::string bytes;  // written over the tensor's first element
  };
  const std::vector<Case> cases = {
      {"kimi-linear-tiny", "model.norm.weight", std::string("\xc0\x7f", 2)},            // BF16 NaN
      {"kimi-linear-tiny", "model.embed_tokens.weight", std::string("\x80\xff", 2)},    // BF16 -Inf
      {"k3-tiny-mxfp4", "language_model.model.layers.1.block_sparse_moe.experts.0.w1.weight_scale", "\xff"},
      {"k3-tiny", "language_model.model.layers.0.self_attn.dt_bias", std::string("\x00\x00\x80\x7f", 4)},  // F32 Inf
  };
  for (const Case& c : cases) {
    const ScratchDir dir;
    const std::string model = dir.file("m");
    ASSERT_EQ(run_limited("init --preset " + std::string(c.preset) + " --out " + model).exit_code, 0);
    const CliRun clean = run_limited("info --verify --model " + model);
    EXPECT_EQ(clean.exit_code, 0) << clean.all();
    EXPECT_TRUE(contains(clean.out, "every weight is finite")) << clean.out;
    {
      const auto file = SafetensorsFile::open(model + "/model.safetensors").value();
      const SafetensorsEntry* e = file.find(c.tensor);
      ASSERT_NE(e, nullptr) << c.tensor;
      uint64_t header = 0;
      std::ifstream(model + "/model.safetensors", std::ios::binary).read(reinterpret_cast<char*>(&header), 8);
      std::fstream f(model + "/model.safetensors", std::ios::binary | std::ios::in | std::ios::out);
      f.seekp(static_cast<std::streamoff>(8 + header + e->begin));
      f.write(c.bytes.data(), static_cast<std::streamsize>(c.bytes.size()));
    }
    const CliRun r = run_limited("info --verify --model " + model);
    EXPECT_EQ(r.exit_code, 1) << c.tensor << ": " << r.all();
    EXPECT_TRUE(contains(r.err, std::string("'") + c.tensor + "' has 1 non-finite value")) << r.err;
  }
}

// ---- output that cannot be written -----------------------------------------------------------------

TEST(HostileCli, UnwritableOutputExitsNonZero) {
  const std::vector<std::string> commands = {
      "info --model " + kModel,
      "generate --model " + kModel + " --prompt-ids 1,2 --max-tokens 2 --json",
      "generate --model " + kModel + " --prompt-ids 1,2 --max-tokens 2",
      "tokenize --tokenizer " + testing::kimi_tokenizer_dir() + " --text hello",
      "logits --model " + kModel + " --ids 1,2 --out /dev/full",
  };
  for (const std::string& cmd : commands) {
    for (const char* redirect : {" >/dev/full", " >&-"}) {
      const CliRun r = run_limited(cmd + redirect);
      EXPECT_NE(r.exit_code, 0) << cmd << redirect << ": " << r.err;
      EXPECT_TRUE(r.exit_code == 1 || r.exit_code == 2) << cmd << redirect << ": " << r.exit_code;
      EXPECT_TRUE(contains(r.err, "fail")) << cmd << redirect << ": " << r.err;
    }
  }
}

}  // namespace
}  // namespace klinear

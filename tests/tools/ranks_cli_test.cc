// The model commands over CPU ranks (mpirun, tools/klinear): logits, generate and run under
// tensor, expert and vocab parallelism equal the one-rank command's, rank 0 alone writes, and the
// layouts that do not fit the launch or the model are refused naming the setting. (serve over two
// ranks: tests/server/openai_client_test.py --mpirun; the layouts in-process: tests/dist/.)
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <string>

#include "io/json.h"
#include "io/npy.h"
#include "test_util.h"

namespace klinear {
namespace {

using testing::CliRun;

std::string launch(int ranks) {
  return std::string("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none "
                     "OMP_NUM_THREADS=1 ") +
         KLINEAR_MPIRUN + " --oversubscribe -np " + std::to_string(ranks) + " ";
}

struct Layout {
  int ranks;
  std::string flags;
};

// A settings file holding `json` in `dir`; returns its path.
std::string write_settings(const testing::ScratchDir& dir, const std::string& name, const std::string& json) {
  std::ofstream(dir.file(name)) << json;
  return dir.file(name);
}

TEST(RanksCli, LogitsGenerateAndRunEqualOneRank) {
  if (std::string(KLINEAR_MPIRUN).empty()) GTEST_SKIP() << "no mpirun (openmpi-bin) in this build";
  std::mt19937_64 rng(testing::fresh_seed());
  std::string ids;
  for (int i = 0; i < 29; ++i) ids += (i ? "," : "") + std::to_string(rng() % 512);
  const testing::ScratchDir dir;
  {
    std::ofstream in(dir.file("in.jsonl"));
    for (int i = 0; i < 12; ++i) {
      Json p = Json::array();
      for (uint64_t n = 1 + rng() % 40; n > 0; --n) p.push_back(rng() % 512);
      in << Json{{"id", i}, {"prompt_ids", p}, {"max_tokens", 1 + i % 6}}.dump() << "\n";
    }
  }
  // The flags, and the same tensor + expert layout from a settings file by the seed runner's names.
  const Layout layouts[] = {
      {2, "--tensor-parallel-size 2"},
      {2, "--tp 2 --enable-expert-parallel"},
      {4, "--tp 4 --expert-parallel-size 4 --embed-tp-size 1 --lmhead-tp-size 1"},
      {2, "--settings " + write_settings(dir, "tp2ep2.json",
                                         R"({"parallel_config": {"world_size": 2, "attn_tp_size": 2, "moe_ep_size": 2,
                                             "dense_tp_size": 2, "lmhead_tp_size": 1}})")}};
  for (const char* model : {"kimi-linear-tiny/model", "k3-tiny-mxfp4/model"}) {
    const std::string m = " --model " + testing::fixture_path(model);
    const CliRun logits = testing::run_cli("logits" + m + " --ids " + ids + " --out " + dir.file("one.npy"));
    ASSERT_EQ(logits.exit_code, 0) << logits.all();
    const CliRun gen = testing::run_cli("generate" + m + " --prompt-ids " + ids + " --max-tokens 8 --ignore-eos --json");
    ASSERT_EQ(gen.exit_code, 0) << gen.all();
    const std::string run_flags = " --input " + dir.file("in.jsonl") + " --max-batch 4 --max-num-tokens 32 --ignore-eos";
    const CliRun run = testing::run_cli("run" + m + run_flags + " --output " + dir.file("one.jsonl"));
    ASSERT_EQ(run.exit_code, 0) << run.all();
    for (const Layout& l : layouts) {
      SCOPED_TRACE(std::string(model) + " on " + std::to_string(l.ranks) + " ranks: " + l.flags);
      const std::string flags = " " + l.flags;
      const CliRun r = testing::run_cli_prefixed(launch(l.ranks), "logits" + m + flags + " --ids " + ids + " --out " +
                                                                    dir.file("ranks.npy"));
      ASSERT_EQ(r.exit_code, 0) << r.all();
      // One line: rank 0 alone reports (and writes).
      EXPECT_EQ(r.err.find("klinear logits:"), r.err.rfind("klinear logits:")) << r.err;
      EXPECT_TRUE(testing::all_close(read_npy(dir.file("ranks.npy")).value(), read_npy(dir.file("one.npy")).value(),
                                     testing::kModel.rel(DType::kF32), testing::ErrorShape::kAmplified));
      const CliRun g = testing::run_cli_prefixed(launch(l.ranks), "generate" + m + flags + " --prompt-ids " + ids +
                                                                    " --max-tokens 8 --ignore-eos --json");
      ASSERT_EQ(g.exit_code, 0) << g.all();
      EXPECT_EQ(parse_json(g.out, "generate").value()["ids"], parse_json(gen.out, "generate").value()["ids"]) << g.out;
      const CliRun rr = testing::run_cli_prefixed(launch(l.ranks), "run" + m + flags + run_flags + " --output " +
                                                                     dir.file("ranks.jsonl"));
      ASSERT_EQ(rr.exit_code, 0) << rr.all();
      std::ifstream a(dir.file("one.jsonl")), b(dir.file("ranks.jsonl"));
      std::string x, y;
      int lines = 0;
      while (std::getline(a, x)) {
        ASSERT_TRUE(std::getline(b, y)) << "line " << lines + 1 << " missing";
        EXPECT_EQ(parse_json(y, "run").value()["ids"], parse_json(x, "run").value()["ids"]) << y << "\n" << x;
        ++lines;
      }
      EXPECT_EQ(lines, 12);
    }
  }
}

TEST(RanksCli, LayoutsThatDoNotFitAreRefusedNamingTheSetting) {
  if (std::string(KLINEAR_MPIRUN).empty()) GTEST_SKIP() << "no mpirun (openmpi-bin) in this build";
  const testing::ScratchDir dir;
  const std::string m = " --model " + testing::fixture_path("kimi-linear-tiny/model") + " --ids 1,2 --out " +
                        dir.file("x.npy");
  struct Refusal {
    int ranks;  // 0: no launcher
    std::string args, says;
  };
  const Refusal refusals[] = {
      {0, "logits" + m + " --tp 2", "the launch has world_size 1 (start the ranks with mpirun -np 2 klinear ...)"},
      {2, "logits" + m + " --tp 4", "tensor_parallel_size 4 x data_parallel_size 1 = 4 ranks, the launch has world_size 2"},
      {2, "logits" + m, "tensor_parallel_size 1 x data_parallel_size 1 = 1 ranks, the launch has world_size 2"},
      {2, "logits" + m + " --tp 2 --expert-parallel-size 3", "expert_parallel_size 3 with world_size 2"},
      {2, "logits" + m + " --data-parallel-size 2", "data_parallel_size 2: data-parallel attention"},
      {2, "logits" + m + " --tp 2 --embed-tp-size 4", "embed_tp_size 4: expected 1 or tensor_parallel_size 2"},
      {2, "chat --model " + testing::fixture_path("kimi-linear-tiny/model") + " --tp 2 </dev/null",
       "chat over 2 ranks"},
      {0, "info --model " + testing::fixture_path("kimi-linear-tiny/model") + " --tp 3", "tensor_parallel_size 3 does "
                                                                                         "not divide the 4 KDA heads"},
      {0, "logits" + m + " --settings " + write_settings(dir, "tp2.json", R"({"parallel_config": {"attn_tp_size": 2}})"),
       "the launch has world_size 1"},
      {0, "logits" + m + " --tp 2 --settings " + dir.file("tp2.json"), "from its parallel_config or from the flags"},
      {0, "logits" + m + " --settings " + write_settings(dir, "extra.json", R"({"parallel_config": {}, "next_n": 1})"),
       "next_n: not a section of the settings"},
      {0, "logits" + m + " --settings " +
              write_settings(dir, "world.json", R"({"parallel_config": {"world_size": 4, "attn_tp_size": 2}})"),
       "parallel_config.world_size 4, but attn_tp_size 2 x attn_dp_size 1 make 2 ranks"},
      {0, "logits" + m + " --settings " + write_settings(dir, "moetp.json", R"({"parallel_config": {"moe_tp_size": 2}})"),
       "parallel_config.moe_tp_size 2: MoE tensor parallelism is fixed at 1"},
      {2, "logits" + m + " --settings " +
              write_settings(dir, "ep3.json", R"({"parallel_config": {"attn_tp_size": 2, "moe_ep_size": 3}})"),
       "expert_parallel_size 3 with world_size 2"},
      {0, "logits" + m + " --settings " + dir.file("missing.json"), "missing.json"},
  };
  for (const Refusal& x : refusals) {
    const CliRun r = testing::run_cli_prefixed(x.ranks ? launch(x.ranks) : "", x.args);
    EXPECT_NE(r.exit_code, 0) << x.args << "\n" << r.all();
    EXPECT_NE(r.err.find(x.says), std::string::npos) << x.args << "\n" << r.err;
  }
  // A settings file's fields the command does not use are named on stderr, once (rank 0).
  const std::string seed_settings = write_settings(
      dir, "seed.json",
      R"({"model_config": {"exe_mode": "eager"}, "parallel_config": {"world_size": 2, "attn_tp_size": 2},
          "data_config": {"pa_block_size": 128, "batch_size_per_rank": 8, "next_n": 0}})");
  const CliRun named = testing::run_cli_prefixed(launch(2), "logits" + m + " --settings " + seed_settings);
  ASSERT_EQ(named.exit_code, 0) << named.all();
  // (logits took pa_block_size as its page size; it has no use for the batch size)
  const std::string note = "not used by klinear yet: data_config.batch_size_per_rank, data_config.next_n, "
                           "model_config.exe_mode";
  EXPECT_NE(named.err.find(note), std::string::npos) << named.err;
  EXPECT_EQ(named.err.find(note), named.err.rfind(note)) << named.err;
  // info prints one rank's part of a layout.
  const CliRun info = testing::run_cli("info --model " + testing::fixture_path("k3-tiny/model") + " --tp 4 --enable-expert-parallel");
  ASSERT_EQ(info.exit_code, 0) << info.all();
  EXPECT_NE(info.out.find("per rank over 4 ranks: tensor 4, expert 4, embedding 4, lm head 4"), std::string::npos)
      << info.out;
  // With --context: the caches of --max-num-seqs sequences of that many tokens: each rank holds
  // less than one rank (its heads' KDA states; the MLA latent is whole on every rank).
  const CliRun ctx = testing::run_cli("info --model " + testing::fixture_path("kimi-linear-tiny/model") +
                                      " --tp 2 --context 4096 --max-num-seqs 8");
  ASSERT_EQ(ctx.exit_code, 0) << ctx.all();
  EXPECT_NE(ctx.out.find("caches MiB at 8 x 4096 tokens"), std::string::npos) << ctx.out;
  auto last_number = [&](const std::string& row) {
    const size_t at = ctx.out.find(row);
    if (at == std::string::npos) return -1.0;
    const std::string line = ctx.out.substr(at, ctx.out.find('\n', at) - at);
    return std::stod(line.substr(line.rfind(' ') + 1));
  };
  const double whole = last_number("one rank"), part = last_number("each rank");
  EXPECT_GT(part, 0.0) << ctx.out;
  EXPECT_LT(part, whole) << ctx.out;
  const CliRun one = testing::run_cli("info --model " + testing::fixture_path("kimi-linear-tiny/model") +
                                      " --context 4096 --max-num-seqs 8");
  ASSERT_EQ(one.exit_code, 0) << one.all();
  EXPECT_NE(one.out.find("per rank over 1 ranks"), std::string::npos) << one.out;
}

}  // namespace
}  // namespace klinear

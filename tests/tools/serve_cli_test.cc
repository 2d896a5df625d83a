// klinear run end to end: a 1,000-line JSONL file on the CPU with a test checkpoint comes back in
// input order with every line's tokens, malformed lines (nested 100,000 deep among them) are
// reported by number on stderr and as an error record in their place in the output, and
// greedy lines equal `klinear generate` of the same prompt (the engine adds no numerical drift).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <set>

#include "hostile_util.h"
#include "io/json.h"

namespace klinear {
namespace {

TEST(CliRun, ThousandLinesInOrderWithMalformedOnesReported) {
  const testing::ScratchDir dir;
  const std::string model = testing::fixture_path("kimi-linear-tiny/model");
  std::mt19937_64 rng(testing::fresh_seed());
  std::vector<std::vector<int>> prompts;
  std::vector<int> max_tokens;
  const std::set<size_t> malformed{4, 250, 500, 999};  // 0-based line indices
  {
    std::ofstream in(dir.file("in.jsonl"));
    for (size_t i = 0; i < 1000; ++i) {
      if (i == 4) {
        in << "{not json\n";
      } else if (i == 250) {
        in << R"({"prompt": )" << std::string(100000, '[') << std::string(100000, ']') << "}\n";
      } else if (i == 500) {
        in << R"({"prompt_ids": [1, 99999]})" << "\n";  // outside the vocabulary
      } else if (i == 999) {
        in << R"({"prompt_ids": [1], "temperature": "warm"})" << "\n";
      } else {
        std::vector<int> p(1 + rng() % 12);
        for (int& id : p) id = static_cast<int>(rng() % 500);
        Json line{{"id", "req-" + std::to_string(i)}, {"prompt_ids", p}};
        const int n = i % 10 == 3 ? 2 : 4;  // some lines ask for their own max_tokens
        if (n != 4) line["max_tokens"] = n;
        if (i % 7 == 1) line.update({{"temperature", 0.8}, {"seed", static_cast<int>(i)}});
        in << line.dump() << "\n";
        prompts.push_back(p);
        max_tokens.push_back(n);
      }
    }
  }
  const testing::CliRun r = testing::run_cli("run --model " + model + " --input " + dir.file("in.jsonl") + " --output " +
                                             dir.file("out.jsonl") + " --max-batch 16 --max-num-tokens 64 --max-tokens 4 "
                                             "--ignore-eos");
  EXPECT_EQ(r.exit_code, 2) << r.all();  // lines were refused: bad input
  for (size_t line : malformed)
    EXPECT_NE(r.err.find("line " + std::to_string(line + 1) + ":"), std::string::npos) << line << "\n" << r.err;
  EXPECT_NE(r.err.find("996 requests (4 lines refused"), std::string::npos) << r.err;
  std::ifstream out(dir.file("out.jsonl"));
  std::string text;
  size_t k = 0;
  std::vector<Json> results;
  for (size_t i = 0; i < 1000; ++i) {
    ASSERT_TRUE(std::getline(out, text)) << "missing output for line " << i + 1;
    const Json j = parse_json(text, "output").value();
    if (malformed.count(i)) {
      EXPECT_EQ(j["line"], i + 1) << text;
      EXPECT_EQ(j["id"], i + 1) << text;  // none of them parsed into an object with an id
      EXPECT_TRUE(j["error"].is_string() && !j["error"].get<std::string>().empty()) << text;
      if (i == 250) {
        EXPECT_NE(text.find("nested deeper than 512"), std::string::npos) << text;
      }
      continue;
    }
    EXPECT_EQ(j["id"], "req-" + std::to_string(i));
    EXPECT_EQ(j["ids"].size(), static_cast<size_t>(max_tokens[k])) << i;
    EXPECT_EQ(j["finish_reason"], "length");
    EXPECT_EQ(j["prompt_tokens"], prompts[k].size());
    results.push_back(j);
    ++k;
  }
  EXPECT_FALSE(std::getline(out, text)) << "extra output: " << text;
  // Greedy lines equal klinear generate of the same prompt.
  for (size_t i : {0, 2, 10}) {
    std::string ids = Json(prompts[i]).dump();  // "[1,2,3]": --prompt-ids accepts the list form
    const testing::CliRun g =
        testing::run_cli("generate --model " + model + " --prompt-ids '" + ids + "' --max-tokens 4 --ignore-eos --json");
    ASSERT_EQ(g.exit_code, 0) << g.all();
    EXPECT_EQ(parse_json(g.out, "generate").value()["ids"], results[i]["ids"]) << "line " << i;
  }
}

// vLLM's offline batch format (OpenAI's Batch API lines: custom_id, url, body) beside klinear's
// own lines in one input: a batch line's result is the Batch API's output line with the OpenAI
// response as its body, equal to the same request in klinear's format; a line that cannot run is
// an error record carrying its custom_id. --max-num-seqs is vLLM's name for --max-batch.
TEST(CliRun, ReadsTheOpenAIBatchFormat) {
  const testing::ScratchDir dir;
  const std::string model = testing::fixture_path("kimi-linear-tiny/model");
  const Json body{{"prompt", {1, 2, 3}}, {"max_tokens", 3}, {"ignore_eos", true}, {"temperature", 0}};
  {
    std::ofstream in(dir.file("in.jsonl"));
    in << Json{{"custom_id", "a"}, {"method", "POST"}, {"url", "/v1/completions"}, {"body", body}}.dump() << "\n";
    in << Json{{"custom_id", "b"}, {"url", "/v1/embeddings"}, {"body", body}}.dump() << "\n";
    in << Json{{"id", "own"}, {"prompt_ids", {1, 2, 3}}, {"max_tokens", 3}, {"ignore_eos", true}, {"temperature", 0}}.dump()
       << "\n";
    Json unknown = body;
    unknown["temprature"] = 0.5;
    in << Json{{"custom_id", "c"}, {"url", "/v1/completions"}, {"body", unknown}}.dump() << "\n";
  }
  const testing::CliRun r = testing::run_cli("run --model " + model + " --input " + dir.file("in.jsonl") + " --output " +
                                             dir.file("out.jsonl") + " --max-num-seqs 4");
  EXPECT_EQ(r.exit_code, 2) << r.all();  // two lines refused
  std::ifstream out(dir.file("out.jsonl"));
  std::vector<Json> lines;
  for (std::string text; std::getline(out, text);) lines.push_back(parse_json(text, "output").value());
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0]["custom_id"], "a");
  EXPECT_TRUE(lines[0]["error"].is_null()) << lines[0];
  EXPECT_EQ(lines[0]["response"]["status_code"], 200);
  const Json& response = lines[0]["response"]["body"];
  EXPECT_EQ(response["object"], "text_completion");
  EXPECT_EQ(response["usage"]["completion_tokens"], 3);
  EXPECT_EQ(response["choices"][0]["token_ids"], lines[2]["ids"]) << "the same request in both formats";
  EXPECT_EQ(lines[2]["id"], "own");
  for (size_t i : {1, 3}) {
    EXPECT_TRUE(lines[i]["response"].is_null()) << lines[i];
    EXPECT_FALSE(lines[i]["error"]["message"].get<std::string>().empty()) << lines[i];
  }
  EXPECT_EQ(lines[1]["custom_id"], "b");
  EXPECT_NE(lines[1]["error"]["message"].get<std::string>().find("/v1/embeddings"), std::string::npos) << lines[1];
  EXPECT_NE(lines[3]["error"]["message"].get<std::string>().find("temprature"), std::string::npos) << lines[3];
}

// The cache budget by memory fraction (on the CPU only when asked for): sized, reported, served;
// with --cache-memory too it is refused, naming both flags.
// run never destroys what the user gave: the input as the output (by its name or a link) is refused
// and left as it was, a run failing before the model loads leaves an existing output untouched,
// and results that cannot be written (/dev/full) fail the run instead of exiting 0.
TEST(CliRun, OutputNeverDestroysTheInput) {
  const testing::ScratchDir dir;
  const std::string model = testing::fixture_path("kimi-linear-tiny/model");
  const std::string input = dir.file("in.jsonl"), kept = R"({"prompt_ids": [1, 2]})" "\n" R"({"prompt_ids": [3]})" "\n";
  auto read = [](const std::string& path) {
    std::ifstream f(path);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  std::ofstream(input) << kept;
  std::filesystem::create_symlink(input, dir.file("link.jsonl"));
  for (const std::string& output : {input, dir.file("link.jsonl")}) {
    const testing::CliRun r = testing::run_cli("run --model " + model + " --input " + input + " --output " + output);
    EXPECT_EQ(r.exit_code, 2) << output << ": " << r.all();
    EXPECT_NE(r.err.find("is the input file"), std::string::npos) << r.err;
    EXPECT_EQ(read(input), kept) << output;
  }
  std::ofstream(dir.file("out.jsonl")) << "earlier results\n";
  const testing::CliRun missing = testing::run_cli("run --model " + dir.file("none") + " --input " + input + " --output " +
                                                   dir.file("out.jsonl"));
  EXPECT_EQ(missing.exit_code, 2) << missing.all();
  EXPECT_EQ(read(dir.file("out.jsonl")), "earlier results\n");
  const testing::CliRun full = testing::run_cli("run --model " + model + " --input " + input +
                                                " --output /dev/full --max-tokens 2");
  EXPECT_EQ(full.exit_code, 1) << full.all();
  EXPECT_NE(full.err.find("/dev/full: writing the results failed"), std::string::npos) << full.err;
}

// run reads its input as it runs (issue 34 item 9; inputs over 256 MiB were refused): 3 GiB
// (a request, one line of 3 GiB of NUL bytes from a sparse file, a request) under a 2 GiB
// address-space limit answers both requests, writes the long line's error record naming its
// number, its length and the 64 MiB limit, and finishes in bounded time. The same requests
// come through stdin as well. The limit leaves room for what a CUDA build maps at start
// (cuBLASLt alone is 540 MB): under 1 GiB, Debian's OpenBLAS 0.3.21 found no room for its
// buffers and retried the failed mmap forever (OpenBLAS issue 5289).
TEST(CliRun, InputIsStreamedInBoundedMemory) {
  const testing::ScratchDir dir;
  const std::string model = testing::fixture_path("kimi-linear-tiny/model");
  const std::string input = dir.file("in.jsonl"), first = R"({"id": "first", "prompt_ids": [1, 2]})" "\n",
                    last = R"({"id": "last", "prompt_ids": [3]})" "\n";
  const int64_t long_line = 3ll << 30;
  testing::write_file(input, first);
  ASSERT_EQ(::truncate(input.c_str(), static_cast<off_t>(first.size() + long_line)), 0);
  std::ofstream(input, std::ios::app) << "\n" << last;
  const std::string limits = testing::kAsan ? "timeout 120 " : "ulimit -v 2097152; timeout 120 ";
  const std::string run = "run --model " + model + " --output " + dir.file("out.jsonl") + " --max-tokens 2 --ignore-eos";
  auto read_output = [&] {
    std::vector<Json> lines;
    std::ifstream out(dir.file("out.jsonl"));
    for (std::string text; std::getline(out, text);) lines.push_back(parse_json(text, "output").value());
    return lines;
  };
  const auto start = std::chrono::steady_clock::now();
  const testing::CliRun r = testing::run_cli_prefixed(limits, run + " --input " + input);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.exit_code, 2) << r.all();  // the long line was refused: bad input
  EXPECT_NE(r.err.find("2 requests (1 lines refused"), std::string::npos) << r.err;
  std::vector<Json> out = read_output();
  ASSERT_EQ(out.size(), 3u) << r.all();
  EXPECT_EQ(out[0]["id"], "first");
  EXPECT_EQ(out[0]["ids"].size(), 2u) << out[0].dump();
  EXPECT_EQ(out[1]["line"], 2);
  EXPECT_NE(out[1]["error"].get<std::string>().find("line 2 is " + std::to_string(long_line) +
                                                    " bytes long, more than the limit of 67108864 bytes"),
            std::string::npos)
      << out[1].dump();
  EXPECT_EQ(out[2]["id"], "last");
  EXPECT_EQ(out[2]["ids"].size(), 2u) << out[2].dump();
  std::printf("3 GiB input under ulimit -v 2 GiB: %.1f s\n", seconds);

  testing::write_file(dir.file("small.jsonl"), first + "\n" + last);
  const testing::CliRun piped = testing::run_cli_prefixed(limits, run + " --input - < " + dir.file("small.jsonl"));
  EXPECT_EQ(piped.exit_code, 0) << piped.all();
  out = read_output();
  ASSERT_EQ(out.size(), 2u) << piped.all();
  EXPECT_EQ(out[0]["id"], "first");
  EXPECT_EQ(out[1]["id"], "last");
}

TEST(CliRun, CacheBudgetByMemoryFraction) {
  const testing::ScratchDir dir;
  const std::string model = testing::fixture_path("kimi-linear-tiny/model");
  std::ofstream(dir.file("in.jsonl")) << R"({"prompt_ids": [1, 2, 3]})" << "\n" << R"({"prompt_ids": [4]})" << "\n";
  const std::string io = " --input " + dir.file("in.jsonl") + " --output " + dir.file("out.jsonl") + " --max-tokens 2 --ignore-eos";
  const testing::CliRun ok = testing::run_cli("run --model " + model + io + " --max-num-tokens 64 --gpu-memory-utilization 0.5");
  EXPECT_EQ(ok.exit_code, 0) << ok.all();
  EXPECT_NE(ok.err.find("cache budget"), std::string::npos) << ok.err;
  EXPECT_NE(ok.err.find("0.50 of the"), std::string::npos) << ok.err;
  EXPECT_NE(ok.err.find("2 requests"), std::string::npos) << ok.err;
  const testing::CliRun both = testing::run_cli("run --model " + model + io + " --cache-memory 8M --gpu-memory-utilization 0.5");
  EXPECT_NE(both.exit_code, 0);
  EXPECT_NE(both.err.find("--cache-memory or --gpu-memory-utilization"), std::string::npos) << both.err;
  const testing::CliRun range = testing::run_cli("run --model " + model + io + " --gpu-memory-utilization 1.5");
  EXPECT_NE(range.exit_code, 0);
  EXPECT_NE(range.err.find("--gpu-memory-utilization"), std::string::npos) << range.err;
}

// The prefix cache's snapshot slots: a quarter of the sequence slots by default, or
// --prefix-snapshot-slots; the slots and their share are reported at start-up; 0 slots, or slots
// without the prefix cache, and 0 sequences are refused naming the flag.
TEST(CliRun, PrefixSnapshotSlots) {
  const testing::ScratchDir dir;
  const std::string model = testing::fixture_path("kimi-linear-tiny/model");
  std::ofstream(dir.file("in.jsonl")) << R"({"prompt_ids": [1, 2, 3]})" << "\n";
  const std::string run = "run --model " + model + " --input " + dir.file("in.jsonl") + " --output " +
                          dir.file("out.jsonl") + " --max-tokens 2 --ignore-eos --max-batch 10";
  struct Row {
    const char* flags;
    int exit_code;
    const char* err;  // in stderr
  };
  const Row rows[] = {
      {"", 0, "13 slots (3 for prefix snapshots)"},
      {" --prefix-snapshot-slots 7", 0, "17 slots (7 for prefix snapshots)"},
      {" --no-prefix-cache", 0, "10 slots (0 for prefix snapshots)"},
      {" --prefix-snapshot-slots 0", 2, "--prefix-snapshot-slots: value is '0'"},
      {" --prefix-snapshot-slots 2 --no-prefix-cache", 2, "--prefix-snapshot-slots is for the prefix cache"},
      {" --max-batch 0", 2, "--max-num-seqs: value is '0'"},  // --max-batch is its alias
  };
  for (const Row& row : rows) {
    const testing::CliRun r = testing::run_cli(run + row.flags);
    EXPECT_EQ(r.exit_code, row.exit_code) << row.flags << "\n" << r.all();
    EXPECT_NE(r.err.find(row.err), std::string::npos) << row.flags << "\n" << r.err;
  }
}

// --load-format dummy: config.json alone (`init --config-only`), weights made on the device.
TEST(CliRun, DummyWeightsFromConfigAlone) {
  const testing::ScratchDir dir;
  const testing::CliRun init = testing::run_cli("init --preset kimi-linear-tiny --config-only --out " + dir.file("m"));
  ASSERT_EQ(init.exit_code, 0) << init.all();
  std::ofstream(dir.file("in.jsonl")) << R"({"prompt_ids": [1, 2, 3]})" << "\n";
  const std::string io = " --input " + dir.file("in.jsonl") + " --output " + dir.file("out.jsonl") + " --max-tokens 3 --ignore-eos";
  const testing::CliRun missing = testing::run_cli("run --model " + dir.file("m") + io);
  EXPECT_NE(missing.exit_code, 0) << "no safetensors: the default load format must fail";
  const testing::CliRun ok = testing::run_cli("run --model " + dir.file("m") + io + " --load-format dummy");
  ASSERT_EQ(ok.exit_code, 0) << ok.all();
  std::ifstream out(dir.file("out.jsonl"));
  std::string line;
  ASSERT_TRUE(std::getline(out, line));
  const Json j = parse_json(line, "output").value();
  EXPECT_EQ(j["ids"].size(), 3u) << line;
  const testing::CliRun bad = testing::run_cli("run --model " + dir.file("m") + io + " --load-format pickle");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("pickle"), std::string::npos) << bad.err;
}

// --settings: the seed runner's data_config gives run its page size, sequences at once and default
// tokens to generate; a field also given as a flag is refused naming both; the fields run has no
// use for are named.
TEST(CliRun, TakesTheSeedRunnersSettings) {
  const testing::ScratchDir dir;
  const std::string model = testing::fixture_path("kimi-linear-tiny/model");
  std::ofstream(dir.file("in.jsonl")) << R"({"prompt_ids": [1, 2, 3]})" << "\n" << R"({"prompt_ids": [4, 5], "max_tokens": 2})"
                                      << "\n";
  std::ofstream(dir.file("s.json")) << R"({"data_config": {"pa_block_size": 16, "batch_size_per_rank": 1,
                                                           "max_new_tokens": 5, "prefill_mini_batch_size": 4}})";
  const std::string run = "run --model " + model + " --input " + dir.file("in.jsonl") + " --output " +
                          dir.file("out.jsonl") + " --ignore-eos --settings " + dir.file("s.json");
  const testing::CliRun ok = testing::run_cli(run);
  ASSERT_EQ(ok.exit_code, 0) << ok.all();
  std::ifstream out(dir.file("out.jsonl"));
  std::string line;
  std::vector<size_t> lengths;
  while (std::getline(out, line)) lengths.push_back(parse_json(line, "output").value()["ids"].size());
  EXPECT_EQ(lengths, (std::vector<size_t>{5, 2})) << "max_new_tokens is the default, a line's max_tokens wins";
  EXPECT_NE(ok.err.find("not used by klinear yet: data_config.prefill_mini_batch_size\n"), std::string::npos) << ok.err;
  for (const char* flag : {" --page-size 32", " --max-num-seqs 2", " --max-tokens 3"}) {
    const testing::CliRun both = testing::run_cli(run + flag);
    EXPECT_NE(both.exit_code, 0) << flag;
    EXPECT_NE(both.err.find("both set it: give one of them"), std::string::npos) << flag << "\n" << both.err;
  }
}

// --batch-invariant: run gives each line the same tokens as the line alone (the engine's bitwise test:
// runtime/engine_model_test.cc); a budget below one 64-token piece and CUDA are refused naming why.
TEST(CliRun, BatchInvariant) {
  const testing::ScratchDir dir;
  const std::string model = testing::fixture_path("kimi-linear-tiny/model");
  std::ofstream(dir.file("all.jsonl")) << R"({"prompt_ids": [5, 6, 7, 8, 9, 10, 11]})" << "\n"
                                       << R"({"prompt_ids": [1, 2, 3]})" << "\n";
  std::ofstream(dir.file("one.jsonl")) << R"({"prompt_ids": [1, 2, 3]})" << "\n";
  const std::string flags = " --max-tokens 6 --ignore-eos --batch-invariant --max-num-tokens 64";
  auto ids_of = [&](const std::string& in) {
    const testing::CliRun r = testing::run_cli("run --model " + model + " --input " + dir.file(in) + " --output " +
                                               dir.file(in + ".out") + flags);
    EXPECT_EQ(r.exit_code, 0) << r.all();
    std::ifstream out(dir.file(in + ".out"));
    std::vector<Json> ids;
    for (std::string line; std::getline(out, line);) ids.push_back(parse_json(line, "output").value()["ids"]);
    return ids;
  };
  const std::vector<Json> all = ids_of("all.jsonl"), one = ids_of("one.jsonl");
  ASSERT_EQ(all.size(), 2u);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(all[1], one[0]);
  const testing::CliRun small = testing::run_cli("run --model " + model + " --input " + dir.file("one.jsonl") +
                                                 " --output " + dir.file("x.out") + " --batch-invariant --max-num-tokens 32");
  EXPECT_NE(small.exit_code, 0);
  EXPECT_NE(small.err.find("--max-num-tokens 32: --batch-invariant prefills in pieces of 64 tokens"), std::string::npos)
      << small.err;
  const testing::CliRun cuda = testing::run_cli("generate --model " + model + " --prompt-ids 1,2 --device cuda --batch-invariant");
  EXPECT_NE(cuda.exit_code, 0);
  EXPECT_NE(cuda.err.find("--batch-invariant on CUDA"), std::string::npos) << cuda.err;
}

}  // namespace
}  // namespace klinear

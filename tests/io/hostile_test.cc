// Hostile input to the parsers and loaders, as generated tables: sizes that overflow or exceed
// sane bounds, filesystem surprises where a file is expected, tokenizer files that ask for huge
// allocations, token ids in odd spellings, and weights that are not finite. Every case runs in a
// child process with bounded time and memory (hostile_util.h) and must come back as a Status
// naming the problem: never a hang, a crash, an abort or a runaway allocation.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>

#include "core/checked.h"
#include "hostile_util.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "io/file.h"
#include "io/presets.h"

namespace klinear {
namespace {

using testing::Bounded;
using testing::Hostile;
using testing::run_bounded;
using testing::ScratchDir;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

constexpr int kSeconds = 20;
constexpr int64_t kMemoryMb = 2048;

// "OK" or the status as text.
std::string describe(const Status& s) { return s.ok() ? "OK" : s.to_string(); }

// ---- checked arithmetic and number parsing ---------------------------------------------------

TEST(HostileChecked, ProductsThatOverflowAreErrors) {
  const int64_t big = int64_t{1} << 32;
  struct Case {
    int64_t a, b;
    bool ok;
  };
  for (const Case& c : {Case{big, big, false}, Case{big, big / 2 - 1, true}, Case{int64_t{1} << 62, 2, false},
                        Case{int64_t{1} << 62, 1, true}, Case{-1, 5, false}, Case{0, std::numeric_limits<int64_t>::max(), true},
                        Case{3037000500, 3037000500, false}, Case{3037000499, 3037000499, true}}) {
    auto r = checked_mul(c.a, c.b, "size");
    EXPECT_EQ(r.ok(), c.ok) << c.a << " x " << c.b;
    if (!r.ok()) {
      EXPECT_TRUE(contains(r.status().message(), "size: ")) << r.status().message();
    }
  }
  EXPECT_FALSE(checked_add(std::numeric_limits<int64_t>::max(), 1, "n").ok());
  EXPECT_FALSE(checked_product({1 << 20, 1 << 20, 1 << 20}, int64_t{1} << 40, "tensor").ok());
  EXPECT_EQ(checked_product({1 << 10, 1 << 10}, int64_t{1} << 40, "tensor").value(), 1 << 20);
}

TEST(HostileChecked, NumbersAreDecimalAndInRange) {
  const IntRange r{-5, 1000};
  for (const char* bad : {"", "-", "+1", " 1", "1 ", "0x10", "1e3", "1.0", "1001", "-6", "9223372036854775808",
                          "-9223372036854775809", "99999999999999999999", "1,", "\xd9\xa3", "1\n"}) {
    auto v = parse_int(bad, r, "--flag");
    EXPECT_FALSE(v.ok()) << "'" << bad << "'";
    if (!v.ok()) {
      EXPECT_TRUE(contains(v.status().message(), "--flag is '")) << v.status().message();
    }
  }
  for (auto [text, want] : {std::pair{"0", 0}, {"-5", -5}, {"1000", 1000}, {"007", 7}})
    EXPECT_EQ(parse_int(text, r, "x").value(), want) << text;
  EXPECT_EQ(parse_uint64("18446744073709551615", "seed").value(), std::numeric_limits<uint64_t>::max());
  for (const char* bad : {"-1", "18446744073709551616", "", "1e3", "0x1"}) EXPECT_FALSE(parse_uint64(bad, "seed").ok()) << bad;
  for (const char* bad : {"nan", "inf", "-inf", "1e309", "0x1p3", "", "1.5", "-0.1", "."})
    EXPECT_FALSE(parse_double(bad, 0, 1, "p").ok()) << bad;
  EXPECT_EQ(parse_double("0.25", 0, 1, "p").value(), 0.25);
}

// ---- config values: bounds and checked sizes ---------------------------------------------------

Json fixture_config(const std::string& name) {
  return read_json_file(testing::fixture_path(name + "/model/config.json")).value();
}

// Sets `path` ("a.b") inside the text config of `doc` (nested for K3).
void set_field(Json& doc, const std::string& path, const Json& value) {
  Json* obj = doc.contains("text_config") ? &doc["text_config"] : &doc;
  const size_t dot = path.find('.');
  if (dot == std::string::npos) (*obj)[path] = value;
  else (*obj)[path.substr(0, dot)][path.substr(dot + 1)] = value;
}

// Every integer field that sizes a tensor, a loop or a table, with values that overflow a product,
// wrap, or are absurd, on both families. The error must name the field and come back at once
// (a layer count of 10^12 used to spin in validation).
TEST(HostileConfig, HugeOrNegativeCountsNameTheField) {
  const std::vector<std::string> fields = {
      "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "kv_lora_rank", "qk_nope_head_dim",
      "qk_rope_head_dim", "v_head_dim", "intermediate_size", "moe_intermediate_size", "num_experts",
      "num_experts_per_token", "num_shared_experts", "num_expert_group", "moe_layer_freq", "max_position_embeddings",
      "linear_attn_config.num_heads", "linear_attn_config.head_dim", "linear_attn_config.short_conv_kernel_size",
      "attn_res_block_size", "routed_expert_hidden_size", "first_k_dense_replace"};
  const std::vector<Json> values = {Json(int64_t{1} << 60), Json((int64_t{1} << 62) + 1), Json(int64_t{1000000000000}),
                                    Json(std::numeric_limits<int64_t>::max()), Json(uint64_t{1} << 63)};
  int cases = 0;
  for (const char* family : {"kimi-linear-tiny", "k3-tiny"}) {
    for (const std::string& field : fields) {
      for (const Json& v : values) {
        Json doc = fixture_config(family);
        set_field(doc, field, v);
        const Bounded b = run_bounded([&] { return describe(parse_model_config(doc, "config.json").status()); },
                                      kSeconds, kMemoryMb);
        ASSERT_TRUE(b.finished) << family << " " << field << "=" << v.dump() << ": " << b.result;
        const std::string leaf = field.substr(field.find('.') + 1);
        EXPECT_TRUE(contains(b.result, "InvalidArgument") && contains(b.result, leaf))
            << family << " " << field << "=" << v.dump() << ": " << b.result;
        ++cases;
      }
    }
  }
  EXPECT_EQ(cases, 2 * 22 * 5);
}

// Products of individually plausible values that no tensor can have.
TEST(HostileConfig, DerivedSizesAreChecked) {
  struct Case {
    std::vector<std::pair<std::string, Json>> set;
    const char* named;
  };
  const std::vector<Case> cases = {
      {{{"vocab_size", 1 << 24}, {"hidden_size", 1 << 17}}, "embedding size"},
      {{{"num_experts", 1 << 14}, {"num_experts_per_token", 1}, {"num_expert_group", 1}, {"topk_group", 1},
        {"moe_intermediate_size", 1 << 20}},
       "stacked routed experts size"},
      {{{"linear_attn_config.num_heads", 4096}, {"linear_attn_config.head_dim", 4096}, {"hidden_size", 1 << 17}},
       "KDA projection size"},
  };
  for (const Case& c : cases) {
    Json doc = fixture_config("kimi-linear-tiny");
    for (const auto& [k, v] : c.set) set_field(doc, k, v);
    const Bounded b =
        run_bounded([&] { return describe(parse_model_config(doc, "config.json").status()); }, kSeconds, kMemoryMb);
    ASSERT_TRUE(b.finished) << b.result;
    EXPECT_TRUE(contains(b.result, c.named) && contains(b.result, "exceeds the limit")) << b.result;
  }
}

// Floating-point fields: zero, negative, absurd and out-of-float-range values.
TEST(HostileConfig, AbsurdFactorsNameTheField) {
  struct Case {
    const char* family;
    const char* field;
    std::vector<double> values;
  };
  const std::vector<Case> cases = {
      {"kimi-linear-tiny", "rms_norm_eps", {0.0, -1e-5, 0.5, 1e300, 1e-320}},
      {"kimi-linear-tiny", "routed_scaling_factor", {-1.0, 0.0, 1e30, 1e300}},
      {"k3-tiny", "activation_situ_beta", {-4.0, 1e30, 1e300}},
      {"k3-tiny", "activation_situ_linear_beta", {-25.0, 0.0, 1e30}},
      {"k3-tiny", "linear_attn_config.gate_lower_bound", {5.0, 0.0, -1e30, -1e300}},
  };
  for (const Case& c : cases) {
    for (double v : c.values) {
      Json doc = fixture_config(c.family);
      set_field(doc, c.field, v);
      auto r = parse_model_config(doc, "config.json");
      const std::string leaf = std::string(c.field).substr(std::string(c.field).find('.') + 1);
      ASSERT_FALSE(r.ok()) << c.field << "=" << v;
      EXPECT_TRUE(contains(r.status().message(), leaf)) << r.status().message();
    }
  }
}

// eos_token_id / bos_token_id as published configs spell them: integers, integral floats and
// decimal strings are ids; anything else, or an id outside the vocabulary (512), names the field.
TEST(HostileConfig, TokenIdSpellings) {
  struct Case {
    Json eos;
    std::vector<int64_t> want;  // empty: must be rejected
  };
  const std::vector<Case> cases = {
      {Json(2), {2}}, {Json(2.0), {2}}, {Json("2"), {2}}, {Json::array({2.0, "3", 4}), {2, 3, 4}},
      {Json(511), {511}}, {Json(512), {}}, {Json(-1), {}}, {Json("-1"), {}}, {Json(2.5), {}}, {Json("2.0"), {}},
      {Json(" 2"), {}}, {Json("0x2"), {}}, {Json(true), {}}, {Json::object(), {}}, {Json::array(), {}},
      {Json::array({2, "x"}), {}}, {Json(uint64_t{1} << 63), {}}, {Json(1e300), {}}, {Json("99999999999999999999"), {}},
  };
  for (const char* family : {"kimi-linear-tiny", "k3-tiny"}) {
    for (const Case& c : cases) {
      Json doc = fixture_config(family);
      set_field(doc, "eos_token_id", c.eos);
      doc["eos_token_id"] = c.eos;  // K3 keeps the ids at the top level too
      auto r = parse_model_config(doc, "config.json");
      if (c.want.empty()) {
        ASSERT_FALSE(r.ok()) << family << " eos " << c.eos.dump();
        EXPECT_TRUE(contains(r.status().message(), "eos_token_id")) << r.status().message();
        EXPECT_TRUE(contains(r.status().message(), "[0, 512)")) << r.status().message();
      } else {
        ASSERT_TRUE(r.ok()) << family << " eos " << c.eos.dump() << ": " << r.status().to_string();
        EXPECT_EQ(r->eos_token_ids, c.want) << c.eos.dump();
      }
    }
    for (const Json& bos : {Json("1"), Json(1.0)}) {
      Json doc = fixture_config(family);
      set_field(doc, "bos_token_id", bos);
      doc["bos_token_id"] = bos;
      EXPECT_EQ(parse_model_config(doc, "config.json").value().bos_token_id, 1) << bos.dump();
    }
    for (const Json& bos : {Json(-3), Json(100000), Json("one"), Json::array({1})}) {
      Json doc = fixture_config(family);
      set_field(doc, "bos_token_id", bos);
      doc["bos_token_id"] = bos;
      auto r = parse_model_config(doc, "config.json");
      ASSERT_FALSE(r.ok()) << bos.dump();
      EXPECT_TRUE(contains(r.status().message(), "bos_token_id")) << r.status().message();
    }
  }
}

// ---- filesystem surprises ------------------------------------------------------------------------

// Each loader, with each hostile kind standing where one of its files should be.
struct FileSlot {
  const char* file;  // the file replaced by the hostile object
  std::function<void(const std::string& dir)> prepare;  // writes the other (valid) files
  std::function<Status(const std::string& dir)> load;
  bool size_limited;  // read whole (a size limit applies), not memory-mapped
};

std::vector<FileSlot> file_slots() {
  const std::string model = testing::fixture_path("kimi-linear-tiny/model");
  auto copy_model = [model](const std::string& dir) {
    std::filesystem::copy_file(model + "/config.json", dir + "/config.json");
  };
  auto tokenizer = [](const std::string& dir) { return Tokenizer::load(dir).status(); };
  return {
      {"config.json", [](const std::string&) {}, [](const std::string& d) { return load_model_config(d).status(); }, true},
      {"model.safetensors", copy_model, [](const std::string& d) { return Checkpoint::open(d).status(); }, false},
      {"model.safetensors.index.json", copy_model, [](const std::string& d) { return Checkpoint::open(d).status(); },
       true},
      {"shard-1.safetensors",
       [](const std::string& d) {
         testing::write_file(d + "/model.safetensors.index.json", R"({"weight_map": {"a": "shard-1.safetensors"}})");
       },
       [](const std::string& d) { return Checkpoint::open(d).status(); }, false},
      {"tiktoken.model", [](const std::string& d) { testing::write_file(d + "/tokenizer_config.json", "{}"); },
       tokenizer, true},
      {"tokenizer_config.json", [](const std::string& d) { testing::write_file(d + "/tiktoken.model", testing::small_ranks()); },
       tokenizer, true},
  };
}

TEST(HostileFiles, OnlyRegularFilesWithinLimitsAreRead) {
  int cases = 0;
  for (const FileSlot& slot : file_slots()) {
    for (Hostile h : testing::all_hostile()) {
      if (h == Hostile::kOversize && !slot.size_limited) continue;  // mapped, not read: any size is fine
      const ScratchDir dir;
      slot.prepare(dir.str());
      const std::string path = dir.file(slot.file);
      testing::make_hostile(path, h, kMaxJsonFileBytes + 1);
      const Bounded b = run_bounded([&] { return describe(slot.load(dir.str())); }, kSeconds, kMemoryMb);
      ASSERT_TRUE(b.finished) << slot.file << " as " << testing::hostile_name(h) << ": " << b.result;
      EXPECT_TRUE(contains(b.result, path)) << slot.file << " as " << testing::hostile_name(h) << ": " << b.result;
      EXPECT_TRUE(contains(b.result, testing::hostile_reason(h)))
          << slot.file << " as " << testing::hostile_name(h) << ": " << b.result;
      ++cases;
    }
  }
  EXPECT_EQ(cases, 6 * 5 - 2);
}

// Directories given as the checkpoint or tokenizer directory that cannot be examined: overlong
// names and symlink loops used to escape as an uncaught std::filesystem_error.
TEST(HostileFiles, UnexaminableDirectoriesAreErrors) {
  const ScratchDir dir;
  std::vector<std::pair<std::string, std::string>> cases = {
      {dir.file(std::string(300, 'a')), std::strerror(ENAMETOOLONG)},
      {dir.str() + "/" + [] {
         std::string p;
         for (int i = 0; i < 1100; ++i) p += "abc/";
         return p;
       }(), std::strerror(ENAMETOOLONG)},
  };
  const std::string loop = dir.file("loop");
  testing::make_hostile(loop, Hostile::kSymlinkLoop, 0);
  cases.emplace_back(loop, std::strerror(ELOOP));
  const std::vector<std::function<Status(const std::string&)>> loaders = {
      [](const std::string& d) { return load_model_config(d).status(); },
      [](const std::string& d) { return Checkpoint::open(d).status(); },
      [](const std::string& d) { return Tokenizer::load(d).status(); },
      [](const std::string& d) { return read_json_file(d + "/config.json").status(); },
  };
  for (const auto& [path, reason] : cases) {
    for (const auto& load : loaders) {
      const Bounded b = run_bounded([&] { return describe(load(path)); }, kSeconds, kMemoryMb);
      ASSERT_TRUE(b.finished) << path.substr(0, 80) << ": " << b.result;
      EXPECT_TRUE(contains(b.result, reason)) << b.result.substr(0, 300);
      EXPECT_TRUE(contains(b.result, path.substr(0, 60))) << b.result.substr(0, 300);
    }
  }
}

TEST(HostileFiles, PermissionErrorsNameTheReason) {
  if (geteuid() == 0) GTEST_SKIP() << "root reads any file";
  const ScratchDir dir;
  const std::string path = dir.file("config.json");
  testing::write_file(path, "{}");
  chmod(path.c_str(), 0);
  auto r = load_model_config(dir.str());
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(contains(r.status().message(), std::strerror(EACCES))) << r.status().message();
}

// ---- tokenizer files -------------------------------------------------------------------------------

// One more line whose rank is far past the number of lines: the table must be sized by the line
// count (259 tokens), not by the rank (10^9 ranks used to ask for tens of GB).
TEST(HostileTokenizer, HugeRanksDoNotAllocate) {
  for (const char* rank : {"999999999", "500000000", "268435456", "2147483390", "2147483647", "1000000000000",
                           "99999999999999999999"}) {
    const ScratchDir dir;
    testing::write_file(dir.file("tiktoken.model"), testing::small_ranks() + testing::base64("xyz") + " " + rank + "\n");
    testing::write_file(dir.file("tokenizer_config.json"), "{}");
    const Bounded b = run_bounded([&] { return describe(Tokenizer::load(dir.str()).status()); }, kSeconds, 512);
    ASSERT_TRUE(b.finished) << "rank " << rank << ": " << b.result;
    EXPECT_TRUE(contains(b.result, "Corruption") && contains(b.result, "tiktoken.model")) << b.result;
    EXPECT_TRUE(contains(b.result, "is missing") || contains(b.result, ":260: expected a rank")) << b.result;
    EXPECT_LT(b.seconds, 10.0);
  }
}

// Token byte strings the rank table cannot hold (it keeps 16-bit lengths; a longer token used to
// be stored truncated and looked up wrongly).
TEST(HostileTokenizer, TokenLengthsAreBounded) {
  for (size_t n : {size_t{65536}, size_t{70000}, size_t{1} << 20}) {
    const ScratchDir dir;
    testing::write_file(dir.file("tiktoken.model"), testing::small_ranks() + testing::base64(std::string(n, 'q')) + " 259\n");
    testing::write_file(dir.file("tokenizer_config.json"), "{}");
    auto r = Tokenizer::load(dir.str());
    ASSERT_FALSE(r.ok()) << n;
    EXPECT_TRUE(contains(r.status().message(), "tiktoken.model:260: token is " + std::to_string(n) + " bytes"))
        << r.status().message();
  }
}

TEST(HostileTokenizer, ConfigFieldsNameTheProblem) {
  const std::string big_name(1 << 20, 'x');
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"added_tokens_decoder": {"99999999999999999999": {"content": "<|a|>"}}})", "expected a special id"},
      {R"({"added_tokens_decoder": {"-1": {"content": "<|a|>"}}})", "expected a special id"},
      {R"({"added_tokens_decoder": {"+260": {"content": "<|a|>"}}})", "expected a special id"},
      {R"({"added_tokens_decoder": {" 260": {"content": "<|a|>"}}})", "expected a special id"},
      {R"({"added_tokens_decoder": {"260": {"content": 5}}})", "non-empty string 'content'"},
      {R"({"added_tokens_decoder": {"260": {"content": "<|a|>"}, "261": {"content": "<|a|>"}}})", "given to two ids"},
      {R"({"added_tokens_decoder": [1, 2]})", "must be an object"},
      {R"({"eos_token": ["<|a|>"]})", "field 'eos_token' must be a string"},
      {R"({"bos_token": {"content": 7}})", "field 'bos_token' must be a string"},
      {R"({"eos_token": ")" + big_name + R"("})", "is not a special token"},
      {R"([1, 2, 3])", "expected a JSON object"},
  };
  for (const auto& [config, want] : cases) {
    const ScratchDir dir;
    testing::write_file(dir.file("tiktoken.model"), testing::small_ranks());
    testing::write_file(dir.file("tokenizer_config.json"), config);
    const Bounded b = run_bounded([&] { return describe(Tokenizer::load(dir.str()).status()); }, kSeconds, kMemoryMb);
    ASSERT_TRUE(b.finished) << config.substr(0, 80) << ": " << b.result;
    EXPECT_TRUE(contains(b.result, want) && contains(b.result, "tokenizer_config.json"))
        << config.substr(0, 80) << ": " << b.result.substr(0, 300);
  }
}

// ---- weights that are not finite ---------------------------------------------------------------

// Writes a random checkpoint of `preset` and overwrites element `index` of tensor `name` with `bits`.
void poison(const std::string& dir, const std::string& name, int64_t index, uint32_t bits) {
  auto file = SafetensorsFile::open(dir + "/model.safetensors");
  ASSERT_TRUE(file.ok());
  const SafetensorsEntry* e = file->find(name);
  ASSERT_NE(e, nullptr) << name;
  uint64_t header_len = 0;
  {
    std::ifstream in(dir + "/model.safetensors", std::ios::binary);
    in.read(reinterpret_cast<char*>(&header_len), 8);
  }
  const size_t width = dtype_size(e->dtype);
  std::fstream out(dir + "/model.safetensors", std::ios::binary | std::ios::in | std::ios::out);
  out.seekp(static_cast<std::streamoff>(8 + header_len + e->begin + index * width));
  out.write(reinterpret_cast<const char*>(&bits), static_cast<std::streamsize>(width));
}

TEST(HostileWeights, VerifyNamesEveryNonFiniteTensor) {
  struct Case {
    const char* preset;
    const char* tensor;
    uint32_t bits;  // little-endian element bits (BF16: 16 bits; F32: 32 bits; U8: 8 bits)
  };
  const std::vector<Case> cases = {
      {"kimi-linear-tiny", "model.embed_tokens.weight", 0x7fc0},  // BF16 NaN
      {"kimi-linear-tiny", "lm_head.weight", 0xff80},            // BF16 -Inf
      {"kimi-linear-tiny", "model.layers.0.self_attn.q_proj.weight", 0x7f80},
      {"k3-tiny", "language_model.model.layers.0.self_attn.A_log", 0x7f800000},  // F32 +Inf
      {"k3-tiny-mxfp4", "language_model.model.layers.1.block_sparse_moe.experts.3.w2.weight_scale", 0xff},  // E8M0 NaN
  };
  std::mt19937_64 rng(testing::fresh_seed());
  for (const Case& c : cases) {
    const ScratchDir dir;
    ASSERT_TRUE(write_random_checkpoint(preset_config(c.preset).value(), dir.str(), 1).ok());
    {
      auto clean = Checkpoint::open(dir.str());
      ASSERT_TRUE(clean.ok());
      EXPECT_TRUE(clean->scan_non_finite().empty()) << c.preset;
      const auto* e = SafetensorsFile::open(dir.file("model.safetensors")).value().find(c.tensor);
      ASSERT_NE(e, nullptr) << c.tensor;
    }
    const int64_t n = shape_numel(SafetensorsFile::open(dir.file("model.safetensors")).value().find(c.tensor)->shape);
    const int64_t index = static_cast<int64_t>(rng() % static_cast<uint64_t>(n));
    poison(dir.str(), c.tensor, index, c.bits);
    auto ckpt = Checkpoint::open(dir.str());
    ASSERT_TRUE(ckpt.ok());
    const auto bad = ckpt->scan_non_finite();
    ASSERT_EQ(bad.size(), 1u) << c.tensor;
    EXPECT_EQ(bad[0].name, c.tensor);
    EXPECT_EQ(bad[0].count, 1);
    EXPECT_EQ(bad[0].first_index, index);
  }
}

}  // namespace
}  // namespace klinear

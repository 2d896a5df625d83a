// Tokenizer tests: the tiktoken fixture and golden ids, round trips on random mixed-script text,
// streaming decode, the long-run and 400,000-character cuts, specials, load errors, the CLI.
//
// Decision: long single pieces (which take the heap BPE path) are checked against a deliberately
// naive BPE written here over the same ranks file, so the fast merge is tested against a second
// form of the same algorithm and not only against its own round trip. Random tests print their
// seed; set KLINEAR_TEST_SEED to replay one.
#include "io/tokenizer.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <thread>
#include <unordered_map>

#include "io/json.h"
#include "test_util.h"

namespace klinear {
namespace {

namespace fs = std::filesystem;

using testing::CliRun;
using testing::run_cli;
const std::string& kTokenizerDir = testing::kimi_tokenizer_dir();
const Tokenizer* kimi() { return testing::kimi_tokenizer(); }

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Random text mixing scripts, emoji (with ZWJ and variation selectors), whitespace runs, CJK,
// combining marks, digits, punctuation and special-token look-alikes.
std::string random_text(std::mt19937_64& rng) {
  struct Range {
    uint32_t lo, hi;
  };
  static const Range kRanges[] = {
      {'a', 'z'},         {'A', 'Z'},         {'0', '9'},         {'!', '/'},         {':', '@'},
      {0x4E00, 0x9FFF},   {0x3040, 0x30FF},   {0xAC00, 0xD7A3},   {0x0400, 0x04FF},   {0x0600, 0x06FF},
      {0x0900, 0x097F},   {0x0300, 0x036F},   {0x1F300, 0x1F6FF}, {0x00C0, 0x00FF},   {0x3000, 0x303F},
      {0xFF01, 0xFF5E},   {0x0E00, 0x0E7F},   {0x2000, 0x206F},   {0x20000, 0x2A6DF}, {0x1D400, 0x1D7FF},
  };
  static const char* kFragments[] = {" ", "  ", "\t", "\n", "\r\n", "\n\n\n", "    ", "\u00A0", "\u3000",
                                     "\u200D", "\uFE0F", "'s", "'LL", "<|im_end|>", "[BOS]", "<|im_user|>",
                                     "getUserName", "HTTPServer", "12345", "\u1680\u2028\u180E", "\x1C\x1F"};
  std::string s;
  int pieces = std::uniform_int_distribution<int>(0, 40)(rng);
  for (int i = 0; i < pieces; ++i) {
    if (rng() % 3 == 0) {
      s += kFragments[rng() % std::size(kFragments)];
      continue;
    }
    const Range& r = kRanges[rng() % std::size(kRanges)];
    int run = std::uniform_int_distribution<int>(1, 12)(rng);
    for (int k = 0; k < run; ++k) append_utf8(s, std::uniform_int_distribution<uint32_t>(r.lo, r.hi)(rng));
  }
  return s;
}

std::string hex_ids(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += std::to_string(id) + " ";
  return s;
}

// ---- fixture and golden -----------------------------------------------------------------------

TEST(TokenizerFixture, EveryCaseMatchesTiktoken) {
  const Tokenizer* tok = kimi();
  ASSERT_NE(tok, nullptr);
  auto cases = read_json_file(std::string(KLINEAR_SOURCE_DIR) + "/tests/fixtures/tokenizer/cases.json");
  ASSERT_TRUE(cases.ok()) << cases.status().to_string();
  const Json& list = cases.value()["cases"];
  ASSERT_GT(list.size(), 0u);
  for (const Json& c : list) {
    std::string text = c["text"].get<std::string>();
    std::vector<int32_t> want = c["ids"].get<std::vector<int32_t>>();
    SCOPED_TRACE("text: " + text);
    EXPECT_EQ(tok->encode(text, Tokenizer::Specials::kParse), want);
    EXPECT_EQ(tok->decode(want), text);
  }
}

TEST(Tokenizer, Golden) {
  const Tokenizer* tok = kimi();
  ASSERT_NE(tok, nullptr);
  std::vector<int32_t> want = {19180, 11, 2695, 0, 220, 33845, 378, 2243, 856};
  EXPECT_EQ(tok->encode("Hello, world! 你好，世界！"), want);
  EXPECT_EQ(tok->decode(want), "Hello, world! 你好，世界！");
}

TEST(Tokenizer, VocabularyAndSpecialNames) {
  const Tokenizer* tok = kimi();
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->vocab_size(), 163840);
  EXPECT_EQ(tok->num_bpe_tokens(), 163584);
  EXPECT_EQ(tok->special_id("<|im_end|>"), 163586);
  EXPECT_EQ(tok->special_id("<|im_middle|>"), 163601);
  EXPECT_EQ(tok->special_id("<|reserved_token_163589|>"), 163589);  // no name in the config
  EXPECT_EQ(tok->special_id("<|reserved_token_163586|>"), std::nullopt);
  EXPECT_EQ(tok->special_id("im_end"), std::nullopt);
  EXPECT_EQ(tok->token_bytes(163586), "<|im_end|>");
  EXPECT_EQ(tok->token_bytes(163839), "[PAD]");
  EXPECT_EQ(tok->token_bytes(-1), "");
  EXPECT_EQ(tok->token_bytes(163840), "");
  EXPECT_EQ(tok->bos_id(), 163584);
  EXPECT_EQ(tok->eos_id(), 163585);
  EXPECT_TRUE(tok->is_special(163584));
  EXPECT_FALSE(tok->is_special(163583));
}

// Examples of the pre-tokenization rules in docs/DESIGN.md "Chat formats", token by token.
TEST(Tokenizer, PreTokenizationExamples) {
  const Tokenizer* tok = kimi();
  ASSERT_NE(tok, nullptr);
  auto pieces = [&](const std::string& text) {
    std::vector<std::string> out;
    for (int32_t id : tok->encode(text)) out.push_back(tok->token_bytes(id));
    return out;
  };
  EXPECT_EQ(pieces("getUserName"), (std::vector<std::string>{"get", "User", "Name"}));
  EXPECT_EQ(pieces("12345"), (std::vector<std::string>{"123", "45"}));
  EXPECT_EQ(pieces("A中B"), (std::vector<std::string>{"A", "中", "B"}));
  EXPECT_EQ(tok->encode("HTTPServer").size(), tok->encode(" HTTPServer").size());
}

// ---- specials ---------------------------------------------------------------------------------

TEST(Tokenizer, SpecialsAsTextVersusParsed) {
  const Tokenizer* tok = kimi();
  ASSERT_NE(tok, nullptr);
  const std::string text = "a<|im_end|>b[BOS]<|im_user|><|reserved_token_163700|>";
  std::vector<int32_t> parsed = tok->encode(text, Tokenizer::Specials::kParse);
  std::vector<int32_t> plain = tok->encode(text);
  EXPECT_EQ(std::count(parsed.begin(), parsed.end(), 163586), 1);
  EXPECT_EQ(std::count(parsed.begin(), parsed.end(), 163584), 1);
  EXPECT_EQ(std::count(parsed.begin(), parsed.end(), 163587), 1);
  EXPECT_EQ(std::count(parsed.begin(), parsed.end(), 163700), 1);
  for (int32_t id : plain) EXPECT_FALSE(tok->is_special(id)) << "special id " << id << " in plain-text encoding";
  EXPECT_EQ(tok->decode(parsed), text);
  EXPECT_EQ(tok->decode(plain), text);
  EXPECT_EQ(tok->encode("<|im_end|>", Tokenizer::Specials::kParse), std::vector<int32_t>{163586});
  // Text between specials is encoded on its own: the same ids as encoding the parts separately.
  std::vector<int32_t> want = tok->encode("x ");
  want.push_back(163586);
  auto tail = tok->encode(" y");
  want.insert(want.end(), tail.begin(), tail.end());
  EXPECT_EQ(tok->encode("x <|im_end|> y", Tokenizer::Specials::kParse), want);
}

// ---- round trips and streaming ----------------------------------------------------------------

TEST(Tokenizer, RandomTextRoundTrips) {
  const Tokenizer* tok = kimi();
  ASSERT_NE(tok, nullptr);
  uint64_t seed = testing::fresh_seed();
  std::cout << "[ seed     ] KLINEAR_TEST_SEED=" << seed << "\n";
  RecordProperty("seed", std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 500; ++i) {
    std::string text = random_text(rng);
    ASSERT_EQ(tok->decode(tok->encode(text)), text) << "seed " << seed << " case " << i;
    ASSERT_EQ(tok->decode(tok->encode(text, Tokenizer::Specials::kParse)), text) << "seed " << seed << " case " << i;
  }
}

TEST(Tokenizer, StreamingDecodeEqualsWholeDecode) {
  const Tokenizer* tok = kimi();
  ASSERT_NE(tok, nullptr);
  uint64_t seed = testing::fresh_seed();
  std::cout << "[ seed     ] KLINEAR_TEST_SEED=" << seed << "\n";
  RecordProperty("seed", std::to_string(seed));
  std::mt19937_64 rng(seed);
  // Byte-level tokens make broken and split UTF-8 sequences likely.
  std::vector<int32_t> single_byte_ids;
  for (int32_t id = 0; id < tok->num_bpe_tokens(); ++id)
    if (tok->token_bytes(id).size() == 1) single_byte_ids.push_back(id);
  ASSERT_EQ(single_byte_ids.size(), 256u);
  for (int i = 0; i < 600; ++i) {
    std::vector<int32_t> ids;
    if (i % 3 == 0) {
      ids = tok->encode(random_text(rng));
    } else {
      int n = std::uniform_int_distribution<int>(0, 40)(rng);
      for (int k = 0; k < n; ++k) {
        uint64_t pick = rng() % 10;
        if (pick < 4) {
          ids.push_back(single_byte_ids[rng() % 256]);
        } else if (pick == 9) {
          ids.push_back(rng() % 2 ? -5 : tok->vocab_size());  // out of range: U+FFFD
        } else {
          ids.push_back(static_cast<int32_t>(rng() % tok->vocab_size()));
        }
      }
    }
    StreamDecoder stream(*tok);
    std::string streamed;
    for (int32_t id : ids) streamed += stream.push(id);
    streamed += stream.finish();
    ASSERT_EQ(streamed, tok->decode(ids)) << "seed " << seed << " ids " << hex_ids(ids);
  }
}

// SpecialText::kSkip (vLLM's skip_special_tokens) leaves specials out of the streamed text; kShow
// (decode()'s way) writes their names.
TEST(Tokenizer, StreamingSkipsSpecialsWhenAsked) {
  const Tokenizer* tok = kimi();
  ASSERT_NE(tok, nullptr);
  const int32_t special = tok->num_bpe_tokens();
  std::vector<int32_t> ids = tok->encode("a");
  ids.push_back(special);
  for (int32_t id : tok->encode("b")) ids.push_back(id);
  StreamDecoder shown(*tok), skipped(*tok, SpecialText::kSkip);
  std::string with, without;
  for (int32_t id : ids) {
    with += shown.push(id);
    without += skipped.push(id);
  }
  with += shown.finish();
  without += skipped.finish();
  EXPECT_EQ(with, tok->decode(ids));
  EXPECT_EQ(without, "ab");
  EXPECT_NE(with, without);
}

TEST(Tokenizer, StreamingHoldsBackIncompleteCharacters) {
  const Tokenizer* tok = kimi();
  ASSERT_NE(tok, nullptr);
  std::unordered_map<unsigned char, int32_t> byte_id;
  for (int32_t id = 0; id < tok->num_bpe_tokens(); ++id) {
    std::string b = tok->token_bytes(id);
    if (b.size() == 1) byte_id[static_cast<unsigned char>(b[0])] = id;
  }
  StreamDecoder stream(*tok);
  EXPECT_EQ(stream.push(byte_id[0xE4]), "");
  EXPECT_EQ(stream.push(byte_id[0xB8]), "");
  EXPECT_EQ(stream.push(byte_id[0xAD]), "中");
  EXPECT_EQ(stream.push(byte_id[0xE4]), "");
  EXPECT_EQ(stream.finish(), "\uFFFD");
}

// Python's bytes.decode(errors="replace"): one U+FFFD per maximal ill-formed subpart.
TEST(Tokenizer, DecodeReplacesLikePython) {
  const Tokenizer* tok = kimi();
  ASSERT_NE(tok, nullptr);
  std::unordered_map<unsigned char, int32_t> byte_id;
  for (int32_t id = 0; id < tok->num_bpe_tokens(); ++id) {
    std::string b = tok->token_bytes(id);
    if (b.size() == 1) byte_id[static_cast<unsigned char>(b[0])] = id;
  }
  auto dec = [&](std::initializer_list<unsigned char> bytes) {
    std::vector<int32_t> ids;
    for (unsigned char b : bytes) ids.push_back(byte_id.at(b));
    return tok->decode(ids);
  };
  EXPECT_EQ(dec({0xE4, 0xB8}), "\uFFFD");                 // truncated at the end
  EXPECT_EQ(dec({0xE4, 0xB8, 'a'}), "\uFFFDa");          // truncated before ASCII
  EXPECT_EQ(dec({0xFF, 0x80}), "\uFFFD\uFFFD");          // invalid lead, lone continuation
  EXPECT_EQ(dec({0xE0, 0x80, 0x80}), "\uFFFD\uFFFD\uFFFD");  // overlong: E0 needs A0..BF
  EXPECT_EQ(dec({0xED, 0xA0, 0x80}), "\uFFFD\uFFFD\uFFFD");  // surrogate
  EXPECT_EQ(dec({0xF0, 0x9F, 0x99}), "\uFFFD");          // truncated 4-byte sequence
  EXPECT_EQ(dec({0xF0, 0x9F, 0x99, 0x82}), "🙂");
  EXPECT_EQ(tok->decode(std::vector<int32_t>{-1, 19180}), "\uFFFDHello");
  Status bad = tok->check_ids(std::vector<int32_t>{1, 2, 163840});
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("163840 at position 2"), std::string::npos) << bad.message();
  EXPECT_TRUE(tok->check_ids(std::vector<int32_t>{0, 163839}).ok());
}

TEST(Tokenizer, InvalidUtf8InputIsRepairedBeforeEncoding) {
  const Tokenizer* tok = kimi();
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->encode("a\xFF" "b\xE4\xB8"), tok->encode("a\uFFFDb\uFFFD"));
}

// ---- long inputs ------------------------------------------------------------------------------

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(Tokenizer, LongRunsAreCutAt25000Characters) {
  const Tokenizer* tok = kimi();
  ASSERT_NE(tok, nullptr);
  for (const std::string unit : {" ", "x", "中", "é", "あ", "\n"}) {
    std::string run, first, rest;
    for (int i = 0; i < 30000; ++i) run += unit;
    for (int i = 0; i < 25000; ++i) first += unit;
    for (int i = 0; i < 5000; ++i) rest += unit;
    SCOPED_TRACE("30,000 x '" + unit + "'");
    std::vector<int32_t> ids = tok->encode(run);
    EXPECT_EQ(tok->decode(ids), run);
    EXPECT_EQ(ids, concat(tok->encode(first), tok->encode(rest)));
  }
  // The cut counts a run across a class change: "a" + 30,000 spaces cuts after 25,000 spaces.
  std::string mixed = "ab" + std::string(30000, ' ');
  EXPECT_EQ(tok->encode(mixed), concat(tok->encode("ab" + std::string(25000, ' ')), tok->encode(std::string(5000, ' '))));
}

TEST(Tokenizer, InputIsCutEvery400000Characters) {
  const Tokenizer* tok = kimi();
  ASSERT_NE(tok, nullptr);
  // ASCII, so 400,000 characters are 400,000 bytes; the window boundary falls inside a word.
  std::string ascii;
  while (ascii.size() < 450000) ascii += "lorem ipsum ";
  std::vector<int32_t> ids = tok->encode(ascii);
  EXPECT_EQ(ids, concat(tok->encode(ascii.substr(0, 400000)), tok->encode(ascii.substr(400000))));
  EXPECT_EQ(tok->decode(ids), ascii);
  // Multi-byte text: the window counts code points (6 per 10-byte unit), not bytes; 400,000 =
  // 66,666 units + 4 code points, so the window ends between "ab" and "c".
  std::string mixed;
  while (mixed.size() < 700000) mixed += "中文abc ";
  size_t cut = 66666 * 10 + 8;
  EXPECT_EQ(tok->encode(mixed), concat(tok->encode(mixed.substr(0, cut)), tok->encode(mixed.substr(cut))));
}

// tiktoken's merge loop, written plainly: repeatedly merge the lowest-ranked adjacent pair
// (leftmost on ties). Quadratic; the reference for long pieces.
class NaiveBpe {
 public:
  explicit NaiveBpe(const std::string& ranks_path) {
    std::ifstream in(ranks_path);
    std::string b64;
    int rank;
    while (in >> b64 >> rank) ranks_[decode_base64(b64)] = rank;
  }
  size_t size() const { return ranks_.size(); }
  std::vector<int32_t> encode_piece(const std::string& piece) const {
    std::vector<std::string> parts;
    for (char c : piece) parts.emplace_back(1, c);
    while (parts.size() > 1) {
      int best_rank = INT32_MAX;
      size_t best = 0;
      for (size_t i = 0; i + 1 < parts.size(); ++i) {
        auto it = ranks_.find(parts[i] + parts[i + 1]);
        if (it != ranks_.end() && it->second < best_rank) {
          best_rank = it->second;
          best = i;
        }
      }
      if (best_rank == INT32_MAX) break;
      parts[best] += parts[best + 1];
      parts.erase(parts.begin() + best + 1);
    }
    std::vector<int32_t> ids;
    for (const std::string& p : parts) ids.push_back(ranks_.at(p));
    return ids;
  }

 private:
  static std::string decode_base64(const std::string& in) {
    const std::string alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    uint32_t buf = 0;
    int bits = 0;
    for (char c : in) {
      if (c == '=') break;
      buf = (buf << 6) | static_cast<uint32_t>(alphabet.find(c));
      bits += 6;
      if (bits >= 8) {
        bits -= 8;
        out += static_cast<char>((buf >> bits) & 0xFF);
      }
    }
    return out;
  }
  std::unordered_map<std::string, int32_t> ranks_;
};

TEST(Tokenizer, LongPiecesMatchNaiveBpe) {
  const Tokenizer* tok = kimi();
  ASSERT_NE(tok, nullptr);
  NaiveBpe naive(kTokenizerDir + "/tiktoken.model");
  ASSERT_EQ(naive.size(), static_cast<size_t>(tok->num_bpe_tokens()));
  uint64_t seed = testing::fresh_seed();
  std::cout << "[ seed     ] KLINEAR_TEST_SEED=" << seed << "\n";
  RecordProperty("seed", std::to_string(seed));
  std::mt19937_64 rng(seed);
  // Each text is one pre-token: lowercase letters (pattern 2) or punctuation (pattern 5).
  const std::string lower = "abcdefghijklmnopqrstuvwxyz", punct = "!#$%&()*+,-./:;<=>?@[]^_`{|}~";
  for (int i = 0; i < 40; ++i) {
    const std::string& alphabet = i % 2 ? punct : lower;
    size_t alpha = std::uniform_int_distribution<size_t>(2, alphabet.size())(rng);
    int n = std::uniform_int_distribution<int>(20, 1500)(rng);
    std::string text;
    for (int k = 0; k < n; ++k) text += alphabet[rng() % alpha];
    ASSERT_EQ(tok->encode(text), naive.encode_piece(text)) << "seed " << seed << " text " << text;
  }
}

TEST(Tokenizer, CopiesShareTablesAcrossThreads) {
  const Tokenizer* tok = kimi();
  ASSERT_NE(tok, nullptr);
  Tokenizer copy = *tok;
  std::string text;
  for (int i = 0; i < 200; ++i) text += "Hello, world! 你好，世界！ def f(x): return x\n";
  std::vector<int32_t> want = tok->encode(text);
  std::vector<int32_t> a, b;
  std::thread t1([&] { a = tok->encode(text); });
  std::thread t2([&] { b = copy.encode(text); });
  t1.join();
  t2.join();
  EXPECT_EQ(a, want);
  EXPECT_EQ(b, want);
}

// ---- load errors ------------------------------------------------------------------------------

class TokenizerLoadErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    scratch_ = std::make_unique<testing::ScratchDir>();
    dir_ = scratch_->str();
  }

  static std::string base64(const std::string& in) {
    const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    size_t i = 0;
    for (; i + 2 < in.size(); i += 3) {
      uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
      out += {a[v >> 18], a[(v >> 12) & 63], a[(v >> 6) & 63], a[v & 63]};
    }
    if (in.size() - i == 1) {
      uint32_t v = uint8_t(in[i]) << 16;
      out += {a[v >> 18], a[(v >> 12) & 63], '=', '='};
    } else if (in.size() - i == 2) {
      uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8);
      out += {a[v >> 18], a[(v >> 12) & 63], a[(v >> 6) & 63], '='};
    }
    return out;
  }
  // 256 byte tokens, then "ab" (256), "abab" (257), "abc" (258); specials from 259.
  static std::string small_ranks() {
    std::string s;
    for (int b = 0; b < 256; ++b) s += base64(std::string(1, static_cast<char>(b))) + " " + std::to_string(b) + "\n";
    s += base64("ab") + " 256\n" + base64("abab") + " 257\n" + base64("abc") + " 258\n";
    return s;
  }
  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }
  Status load_status() {
    auto r = Tokenizer::load(dir_.string());
    return r.ok() ? Status() : r.status();
  }
  void expect_error(StatusCode code, const std::string& fragment) {
    Status s = load_status();
    EXPECT_EQ(s.code(), code) << s.to_string();
    EXPECT_NE(s.message().find(fragment), std::string::npos) << "'" << fragment << "' not in: " << s.message();
  }

  std::unique_ptr<testing::ScratchDir> scratch_;
  fs::path dir_;
};

TEST_F(TokenizerLoadErrors, SmallVocabularyMergesByRank) {
  write("tiktoken.model", small_ranks());
  write("tokenizer_config.json", R"({"added_tokens_decoder": {"259": {"content": "<|x|>"}}, "eos_token": "<|x|>"})");
  auto r = Tokenizer::load(dir_.string());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const Tokenizer& tok = r.value();
  EXPECT_EQ(tok.vocab_size(), 259 + 256);
  EXPECT_EQ(tok.eos_id(), 259);
  EXPECT_EQ(tok.bos_id(), std::nullopt);
  EXPECT_EQ(tok.special_id("<|reserved_token_260|>"), 260);
  EXPECT_EQ(tok.encode("abcab"), (std::vector<int32_t>{258, 256}));  // leftmost "ab" first, then "abc"
  // 40 x "ab" (80 bytes, heap path) and 30 x "ab" (60 bytes, linear path) merge alike.
  std::string ab40, ab30;
  for (int i = 0; i < 40; ++i) ab40 += "ab";
  for (int i = 0; i < 30; ++i) ab30 += "ab";
  EXPECT_EQ(tok.encode(ab40), std::vector<int32_t>(20, 257));
  EXPECT_EQ(tok.encode(ab30), std::vector<int32_t>(15, 257));
  EXPECT_EQ(tok.encode("<|x|>", Tokenizer::Specials::kParse), std::vector<int32_t>{259});
}

TEST_F(TokenizerLoadErrors, MissingDirectory) {
  auto r = Tokenizer::load((dir_ / "nope").string());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("nope"), std::string::npos);
}

TEST_F(TokenizerLoadErrors, MissingRanksFile) {
  write("tokenizer_config.json", "{}");
  expect_error(StatusCode::kIOError, "tiktoken.model");
}

TEST_F(TokenizerLoadErrors, BadBase64NamesTheLine) {
  std::string ranks = small_ranks();
  size_t third = ranks.find('\n', ranks.find('\n') + 1) + 1;
  ranks.replace(third, ranks.find(' ', third) - third, "@@@=");
  write("tiktoken.model", ranks);
  write("tokenizer_config.json", "{}");
  expect_error(StatusCode::kCorruption, "tiktoken.model:3: expected base64");
}

TEST_F(TokenizerLoadErrors, BadRankNamesTheLine) {
  write("tiktoken.model", small_ranks() + base64("xy") + " twelve\n");
  write("tokenizer_config.json", "{}");
  expect_error(StatusCode::kCorruption, "tiktoken.model:260: expected a rank");
}

TEST_F(TokenizerLoadErrors, DuplicateRank) {
  write("tiktoken.model", small_ranks() + base64("xy") + " 5\n");
  write("tokenizer_config.json", "{}");
  expect_error(StatusCode::kCorruption, "rank 5 already given on line 6");
}

TEST_F(TokenizerLoadErrors, MissingRank) {
  write("tiktoken.model", small_ranks() + base64("xy") + " 300\n");
  write("tokenizer_config.json", "{}");
  expect_error(StatusCode::kCorruption, "rank 259 is missing");
}

TEST_F(TokenizerLoadErrors, MissingByteToken) {
  std::string s;
  for (int b = 0; b < 255; ++b) s += base64(std::string(1, static_cast<char>(b))) + " " + std::to_string(b) + "\n";
  write("tiktoken.model", s);
  write("tokenizer_config.json", "{}");
  expect_error(StatusCode::kCorruption, "byte 0xFF has none");
}

TEST_F(TokenizerLoadErrors, MalformedLine) {
  write("tiktoken.model", small_ranks() + "justonefield\n");
  write("tokenizer_config.json", "{}");
  expect_error(StatusCode::kCorruption, "tiktoken.model:260: expected '<base64 bytes> <rank>'");
}

TEST_F(TokenizerLoadErrors, CorruptConfig) {
  write("tiktoken.model", small_ranks());
  write("tokenizer_config.json", "{\"added_tokens_decoder\": ");
  expect_error(StatusCode::kInvalidArgument, "tokenizer_config.json");
}

TEST_F(TokenizerLoadErrors, SpecialIdOutsideTheRange) {
  write("tiktoken.model", small_ranks());
  write("tokenizer_config.json", R"({"added_tokens_decoder": {"12": {"content": "<|x|>"}}})");
  expect_error(StatusCode::kCorruption, "added_tokens_decoder[\"12\"]: expected a special id in [259, 515)");
}

TEST_F(TokenizerLoadErrors, EosThatIsNotASpecial) {
  write("tiktoken.model", small_ranks());
  write("tokenizer_config.json", R"({"eos_token": {"content": "</s>"}})");
  expect_error(StatusCode::kCorruption, "field 'eos_token' names '</s>'");
}

// ---- CLI --------------------------------------------------------------------------------------

TEST(TokenizerCli, TokenizeAndDetokenize) {
  CliRun r = run_cli("tokenize --tokenizer " + kTokenizerDir + " --text 'Hello, world! 你好，世界！'");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[19180,11,2695,0,220,33845,378,2243,856]\n");
  r = run_cli("tokenize --tokenizer " + kTokenizerDir + " --text '<|im_end|>'");
  EXPECT_NE(r.out, "[163586]\n");
  r = run_cli("tokenize --tokenizer " + kTokenizerDir + " --allow-special --text '<|im_end|>'");
  EXPECT_EQ(r.out, "[163586]\n");
  r = run_cli("detokenize --tokenizer " + kTokenizerDir + " --ids 19180,11,2695,0,220,33845,378,2243,856");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "Hello, world! 你好，世界！");
  r = run_cli("detokenize --tokenizer " + kTokenizerDir + " --ids '[19180, 11]'");
  EXPECT_EQ(r.out, "Hello,");
}

TEST(TokenizerCli, BadInputExitsWithTwo) {
  CliRun r = run_cli("tokenize --tokenizer /nonexistent/tok --text hi");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err.rfind("klinear tokenize: NotFound", 0), 0u) << r.err;
  r = run_cli("detokenize --tokenizer " + kTokenizerDir + " --ids 1,x,3");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("klinear detokenize: InvalidArgument"), std::string::npos) << r.err;
  r = run_cli("detokenize --tokenizer " + kTokenizerDir + " --ids 1,999999");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("999999"), std::string::npos) << r.err;
  r = run_cli("tokenize --tokenizer " + kTokenizerDir);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--text or --file"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace klinear

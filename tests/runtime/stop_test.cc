// StopFilter: stop strings that span tokens are held back and cut (or kept, with
// include_stop_str_in_output), stop ids and eos end the sequence without text (eos only without
// ignore_eos), not within the first min_tokens, max_tokens ends it with kLength, and the released
// token entries always concatenate to the released text.
#include <gtest/gtest.h>

#include "runtime/stop.h"

namespace klinear {
namespace {

struct Piece {
  int32_t id;
  std::string text;
};

struct Outcome {
  std::vector<std::string> released;  // text released after each push
  std::string text;
  std::optional<FinishReason> finish;
  int pushed = 0;
};

Outcome run(const StopOptions& o, const std::vector<Piece>& pieces) {
  StopFilter f(o, {2});
  Outcome r;
  std::string tokens_text;
  for (const Piece& p : pieces) {
    Released out = f.push(TokenOutput{p.id, p.text, {}});
    ++r.pushed;
    r.released.push_back(out.text);
    r.text += out.text;
    for (const TokenOutput& t : out.tokens) tokens_text += t.text;
    if (out.finish) {
      r.finish = out.finish;
      break;
    }
  }
  if (!r.finish) {
    Released out = f.flush(FinishReason::kLength);
    r.text += out.text;
    for (const TokenOutput& t : out.tokens) tokens_text += t.text;
  }
  // Entries released with the text: their texts concatenate to it, up to a cut stop string.
  EXPECT_EQ(tokens_text, r.text.substr(0, tokens_text.size()));
  return r;
}

TEST(StopFilter, Table) {
  const std::vector<Piece> hello{{10, "Hel"}, {11, "lo, "}, {12, "wor"}, {13, "ld"}, {14, "!"}};
  struct Case {
    const char* name;
    StopOptions o;
    std::vector<Piece> pieces;
    std::string text;
    std::optional<FinishReason> finish;
    int pushed;
  };
  const std::vector<Case> cases{
      {"no stop: length at max_tokens", {5, {}, {}, false}, hello, "Hello, world!", FinishReason::kLength, 5},
      {"max_tokens 2", {2, {}, {}, false}, hello, "Hello, ", FinishReason::kLength, 2},
      {"stop string spanning three tokens", {16, {"o, wo"}, {}, false}, hello, "Hell", FinishReason::kStop, 3},
      {"stop string inside one token", {16, {"ll"}, {}, false}, hello, "He", FinishReason::kStop, 2},
      {"earliest of two stop strings", {16, {"world", ", w"}, {}, false}, hello, "Hello", FinishReason::kStop, 3},
      {"partial match that fails is released", {16, {"lo, x"}, {}, false}, hello, "Hello, world!", std::nullopt, 5},
      {"eos ends without text", {16, {}, {}, false}, {{10, "a"}, {2, "<eos>"}, {11, "b"}}, "a", FinishReason::kStop, 2},
      {"ignore_eos keeps going", {3, {}, {}, true}, {{10, "a"}, {2, "<eos>"}, {11, "b"}}, "a<eos>b", FinishReason::kLength, 3},
      {"stop id with ignore_eos", {16, {}, {11}, true}, {{10, "a"}, {11, "b"}}, "a", FinishReason::kStop, 2},
      {"held text released at eos", {16, {"ab"}, {}, false}, {{10, "xa"}, {2, ""}}, "xa", FinishReason::kStop, 2},
      {"held text released at max_tokens", {1, {"ab"}, {}, false}, {{10, "xa"}}, "xa", FinishReason::kLength, 1},
      {"min_tokens 2: eos at the second token is text", {16, {}, {}, false, 2},
       {{10, "a"}, {2, "<eos>"}, {11, "b"}, {2, ""}}, "a<eos>b", FinishReason::kStop, 4},
      {"min_tokens 2: no stop string inside the first two", {16, {"ll"}, {}, false, 2}, hello, "Hello, world!",
       std::nullopt, 5},
      {"min_tokens 2: a stop string after them", {16, {"wor"}, {}, false, 2}, hello, "Hello, ", FinishReason::kStop, 3},
      {"include_stop_str_in_output", {16, {"o, wo"}, {}, false, 0, true}, hello, "Hello, wo", FinishReason::kStop, 3},
      {"include_stop_str_in_output, earliest match", {16, {"world", ", w"}, {}, false, 0, true}, hello, "Hello, w",
       FinishReason::kStop, 3},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Outcome r = run(c.o, c.pieces);
    EXPECT_EQ(r.text, c.text);
    EXPECT_EQ(r.finish, c.finish);
    EXPECT_EQ(r.pushed, c.pushed);
  }
}

TEST(StopFilter, HoldsBackOnlyWhatCanStillMatch) {
  StopFilter f(StopOptions{16, {"END"}, {}, false}, {});
  EXPECT_EQ(f.push({1, "abcE", {}}).text, "abc");  // "E" may begin "END"
  EXPECT_EQ(f.push({2, "Nx", {}}).text, "ENx");    // "ENx" cannot
  EXPECT_EQ(f.push({3, "EN", {}}).text, "");
  const Released r = f.push({4, "D tail", {}});
  EXPECT_EQ(r.text, "");
  EXPECT_EQ(r.finish, FinishReason::kStop);
}

TEST(StopFilter, RejectsBadOptions) {
  EXPECT_FALSE(validate_stop({0, {}, {}, false}).ok());
  EXPECT_FALSE(validate_stop({4, {"a", ""}, {}, false}).ok());
  EXPECT_TRUE(validate_stop({4, {"a"}, {7}, false}).ok());
  EXPECT_TRUE(validate_stop({4, {}, {}, false, 4}).ok());
  EXPECT_FALSE(validate_stop({4, {}, {}, false, 5}).ok()) << "min_tokens over max_tokens";
  EXPECT_FALSE(validate_stop({4, {}, {}, false, -1}).ok());
}

}  // namespace
}  // namespace klinear

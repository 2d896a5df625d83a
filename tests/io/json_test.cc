// JSON parsing bounds: nesting deeper than kMaxJsonDepth is refused before the parser (or any
// later recursive walk) sees it, brackets inside strings do not count, and an error quoting a
// value quotes at most an excerpt of it.
#include <gtest/gtest.h>

#include <string>

#include "io/json.h"

namespace klinear {
namespace {

std::string nested(int depth, const std::string& open, const std::string& close, const std::string& inner = "1") {
  std::string s;
  for (int i = 0; i < depth; ++i) s += open;
  s += inner;
  for (int i = 0; i < depth; ++i) s += close;
  return s;
}

TEST(Json, NestingDeeperThanTheLimitIsRefusedNamingIt) {
  EXPECT_TRUE(parse_json(nested(kMaxJsonDepth, "[", "]"), "body").ok());
  EXPECT_TRUE(parse_ordered_json(nested(kMaxJsonDepth - 1, "{\"a\":", "}", "[]"), "body").ok());
  for (const int depth : {kMaxJsonDepth + 1, 100000}) {
    for (const auto& [open, close] : {std::pair{"[", "]"}, std::pair{"{\"k\":", "}"}}) {
      const std::string text = "{\"prompt\":" + nested(depth, open, close) + "}";
      const Result<Json> j = parse_json(text, "request body");
      ASSERT_FALSE(j.ok()) << depth;
      EXPECT_EQ(j.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(j.status().message().find("request body: JSON nested deeper than " + std::to_string(kMaxJsonDepth)),
                std::string::npos)
          << j.status().to_string();
      EXPECT_FALSE(parse_ordered_json(text, "messages").ok());
    }
  }
  // An unclosed deep prefix is refused the same way (not left to the parser).
  EXPECT_FALSE(parse_json(std::string(200000, '['), "line").ok());
}

TEST(Json, BracketsInsideStringsDoNotCount) {
  const std::string deep_text = "{\"prompt\": \"" + std::string(5000, '[') + "\\\"" + std::string(5000, '{') + "\"}";
  Result<Json> j = parse_json(deep_text, "body");
  ASSERT_TRUE(j.ok()) << j.status().to_string();
  EXPECT_EQ(j->at("prompt").get<std::string>().size(), 10001u);
}

TEST(Json, ErrorsQuoteAnExcerpt) {
  const Json big = Json(std::string(1 << 20, 'x'));
  const std::string e = json_excerpt(big);
  EXPECT_LT(e.size(), 120u);
  EXPECT_NE(e.find("bytes)"), std::string::npos) << e;
  EXPECT_EQ(json_excerpt(Json(42)), "42");
  const Json body = {{"n", big}};
  const Result<std::optional<int64_t>> n = json_opt_int(body, "n", "request");
  ASSERT_FALSE(n.ok());
  EXPECT_LT(n.status().message().size(), 200u) << "the error echoes the whole value";
}

}  // namespace
}  // namespace klinear

// Fuzzes the tiktoken.model parser (with an empty tokenizer_config.json); a tokenizer that loads
// must round-trip a fixed text and encode its own bytes.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/check.h"
#include "io/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view ranks(reinterpret_cast<const char*>(data), size);
  auto tok = klinear::Tokenizer::parse(ranks, "{}", "tiktoken.model", "tokenizer_config.json");
  if (!tok.ok()) return 0;
  const std::string text = "Hello, world! 你好 <|im_end|> \xff";
  const auto ids = tok->encode(text);
  KL_CHECK(tok->check_ids(ids).ok(), "encode produced an id outside the vocabulary");
  const std::string back = tok->decode(ids);
  KL_CHECK(back == tok->decode(tok->encode(back)), "decode(encode(x)) is not stable");
  return 0;
}

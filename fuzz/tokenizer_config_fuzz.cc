// Fuzzes tokenizer_config.json (added_tokens_decoder, bos_token, eos_token) over a fixed small
// BPE table of the 256 single bytes: specials that load must encode and decode to their names.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/check.h"
#include "io/tokenizer.h"

namespace {

std::string byte_ranks() {
  static const char* kB64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (int b = 0; b < 256; ++b) {
    out += kB64[b >> 2];
    out += kB64[(b & 3) << 4];
    out += "== " + std::to_string(b) + "\n";
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string ranks = byte_ranks();
  const std::string_view config(reinterpret_cast<const char*>(data), size);
  auto tok = klinear::Tokenizer::parse(ranks, config, "tiktoken.model", "tokenizer_config.json");
  if (!tok.ok()) return 0;
  KL_CHECK(tok->vocab_size() == 512, "vocab");
  for (int32_t id = 256; id < 512; id += 37) {
    const std::string name = tok->token_bytes(id);
    KL_CHECK(tok->special_id(name) == id, "special name does not map back: " + name);
    const auto ids = tok->encode(name, klinear::Tokenizer::Specials::kParse);
    KL_CHECK(tok->check_ids(ids).ok(), "encode produced an id outside the vocabulary");
  }
  if (auto eos = tok->eos_id()) KL_CHECK(tok->is_special(*eos), "eos is not a special");
  return 0;
}

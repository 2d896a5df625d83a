// Fuzzes the server's request path short of the engine: an HTTP body goes through parse_json,
// parse_api_request (chat or completion, the Kimi K2 or K3 format, by the first byte),
// request_prompt_ids with that format's real tokenizer (chat rendering and encoding, or a text or
// id prompt) and fit_prompt (with truncation by the first byte). Each step must fail with a Status
// or succeed; a prompt that comes through lies inside the vocabulary and leaves room for a token.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "core/check.h"
#include "server/openai.h"

namespace {
// Loaded once before fuzzing starts (LLVMFuzzerInitialize), as in chat_fuzz.cc.
const klinear::Tokenizer* k2 = nullptr;
const klinear::Tokenizer* k3 = nullptr;
constexpr int64_t kMaxModelLen = 4096;
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  static const auto k2_loaded = klinear::Tokenizer::load(KLINEAR_SOURCE_DIR "/tokenizers/kimi-k2");
  static const auto k3_loaded = klinear::Tokenizer::load(KLINEAR_SOURCE_DIR "/tokenizers/kimi-k3");
  KL_CHECK(k2_loaded.ok() && k3_loaded.ok(), "the fuzz target needs tokenizers/kimi-k2 and tokenizers/kimi-k3");
  k2 = &k2_loaded.value();
  k3 = &k3_loaded.value();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t flags = data[0];
  auto body = klinear::parse_json(std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1), "request body");
  if (!body.ok()) return 0;
  const auto kind = flags & 1 ? klinear::ApiKind::kCompletion : klinear::ApiKind::kChat;
  const auto format = flags & 2 ? klinear::ChatFormat::kK3 : klinear::ChatFormat::kKimiK2;
  const klinear::Tokenizer* tokenizer = format == klinear::ChatFormat::kK3 ? k3 : k2;
  std::string param;
  auto request = klinear::parse_api_request(kind, format, *body, &param);
  if (!request.ok()) return 0;
  auto ids = klinear::request_prompt_ids(*request, tokenizer, format);
  if (!ids.ok()) return 0;
  const std::optional<int64_t> truncate = flags & 4 ? std::optional<int64_t>(-1) : std::nullopt;
  auto room = klinear::fit_prompt(*request, truncate, kMaxModelLen, *ids);
  if (!room.ok()) return 0;
  KL_CHECK(*room >= 1 && static_cast<int64_t>(ids->size()) + *room == kMaxModelLen, "fit_prompt's room is wrong");
  KL_CHECK(tokenizer->check_ids(*ids).ok(), "a prompt id outside the vocabulary came through");
  return 0;
}

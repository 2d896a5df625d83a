// Fuzzes the chat-message JSON the chat formats render: an OpenAI-style messages array goes
// through parse_chat_messages and the public render_chat entry point of both formats (with
// tools and thinking picked by the first byte), and what renders is encoded with the real Kimi
// tokenizer (so hostile text also reaches the pre-tokenizer and BPE). Each step must fail with a
// Status or succeed.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/check.h"
#include "chat/chat_format.h"
#include "server/openai_messages.h"

namespace {
// Loaded once before fuzzing starts (LLVMFuzzerInitialize): under ASan and coverage the 163,840
// lines take seconds, which libFuzzer would otherwise charge to the first input as a timeout.
const klinear::Tokenizer* tokenizer = nullptr;
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  static const auto loaded = klinear::Tokenizer::load(KLINEAR_SOURCE_DIR "/tokenizers/kimi-k2");
  KL_CHECK(loaded.ok(), loaded.status().to_string());
  tokenizer = &loaded.value();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t flags = data[0];
  auto doc = klinear::parse_json(std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1), "messages");
  if (!doc.ok()) return 0;
  const klinear::Json* messages = &*doc;
  klinear::ChatOptions options;
  options.add_generation_prompt = flags & 1;
  options.thinking = flags & 2;
  if (doc->is_object()) {  // {"messages": [...], "tools": [...]} as an API request carries them
    auto m = doc->find("messages");
    if (m == doc->end()) return 0;
    messages = &*m;
    auto t = doc->find("tools");
    if (t != doc->end()) options.tools_json = t->dump();
  }
  auto parsed = klinear::parse_chat_messages(*messages);
  if (!parsed.ok()) return 0;
  for (auto format : {klinear::ChatFormat::kKimiK2, klinear::ChatFormat::kK3}) {
    auto segments = klinear::render_chat_segments(format, *parsed, options);
    if (!segments.ok()) continue;
    auto ids = klinear::encode_chat(*tokenizer, *segments);
    if (ids.ok()) KL_CHECK(tokenizer->check_ids(*ids).ok(), "encode_chat produced an id outside the vocabulary");
  }
  return 0;
}

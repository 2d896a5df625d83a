// ChatSession keeps one sequence state across turns: turn 2 must see exactly the tokens a fresh
// prefill of the whole conversation would (turn-1 prompt, the model's own reply tokens, the end
// marker, the new user turn), and give the same greedy reply.
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "model/model_cases.h"
#include "runtime/chat_session.h"
#include "test_util.h"

namespace klinear {
namespace {

TEST(ChatSession, SecondTurnEqualsFreshPrefillOfTheConversation) {
  const testing::ScratchDir dir;
  auto tok = Tokenizer::load(testing::source_path("tokenizers/kimi-k2"));
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  Json cfg = preset_config("kimi-linear-tiny").value();
  cfg["vocab_size"] = tok->vocab_size();
  const int32_t im_end = tok->special_id("<|im_end|>").value();
  std::vector<ChatMessage> msgs{{"user", "Hello there", {}, "", ""}};
  auto p1 = encode_chat(*tok, render_chat_segments(ChatFormat::kKimiK2, msgs, ChatOptions{}).value()).value();
  constexpr int kReply = 6;  // tokens a turn generates at most
  testing::write_untied_checkpoint(cfg, dir.str(), {p1}, testing::fresh_seed(), kReply);
  auto be = make_backend(BackendOptions{});
  ASSERT_TRUE(be.ok());
  auto model = Model::load(dir.str(), **be);
  ASSERT_TRUE(model.ok()) << model.status().to_string();

  GenerateOptions greedy;
  greedy.max_tokens = kReply;
  auto created = ChatSession::create(**model, CacheOptions{}, *tok, ChatFormat::kKimiK2, "");
  ASSERT_TRUE(created.ok()) << created.status().to_string();
  ChatSession& session = **created;
  auto first = session.turn("Hello there", greedy, nullptr);
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  std::string streamed;
  auto second = session.turn("And again?", greedy, [&](const std::string& piece) { streamed += piece; });
  ASSERT_TRUE(second.ok()) << second.status().to_string();
  EXPECT_EQ(streamed, second->text);

  // The same conversation from scratch: render turn 1, generate, then append the end marker and
  // the rendering delta of turn 2.
  GenerateOptions o = greedy;
  o.stop_ids.push_back(im_end);
  auto r1 = generate(**model, p1, o, nullptr).value();
  std::vector<int32_t> conversation = p1;
  conversation.insert(conversation.end(), r1.ids.begin(), r1.ids.end());
  if (r1.ids.back() != im_end) conversation.push_back(im_end);
  msgs.push_back({"assistant", first->text, {}, "", ""});
  ChatOptions closed;
  closed.add_generation_prompt = false;
  const auto before = render_chat_segments(ChatFormat::kKimiK2, msgs, closed).value();
  msgs.push_back({"user", "And again?", {}, "", ""});
  const auto after = render_chat_segments(ChatFormat::kKimiK2, msgs, ChatOptions{}).value();
  ASSERT_GT(after.size(), before.size());
  const std::vector<ChatSegment> delta(after.begin() + static_cast<std::ptrdiff_t>(before.size()), after.end());
  const auto d = encode_chat(*tok, delta).value();
  conversation.insert(conversation.end(), d.begin(), d.end());

  auto r2 = generate(**model, conversation, o, nullptr).value();
  std::vector<int32_t> reply_ids = r2.ids;
  if (!reply_ids.empty() && reply_ids.back() == im_end) reply_ids.pop_back();
  EXPECT_EQ(tok->decode(reply_ids), second->text);
  EXPECT_EQ(session.tokens(), static_cast<int64_t>(conversation.size() + r2.ids.size()) -
                                  (r2.ids.back() == im_end ? 1 : 0));
}

}  // namespace
}  // namespace klinear

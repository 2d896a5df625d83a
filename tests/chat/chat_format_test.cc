// chat_format.cc's own options, on both formats: continue_final_message renders up to the end of the
// last assistant message's content (no end marker, no generation prompt), and refuses what it cannot
// continue.
#include <gtest/gtest.h>

#include "chat/chat_format.h"

namespace klinear {
namespace {

TEST(ChatFormat, ContinueFinalMessageStopsAfterItsContent) {
  const std::vector<ChatMessage> messages{{"user", "Say hello.", {}, "", ""}, {"assistant", "Hel", {}, "", ""}};
  for (ChatFormat format : {ChatFormat::kKimiK2, ChatFormat::kK3}) {
    SCOPED_TRACE(format == ChatFormat::kK3 ? "k3" : "k2");
    ChatOptions closed;
    closed.add_generation_prompt = false;
    const std::string whole = render_chat(format, messages, closed).value();
    ChatOptions open = closed;
    open.continue_final_message = true;
    const std::string continued = render_chat(format, messages, open).value();
    ASSERT_GE(continued.size(), 3u);
    EXPECT_EQ(continued.substr(continued.size() - 3), "Hel");
    EXPECT_EQ(whole.substr(0, continued.size()), continued) << "a prefix of the closed rendering";
    EXPECT_NE(whole.find(chat_stop_marker(format), continued.size()), std::string::npos) << "the end marker is cut";

    ChatOptions both = open;
    both.add_generation_prompt = true;
    EXPECT_FALSE(render_chat(format, messages, both).ok());
    EXPECT_FALSE(render_chat(format, {messages[0]}, open).ok()) << "the last message is the user's";
    EXPECT_FALSE(render_chat(format, {messages[0], {"assistant", "", {}, "", ""}}, open).ok()) << "nothing to continue";
  }
}

}  // namespace
}  // namespace klinear

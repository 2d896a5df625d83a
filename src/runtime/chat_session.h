// ChatSession: a multi-turn conversation over one sequence of a cache of its own. Each turn feeds only what is new
// since the last turn (the end marker of the previous reply, the new user message and the
// generation prompt); earlier turns are never re-read, so a turn costs its own tokens only.
//
// The new tokens of a turn are the chat-template rendering of the whole history minus the
// rendering of the history before it (both formats render a message independently of the ones
// after it, so the earlier rendering is a prefix). The assistant replies in the state are the
// tokens the model generated, not a re-encoding of their text.
#pragma once

#include <string>
#include <vector>

#include "chat/chat_format.h"
#include "io/tokenizer.h"
#include "model/model.h"
#include "runtime/generate.h"

namespace klinear {

class ChatSession {
 public:
  // Errors when the cache for one sequence does not fit in memory.
  static Result<std::unique_ptr<ChatSession>> create(Model& model, const CacheOptions& cache, Tokenizer tokenizer,
                                                     ChatFormat format, std::string system_prompt);

  struct Reply {
    std::string text;
    FinishReason finish = FinishReason::kStop;  // kContext: the conversation now fills the context
  };
  // Adds a user message, generates the reply (streamed through `on_text`) and returns it. A reply
  // cut by the context is kept (finish kContext); the session is then full until reset(). Errors
  // (bad options, a message that does not fit, a full session) happen before anything is fed and
  // leave the session as it was.
  Result<Reply> turn(const std::string& user_text, const GenerateOptions& options,
                     const std::function<void(const std::string&)>& on_text);
  // Starts the conversation again from an empty state (the system prompt stays).
  Status reset();
  bool full() const { return full_; }
  int64_t tokens() const { return cache_->tokens(seq_); }

 private:
  ChatSession(Model& model, Tokenizer tokenizer, ChatFormat format)
      : model_(model), tokenizer_(std::move(tokenizer)), format_(format) {}

  Model& model_;
  Tokenizer tokenizer_;
  ChatFormat format_;
  int32_t stop_id_;
  std::unique_ptr<Cache> cache_;
  std::unique_ptr<StepExecutor> executor_;  // over cache_
  SeqId seq_ = 0;
  std::string system_prompt_;
  std::vector<ChatMessage> history_;
  std::vector<ChatSegment> fed_;   // the rendering the state corresponds to
  bool stop_pending_ = false;      // the previous reply's end marker has not been fed yet
  bool full_ = false;              // a reply reached the context
};

// The chat format of a checkpoint: K3 for model_type "kimi_k3", K2 / Kimi Linear otherwise.
ChatFormat chat_format_for(const ModelConfig& config);

}  // namespace klinear

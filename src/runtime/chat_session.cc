#include "runtime/chat_session.h"

namespace klinear {

ChatFormat chat_format_for(const ModelConfig& config) {
  return config.model_type == "kimi_k3" ? ChatFormat::kK3 : ChatFormat::kKimiK2;
}

Result<std::unique_ptr<ChatSession>> ChatSession::create(Model& model, const CacheOptions& cache, Tokenizer tokenizer,
                                                         ChatFormat format, std::string system_prompt) {
  // Every rendered turn holds special ids from the top of the tokenizer's range: a tokenizer larger
  // than the model's vocabulary (another model's) would fail each turn, so it is refused here.
  if (tokenizer.vocab_size() > model.config().vocab_size)
    return Status::InvalidArgument("the tokenizer has " + std::to_string(tokenizer.vocab_size()) +
                                   " tokens, more than the model's vocabulary of " +
                                   std::to_string(model.config().vocab_size) + " (another model's tokenizer?)");
  std::unique_ptr<ChatSession> s(new ChatSession(model, std::move(tokenizer), format));
  KL_ASSIGN_OR_RETURN(s->cache_, Cache::create(model.config(), model.backend(), cache));
  s->executor_ = std::make_unique<StepExecutor>(model, *s->cache_);
  s->stop_id_ = s->tokenizer_.special_id(chat_stop_marker(format)).value_or(-1);
  s->system_prompt_ = std::move(system_prompt);
  KL_RETURN_IF_ERROR(s->reset());
  return s;
}

Status ChatSession::reset() {
  if (cache_->is_open(seq_)) cache_->close(seq_);
  KL_ASSIGN_OR_RETURN(seq_, cache_->open());
  history_.clear();
  if (!system_prompt_.empty()) history_.push_back(ChatMessage{"system", system_prompt_, {}, "", ""});
  fed_.clear();
  stop_pending_ = full_ = false;
  return Status();
}

Result<ChatSession::Reply> ChatSession::turn(const std::string& user_text, const GenerateOptions& options,
                                             const std::function<void(const std::string&)>& on_text) {
  if (full_)
    return Status::InvalidArgument("the conversation fills the model's context (" + std::to_string(tokens()) +
                                   " tokens); reset it to go on");
  if (stop_id_ < 0)
    return Status::NotFound("the tokenizer has no '" + chat_stop_marker(format_) + "' token for this chat format");
  std::vector<ChatMessage> next = history_;
  next.push_back(ChatMessage{"user", user_text, {}, "", ""});
  ChatOptions opts;
  KL_ASSIGN_OR_RETURN(std::vector<ChatSegment> rendered, render_chat_segments(format_, next, opts));
  // The previous rendering (without its generation prompt, with the reply) must be a prefix.
  size_t common = 0;
  while (common < fed_.size() && common < rendered.size() && fed_[common].kind == rendered[common].kind &&
         fed_[common].text == rendered[common].text)
    ++common;
  if (common != fed_.size())
    return Status::InvalidArgument("chat template rendering is not prefix-stable at segment " + std::to_string(common));
  std::vector<ChatSegment> delta(rendered.begin() + static_cast<std::ptrdiff_t>(common), rendered.end());
  KL_ASSIGN_OR_RETURN(std::vector<int32_t> ids, encode_chat(tokenizer_, delta));
  if (stop_pending_) ids.insert(ids.begin(), stop_id_);

  GenerateOptions o = options;
  o.stop_ids.push_back(stop_id_);
  StreamDecoder decoder(tokenizer_);
  std::string reply;
  auto on_token = [&](int32_t id) {
    if (is_stop_token(model_.config(), o, id)) return true;
    std::string piece = decoder.push(id);
    reply += piece;
    if (on_text && !piece.empty()) on_text(piece);
    return true;
  };
  KL_ASSIGN_OR_RETURN(GenerateResult r, generate(*executor_, seq_, ids, o, on_token));
  std::string tail = decoder.finish();
  reply += tail;
  if (on_text && !tail.empty()) on_text(tail);
  // The sampled last token (the end marker, or the last token of a length-limited reply) was
  // never run through the model: it is fed at the start of the next turn. A reply cut by the
  // context leaves no room for it: the session is full.
  full_ = r.finish == FinishReason::kContext;
  if (!full_ && !r.ids.empty() && r.ids.back() != stop_id_) {
    const int32_t last[1] = {r.ids.back()};
    KL_ASSIGN_OR_RETURN(Tensor unused, model_.forward_one(*cache_, seq_, last, LogitsMode::kLast));
    (void)unused;
  }
  stop_pending_ = true;

  next.push_back(ChatMessage{"assistant", reply, {}, "", ""});
  ChatOptions closed;
  closed.add_generation_prompt = false;
  KL_ASSIGN_OR_RETURN(fed_, render_chat_segments(format_, next, closed));
  history_ = std::move(next);
  return Reply{reply, r.finish};
}

}  // namespace klinear

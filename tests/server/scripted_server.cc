// A klinear server whose "model" follows a script: the HTTP, OpenAI and engine layers are the
// real ones, only the runner is replaced, so client tests can check exact outputs that a random
// checkpoint never produces (tool calls in the Kimi K2 or K3 format, content before them, K3
// reasoning).
//
// The reply to a chat prompt is script i, where i is the number of earlier assistant turns in the
// prompt (so a conversation walks through the scripts), followed by the turn's end marker
// (<|im_end|> for k2, <|end_of_msg|> for k3). Special-token names in a script become their ids.
//
//   klinear_scripted_server --tokenizer DIR [--format k2|k3] --script TEXT [--script TEXT ...] [--port N]
// prints "listening on PORT" on stdout and serves until SIGINT/SIGTERM.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "io/tokenizer.h"
#include "runtime/engine.h"
#include "server/http_server.h"

namespace klinear {
namespace {

volatile std::sig_atomic_t g_signal = 0;

class ScriptedRunner final : public StepRunner {
 public:
  ScriptedRunner(const Tokenizer& tok, ChatFormat format, std::vector<std::vector<int32_t>> scripts)
      : vocab_(tok.vocab_size()), scripts_(std::move(scripts)) {
    end_ = *tok.special_id(chat_stop_marker(format));
    // What each answered assistant turn of a prompt holds once: K2's opening marker (one more is
    // the generation prompt), K3's closing of the response element.
    if (format == ChatFormat::kKimiK2) {
      turn_mark_ = {*tok.special_id("<|im_assistant|>")};
      generation_marks_ = 1;
    } else {
      turn_mark_ = tok.encode("<|close|>response", Tokenizer::Specials::kParse);
    }
  }
  int64_t vocab_size() const override { return vocab_; }
  int64_t max_model_len() const override { return 65536; }
  // 64 slots and no pages (a cache of KDA state alone): pages never limit a sequence.
  CacheUsage usage() const override { return CacheUsage{64, 64 - static_cast<int64_t>(seqs_.size()), 0, 0, 1}; }
  bool reserve(RunnerSeq, int64_t) override { return true; }
  Result<RunnerSeq> open() override {
    if (seqs_.size() >= 64) return Status::ResourceExhausted("no slot");
    seqs_[next_] = {};
    return next_++;
  }
  void close(RunnerSeq seq) override { seqs_.erase(seq); }
  Result<SampledStep> run(std::span<const RunnerStep> steps) override {
    int64_t rows = 0;
    for (const RunnerStep& s : steps) rows += s.host_rows();
    Tensor out = Tensor::zeros(DType::kF32, {rows, vocab_});
    int64_t row = 0;
    for (const RunnerStep& s : steps) {
      std::vector<int32_t>& fed = seqs_[s.seq];
      // kAll (prompt log-probabilities): flat rows before the last, whose logits are the script's.
      if (s.logits == StepLogits::kAll) row += static_cast<int64_t>(s.ids.size()) - 1;
      fed.insert(fed.end(), s.ids.begin(), s.ids.end());
      // 80 over 0 elsewhere: a sampled request (temperature 1) follows the script too (at 20 one
      // token in 3,000 over a 160k vocabulary strayed, and a K3 round trip failed now and then).
      if (s.logits != StepLogits::kNone) out.f32()[row++ * vocab_ + next_token(fed, static_cast<size_t>(s.prompt))] = 80.0f;
    }
    return SampledStep{out, {}};
  }

 private:
  int32_t next_token(const std::vector<int32_t>& fed, size_t prompt) const {
    size_t turns = 0;
    for (auto it = fed.begin(); it != fed.begin() + static_cast<std::ptrdiff_t>(prompt);) {
      it = std::search(it, fed.begin() + static_cast<std::ptrdiff_t>(prompt), turn_mark_.begin(), turn_mark_.end());
      if (it == fed.begin() + static_cast<std::ptrdiff_t>(prompt)) break;
      ++turns;
      it += static_cast<std::ptrdiff_t>(turn_mark_.size());
    }
    turns -= std::min(turns, generation_marks_);
    const size_t script = std::min(turns, scripts_.size() - 1);
    const size_t k = fed.size() - prompt;
    return k < scripts_[script].size() ? scripts_[script][k] : end_;
  }

  int64_t vocab_;
  std::vector<std::vector<int32_t>> scripts_;
  int32_t end_;
  std::vector<int32_t> turn_mark_;
  size_t generation_marks_ = 0;
  std::map<RunnerSeq, std::vector<int32_t>> seqs_;
  RunnerSeq next_ = 1;
};

int main_impl(int argc, char** argv) {
  std::string tok_dir, format_name = "k2";
  std::vector<std::string> scripts;
  int port = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tokenizer")) tok_dir = argv[i + 1];
    else if (!std::strcmp(argv[i], "--script")) scripts.push_back(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--port")) port = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--format")) format_name = argv[i + 1];
  }
  auto tok = Tokenizer::load(tok_dir);
  if (!tok.ok() || scripts.empty() || (format_name != "k2" && format_name != "k3")) {
    std::fprintf(stderr, "usage: %s --tokenizer DIR [--format k2|k3] --script TEXT [--script TEXT ...] [--port N]\n", argv[0]);
    return 2;
  }
  const ChatFormat format = format_name == "k3" ? ChatFormat::kK3 : ChatFormat::kKimiK2;
  std::vector<std::vector<int32_t>> ids;
  for (const std::string& s : scripts) ids.push_back(tok->encode(s, Tokenizer::Specials::kParse));
  ScriptedRunner runner(*tok, format, ids);
  EngineOptions eo;
  eo.eos_ids = {*tok->special_id(chat_stop_marker(format))};
  Engine engine(runner, &*tok, eo);
  ServerOptions so;
  so.port = port;
  so.model_name = "scripted";
  HttpServer server(engine, &*tok, format, so);
  std::signal(SIGINT, [](int s) { g_signal = s; });
  std::signal(SIGTERM, [](int s) { g_signal = s; });
  std::thread engine_thread([&] { engine.serve(); });
  if (Status st = server.start(); !st.ok()) {
    std::fprintf(stderr, "%s\n", st.to_string().c_str());
    engine.request_stop();
    engine_thread.join();
    return 1;
  }
  std::printf("listening on %d\n", server.port());
  std::fflush(stdout);
  while (!g_signal) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  engine.request_stop();
  engine_thread.join();
  server.stop();
  return 0;
}

}  // namespace
}  // namespace klinear

int main(int argc, char** argv) { return klinear::main_impl(argc, argv); }

// Engine: continuous batching over a StepRunner. One step = schedule (scheduler.h), run (one
// runner call over every scheduled sequence), post-process (sample, detokenize, stop, emit).
//
// Threads: submit(), cancel(), cancel_all(), request_stop() and metrics() may be called from any thread; they
// only touch an inbox under a mutex. Everything else (steps, the runner, sequences) belongs to the
// one thread that calls step() / serve() / run_until_idle(). Events go to each request's sink on
// that engine thread, so a sink must be quick and must not call back into the engine.
//
// A request with n > 1 runs n sequences (choices) over the same prompt, choice i sampling with
// seed + i. A request that can never fit (prompt + max_tokens over the context or over the whole
// cache) is refused at submit; one that does not fit now waits; running sequences that run out
// of pages are preempted and recomputed later (scheduler.h). A runner error fails only the
// requests in that step; the engine keeps serving.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "io/tokenizer.h"
#include "runtime/metrics.h"
#include "runtime/sampler.h"
#include "runtime/scheduler.h"
#include "runtime/step_runner.h"
#include "runtime/stop.h"

namespace klinear {

struct EngineOptions {
  SchedulerOptions scheduler;
  int64_t max_queue = 1024;      // sequences waiting for admission (and requests not yet taken), at most
  std::vector<int32_t> eos_ids;  // ids that end a sequence unless ignore_eos
  int64_t max_model_len = 0;     // tokens one sequence may hold, at most sequence_capacity(); 0: that
};

struct RequestSpec {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  StopOptions stop;
  int n = 1;              // choices, [1, 128]
  int top_logprobs = -1;  // -1: no log-probabilities; k in [0, 20]: the pick's and the k most likely
  // -1: none; k in [0, 20]: the log-probability of each prompt token after the first and the k
  // most likely ids at its position (computed by choice 0's sequence, which then takes no prefix
  // from the cache). With them, stop.max_tokens may be 0: the prompt is scored, nothing generated.
  int prompt_logprobs = -1;
  SpecialText special_text = SpecialText::kShow;  // what a generated special id adds to the text
};

struct RequestStats {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;  // all choices
  double queue_s = 0, ttft_s = 0, e2e_s = 0;
};

enum class RequestEnd { kRunning, kFinished, kCancelled, kFailed };

struct EngineEvent {
  uint64_t request_id = 0;
  int choice = 0;
  std::string text;                    // newly final text of this choice
  std::vector<TokenOutput> tokens;     // tokens whose text is final, in order
  std::vector<Sampled> prompt_logprobs;   // once, on the request's first event after they are all known:
                                          // prompt tokens 1 .. P − 1 (RequestSpec::prompt_logprobs)
  std::optional<FinishReason> finish;  // this choice ended
  RequestEnd end = RequestEnd::kRunning;  // not kRunning on the request's last event
  Status error;                        // kFailed: why
  RequestStats stats;                  // set on the last event
};
using EventSink = std::function<void(const EngineEvent&)>;

class Engine : private Admitter {
 public:
  // `tokenizer` may be null (then no text and no stop strings); both must outlive the engine.
  Engine(StepRunner& runner, const Tokenizer* tokenizer, EngineOptions options);
  ~Engine();

  // Validates and queues a request. InvalidArgument naming the field for bad input (including a
  // request that can never fit), ResourceExhausted when the queue is full or the engine stops.
  Result<uint64_t> submit(RequestSpec spec, EventSink sink);
  // Cancels a request (its sink gets one last event with kCancelled and its slots and pages are
  // freed at the next step). Unknown or finished ids are ignored.
  void cancel(uint64_t request_id);
  // Cancels every request queued or running (a drain past its deadline).
  void cancel_all();

  // Engine thread only: one step (returns false when nothing ran); whether requests are pending.
  bool step();
  bool has_work() const;
  void run_until_idle();
  // Runs steps, sleeping while idle, until request_stop() was called and no request is left
  // (in-flight requests are drained; new ones are refused once stopping).
  void serve();
  void request_stop();

  EngineMetrics metrics() const;
  const EngineOptions& options() const { return options_; }
  // The most tokens (prompt + generated) one sequence may hold: options().max_model_len, else
  // sequence_capacity(). Any thread.
  int64_t max_sequence_tokens() const { return max_sequence_tokens_; }
  // The most a sequence of `runner` can hold: the context or the whole cache, whichever is smaller.
  static int64_t sequence_capacity(const StepRunner& runner);
  int64_t vocab_size() const { return vocab_size_; }

 private:
  struct Request;
  struct Choice;
  PrefixHit lookup(const Sequence& seq) override;
  void open(Sequence& seq, int64_t cached) override;
  void take_inbox();
  // Takes the next token of `c`: `drawn` by the runner, or sampled here from `logits`.
  void post_process(Choice& c, std::span<const float> logits, std::optional<int32_t> drawn);
  // Whether `c`'s next prefill piece returns every row (its request's prompt log-probabilities).
  bool scores_prompt(const Choice& c) const;
  void finish_choice(Choice& c);
  void end_request(Request& r, RequestEnd end, Status error);
  void release(Choice& c);
  void emit(Choice& c, Released out);

  StepRunner& runner_;
  const Tokenizer* tokenizer_;
  EngineOptions options_;
  Scheduler scheduler_;
  int64_t max_sequence_tokens_ = 0, vocab_size_ = 0;
  std::unordered_map<uint64_t, std::unique_ptr<Request>> requests_;  // engine thread
  std::unordered_map<const Sequence*, Choice*> choice_of_;

  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::vector<std::unique_ptr<Request>> inbox_;  // guarded by mu_
  std::vector<uint64_t> cancels_;                // guarded by mu_
  bool cancel_all_ = false;                      // guarded by mu_
  bool stopping_ = false;                        // guarded by mu_
  uint64_t next_id_ = 1;                         // guarded by mu_
  EngineMetrics metrics_;                        // guarded by mu_
};

}  // namespace klinear

#include "runtime/engine.h"

#include <algorithm>
#include <chrono>
#include <new>
#include <tuple>

namespace klinear {

using Clock = std::chrono::steady_clock;

namespace {
double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// A failed allocation inside a step (host memory under a limit, a huge batch) fails that step's
// requests, as an error the runner returns does; the other requests and the server go on.
Result<SampledStep> run_guarded(StepRunner& runner, std::span<const RunnerStep> steps) {
  try {
    return runner.run(steps);
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted("out of memory in a step of " + std::to_string(steps.size()) + " sequences");
  }
}
}  // namespace

// The longest prefill piece of a sequence scoring its prompt: its rows' logits [T, V] F32 go to the
// host (512 rows of a 163,840-id vocabulary: 336 MB).
constexpr int64_t kScoredPieceTokens = 512;

struct Engine::Choice {
  Sequence seq;
  Request* request = nullptr;
  int index = 0;
  Sampler sampler;
  StopFilter filter;
  std::optional<StreamDecoder> decoder;
  bool finished = false;
  std::optional<FinishReason> finish;
  Clock::time_point last_token;
  Choice(const SamplingParams& p, const StopOptions& s, std::vector<int32_t> eos) : sampler(p), filter(s, std::move(eos)) {}
};

struct Engine::Request {
  uint64_t id = 0;
  RequestSpec spec;
  EventSink sink;
  std::vector<std::unique_ptr<Choice>> choices;
  int unfinished = 0;
  int64_t completion_tokens = 0;
  std::vector<Sampled> prompt_logprobs;  // spec.prompt_logprobs >= 0: prompt tokens 1 .. so far
  bool prompt_logprobs_sent = false;
  Clock::time_point arrival;
  std::optional<Clock::time_point> admitted, first_token;
};

Engine::Engine(StepRunner& runner, const Tokenizer* tokenizer, EngineOptions options)
    : runner_(runner), tokenizer_(tokenizer), options_(std::move(options)), scheduler_(options_.scheduler) {
  const SchedulerOptions& so = options_.scheduler;
  KL_CHECK(so.max_num_tokens >= 1 && so.max_num_seqs >= 1 && so.max_step_attention >= 0, "bad scheduler options");
  const int64_t capacity = sequence_capacity(runner_);
  KL_CHECK(options_.max_model_len >= 0 && options_.max_model_len <= capacity, "max_model_len over the capacity");
  max_sequence_tokens_ = options_.max_model_len > 0 ? options_.max_model_len : capacity;
  vocab_size_ = runner_.vocab_size();
  metrics_.cache = runner_.usage();
}

int64_t Engine::sequence_capacity(const StepRunner& runner) {
  const CacheUsage u = runner.usage();
  return u.paged() ? std::min(runner.max_model_len(), u.pages_total * u.page_size) : runner.max_model_len();
}

Engine::~Engine() {
  for (auto& [id, r] : requests_)
    for (auto& c : r->choices)
      if (c->seq.slot) runner_.close(*c->seq.slot);
}

Result<uint64_t> Engine::submit(RequestSpec spec, EventSink sink) {
  const int64_t prompt = static_cast<int64_t>(spec.prompt.size());
  if (prompt == 0) return Status::InvalidArgument("prompt is empty, expected at least one token");
  const int64_t vocab = runner_.vocab_size();
  for (size_t i = 0; i < spec.prompt.size(); ++i)
    if (spec.prompt[i] < 0 || spec.prompt[i] >= vocab)
      return Status::InvalidArgument("prompt token " + std::to_string(i) + " is " + std::to_string(spec.prompt[i]) +
                                     ", expected an id in [0, " + std::to_string(vocab) + ")");
  KL_RETURN_IF_ERROR(validate_sampling(spec.sampling));
  if (spec.prompt_logprobs < -1 || spec.prompt_logprobs > 20)
    return Status::InvalidArgument("prompt_logprobs must be in [0, 20], got " + std::to_string(spec.prompt_logprobs));
  const bool score_only = spec.stop.max_tokens == 0 && spec.prompt_logprobs >= 0;  // the prompt's scores alone
  if (score_only && spec.stop.min_tokens > 0)
    return Status::InvalidArgument("min_tokens must be 0 with max_tokens 0, got " + std::to_string(spec.stop.min_tokens));
  if (!score_only) KL_RETURN_IF_ERROR(validate_stop(spec.stop));
  for (const TokenBias& b : spec.sampling.logit_bias)
    if (b.id >= vocab)
      return Status::InvalidArgument("logit_bias: token id " + std::to_string(b.id) + " is not in [0, " + std::to_string(vocab) + ")");
  for (int32_t id : spec.stop.stop_ids)
    if (id < 0 || id >= vocab)
      return Status::InvalidArgument("stop_token_ids: token id " + std::to_string(id) + " is not in [0, " + std::to_string(vocab) + ")");
  if (spec.n < 1 || spec.n > 128) return Status::InvalidArgument("n must be in [1, 128], got " + std::to_string(spec.n));
  if (spec.top_logprobs < -1 || spec.top_logprobs > 20)
    return Status::InvalidArgument("top_logprobs must be in [0, 20], got " + std::to_string(spec.top_logprobs));
  if (!spec.stop.stop.empty() && !tokenizer_)
    return Status::InvalidArgument("stop strings need a tokenizer; this model has none (use stop token ids)");
  const int64_t total = prompt + spec.stop.max_tokens;
  if (total > runner_.max_model_len())
    return Status::InvalidArgument("prompt of " + std::to_string(prompt) + " tokens + max_tokens " +
                                   std::to_string(spec.stop.max_tokens) + " exceeds the context of " +
                                   std::to_string(runner_.max_model_len()) + " tokens");
  const CacheUsage u = runner_.usage();
  if (u.paged() && pages_for(total, u.page_size) > u.pages_total)
    return Status::InvalidArgument("prompt + max_tokens needs " + std::to_string(total) + " tokens of cache, the cache holds " +
                                   std::to_string(u.pages_total * u.page_size));
  auto r = std::make_unique<Request>();
  r->spec = std::move(spec);
  r->sink = std::move(sink);
  r->arrival = Clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return Status::ResourceExhausted("the server is shutting down");
  if (metrics_.waiting + static_cast<int64_t>(inbox_.size()) >= options_.max_queue)
    return Status::ResourceExhausted("the queue is full (" + std::to_string(options_.max_queue) + " requests waiting)");
  r->id = next_id_++;
  const uint64_t id = r->id;
  inbox_.push_back(std::move(r));
  wake_.notify_all();
  return id;
}

void Engine::cancel(uint64_t request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  cancels_.push_back(request_id);
  wake_.notify_all();
}

void Engine::cancel_all() {
  std::lock_guard<std::mutex> lock(mu_);
  cancel_all_ = true;
  wake_.notify_all();
}

void Engine::request_stop() {
  std::lock_guard<std::mutex> lock(mu_);
  stopping_ = true;
  wake_.notify_all();
}

EngineMetrics Engine::metrics() const {
  std::lock_guard<std::mutex> lock(mu_);
  return metrics_;
}

bool Engine::has_work() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !requests_.empty() || !inbox_.empty() || !cancels_.empty() || cancel_all_;
}

void Engine::take_inbox() {
  std::vector<std::unique_ptr<Request>> fresh;
  std::vector<uint64_t> cancels;
  bool cancel_all = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fresh.swap(inbox_);
    cancels.swap(cancels_);
    std::swap(cancel_all, cancel_all_);
  }
  for (auto& r : fresh) {
    for (int i = 0; i < r->spec.n; ++i) {
      SamplingParams p = r->spec.sampling;
      p.seed += static_cast<uint64_t>(i);
      p.min_tokens = r->spec.stop.min_tokens;
      p.min_tokens_ids = stop_ids_of(r->spec.stop, options_.eos_ids);
      auto c = std::make_unique<Choice>(p, r->spec.stop, options_.eos_ids);
      c->request = r.get();
      c->index = i;
      c->seq.id = r->id * 1000 + static_cast<uint64_t>(i);
      c->seq.tokens = r->spec.prompt;
      c->seq.prompt = static_cast<int64_t>(r->spec.prompt.size());
      if (i == 0 && r->spec.prompt_logprobs >= 0) c->seq.max_piece = kScoredPieceTokens;
      c->sampler.set_prompt(r->spec.prompt);
      if (tokenizer_) c->decoder.emplace(*tokenizer_, r->spec.special_text);
      choice_of_[&c->seq] = c.get();
      scheduler_.add(&c->seq);
      r->choices.push_back(std::move(c));
    }
    r->unfinished = r->spec.n;
    const uint64_t id = r->id;
    requests_[id] = std::move(r);
  }
  if (cancel_all)
    for (const auto& [id, r] : requests_) cancels.push_back(id);
  for (uint64_t id : cancels) {
    auto it = requests_.find(id);
    if (it != requests_.end()) end_request(*it->second, RequestEnd::kCancelled, Status());
  }
}

void Engine::release(Choice& c) {
  scheduler_.remove(&c.seq);
  if (c.seq.slot) runner_.close(*c.seq.slot);
  c.seq.slot.reset();
  c.finished = true;
}

void Engine::end_request(Request& r, RequestEnd end, Status error) {
  for (auto& c : r.choices)
    if (!c->finished) release(*c);
  const Clock::time_point now = Clock::now();
  EngineEvent e;
  e.request_id = r.id;
  e.end = end;
  e.error = std::move(error);
  e.stats.prompt_tokens = static_cast<int64_t>(r.spec.prompt.size());
  e.stats.completion_tokens = r.completion_tokens;
  e.stats.e2e_s = seconds(r.arrival, now);
  if (r.admitted) e.stats.queue_s = seconds(r.arrival, *r.admitted);
  if (r.first_token) e.stats.ttft_s = seconds(r.arrival, *r.first_token);
  {
    std::lock_guard<std::mutex> lock(mu_);
    const char* status = end == RequestEnd::kCancelled ? "cancelled" : end == RequestEnd::kFailed ? "error" : nullptr;
    if (!status) {
      bool length = false;
      for (auto& c : r.choices) length = length || c->finish == FinishReason::kLength;
      status = length ? "length" : "stop";
    }
    ++metrics_.requests[status];
    metrics_.prompt_tokens += r.spec.prompt.size();
    metrics_.e2e_s.observe(e.stats.e2e_s);
  }
  r.sink(e);
  for (auto& c : r.choices) choice_of_.erase(&c->seq);
  requests_.erase(r.id);  // destroys r
}

void Engine::emit(Choice& c, Released out) {
  Request& r = *c.request;
  if (out.finish) {
    c.finish = out.finish;
    release(c);
    --r.unfinished;
  }
  EngineEvent e;
  e.request_id = r.id;
  e.choice = c.index;
  e.text = std::move(out.text);
  e.tokens = std::move(out.tokens);
  e.finish = out.finish;
  if (!r.prompt_logprobs_sent && r.spec.prompt_logprobs >= 0 &&
      r.prompt_logprobs.size() + 1 == r.spec.prompt.size()) {
    e.prompt_logprobs = std::move(r.prompt_logprobs);
    r.prompt_logprobs_sent = true;
  }
  if (!e.text.empty() || !e.tokens.empty() || e.finish || !e.prompt_logprobs.empty()) r.sink(e);
  if (r.unfinished == 0) end_request(r, RequestEnd::kFinished, Status());
}

void Engine::post_process(Choice& c, std::span<const float> logits, std::optional<int32_t> drawn) {
  Request& r = *c.request;
  const Clock::time_point now = Clock::now();
  if (drawn && *drawn < 0) {
    end_request(r, RequestEnd::kFailed, Status::Corruption("the logits of the step are not finite"));
    return;
  }
  if (r.spec.stop.max_tokens == 0) {  // the prompt scored (its log-probabilities), nothing generated
    Released out;
    out.finish = FinishReason::kLength;
    emit(c, std::move(out));
    return;
  }
  const Sampled s = drawn ? Sampled{*drawn, 0, {}} : c.sampler.next(logits, r.spec.top_logprobs);
  c.seq.tokens.push_back(s.id);
  ++r.completion_tokens;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++metrics_.generation_tokens;
    if (!r.first_token) metrics_.ttft_s.observe(seconds(r.arrival, now));
    else if (c.filter.generated() > 0) metrics_.inter_token_s.observe(seconds(c.last_token, now));
  }
  if (!r.first_token) r.first_token = now;
  c.last_token = now;
  TokenOutput t{s.id, c.decoder ? c.decoder->push(s.id) : std::string(), s};
  Released out = c.filter.push(std::move(t));
  if (!out.finish && static_cast<int64_t>(c.seq.tokens.size()) >= runner_.max_model_len()) {
    Released rest = c.filter.flush(FinishReason::kLength);
    out.text += rest.text;
    for (auto& tok : rest.tokens) out.tokens.push_back(std::move(tok));
    out.finish = FinishReason::kLength;
  }
  if (out.finish == FinishReason::kLength && c.decoder) out.text += c.decoder->finish();
  emit(c, std::move(out));
}

bool Engine::scores_prompt(const Choice& c) const {
  const Request& r = *c.request;
  return c.index == 0 && r.spec.prompt_logprobs >= 0 && r.prompt_logprobs.size() + 1 < r.spec.prompt.size() &&
         c.seq.computed < c.seq.prompt;
}

// A sequence scoring its prompt computes every position: it takes nothing from the prefix cache.
PrefixHit Engine::lookup(const Sequence& seq) {
  const Choice& c = *choice_of_.at(&seq);
  if (c.index == 0 && c.request->spec.prompt_logprobs >= 0) return {};
  return runner_.lookup(seq.tokens);
}

void Engine::open(Sequence& seq, int64_t cached) {
  auto slot = cached > 0 ? runner_.open_prefix(seq.tokens, cached) : runner_.open();
  KL_CHECK(slot.ok(), "the scheduler admitted a sequence the runner cannot open: " + slot.status().to_string());
  seq.slot = *slot;
  seq.computed = cached;
  Request& r = *choice_of_.at(&seq)->request;
  std::lock_guard<std::mutex> lock(mu_);
  metrics_.prefix_query_tokens += seq.tokens.size();
  metrics_.prefix_hit_tokens += static_cast<uint64_t>(cached);
  if (!r.admitted) {
    r.admitted = Clock::now();
    metrics_.queue_s.observe(seconds(r.arrival, *r.admitted));
  }
}

bool Engine::step() {
  const Clock::time_point start = Clock::now();
  take_inbox();
  const StepPlan plan = scheduler_.schedule(runner_, this);
  std::vector<RunnerStep> steps;
  steps.reserve(plan.seqs.size());
  bool decodes = false, prefills = false, scores = false;
  for (const ScheduledSeq& s : plan.seqs) {
    Sequence& seq = *s.seq;
    const bool newest_generated = seq.computed >= seq.prompt && seq.computed + 1 == static_cast<int64_t>(seq.tokens.size());
    (s.tokens == 1 && newest_generated ? decodes : prefills) = true;
    const auto begin = seq.tokens.begin() + seq.computed;
    const bool last = seq.computed + s.tokens == static_cast<int64_t>(seq.tokens.size());
    const bool all = scores_prompt(*choice_of_.at(&seq));
    scores = scores || all;
    steps.push_back({*seq.slot, std::span<const int32_t>(&*begin, static_cast<size_t>(s.tokens)),
                     all ? StepLogits::kAll : last ? StepLogits::kLast : StepLogits::kNone, seq.prompt, {}});
  }
  // Requests the device sampler serves draw there (their logits stay on the device), unless a
  // sequence of the step returns every row.
  for (size_t i = 0; i < steps.size() && runner_.samples_on_device() && !scores; ++i) {
    const Sequence& seq = *plan.seqs[i].seq;
    const Choice& c = *choice_of_.at(&seq);
    if (steps[i].logits == StepLogits::kLast && device_samplable(c.sampler.params(), c.request->spec.top_logprobs))
      steps[i].draw = sample_row(c.sampler.params(), static_cast<int64_t>(seq.tokens.size()) - seq.prompt);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    metrics_.preemptions += plan.preempted.size();
  }
  double forward_s = 0;
  if (!steps.empty()) {
    const Clock::time_point forward_start = Clock::now();
    const Result<SampledStep> logits = run_guarded(runner_, steps);
    forward_s = seconds(forward_start, Clock::now());
    if (!logits.ok()) {
      std::vector<uint64_t> failed;
      for (const ScheduledSeq& s : plan.seqs) failed.push_back(choice_of_.at(s.seq)->request->id);
      for (uint64_t id : failed)
        if (auto it = requests_.find(id); it != requests_.end())
          end_request(*it->second, RequestEnd::kFailed, logits.status());
    } else {
      const int64_t vocab = runner_.vocab_size();
      int64_t row = 0, drawn = 0;
      // (request id, choice, row, drawn): a request may end, and be destroyed, while its rows are
      // handled. A row is a logits row of the host, or (drawn) an id the runner drew.
      std::vector<std::tuple<uint64_t, int, int64_t, bool>> sampled;
      for (size_t i = 0; i < plan.seqs.size(); ++i) {
        Sequence& seq = *plan.seqs[i].seq;
        const int64_t p0 = seq.computed;
        seq.computed += plan.seqs[i].tokens;
        const bool last = seq.computed == static_cast<int64_t>(seq.tokens.size());
        Choice& c = *choice_of_.at(&seq);
        if (steps[i].logits == StepLogits::kAll) {
          // Row j is the distribution of position p0 + j + 1: a prompt token's score, each once.
          Request& r = *c.request;
          const int64_t t = plan.seqs[i].tokens;
          for (int64_t j = 0; j < t; ++j) {
            const int64_t pos = p0 + j + 1;
            if (pos < seq.prompt && pos == static_cast<int64_t>(r.prompt_logprobs.size()) + 1)
              r.prompt_logprobs.push_back(logprobs_of(
                  std::span<const float>(logits->logits.f32() + (row + j) * vocab, static_cast<size_t>(vocab)),
                  r.spec.prompt[static_cast<size_t>(pos)], r.spec.prompt_logprobs));
          }
          row += t;
          if (r.prompt_logprobs.size() + 1 >= r.spec.prompt.size()) seq.max_piece = 0;  // scored
          if (last) sampled.emplace_back(r.id, c.index, row - 1, false);
          continue;
        }
        if (steps[i].logits == StepLogits::kNone) continue;
        const bool on_device = steps[i].draw.has_value();
        sampled.emplace_back(c.request->id, c.index, on_device ? drawn++ : row++, on_device);
      }
      KL_CHECK(logits->logits.dim(0) == row && static_cast<int64_t>(logits->ids.size()) == drawn,
               "runner returned " + std::to_string(logits->logits.dim(0)) + " logits rows and " +
                   std::to_string(logits->ids.size()) + " ids, expected " + std::to_string(row) + " and " +
                   std::to_string(drawn));
      for (const auto& [id, index, r, on_device] : sampled) {
        auto it = requests_.find(id);
        if (it == requests_.end()) continue;
        Choice& c = *it->second->choices[static_cast<size_t>(index)];
        if (c.finished) continue;
        if (on_device) post_process(c, {}, logits->ids[static_cast<size_t>(r)]);
        else post_process(c, std::span<const float>(logits->logits.f32() + r * vocab, static_cast<size_t>(vocab)), {});
      }
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!steps.empty()) {
    const StepKind kind = decodes && prefills ? StepKind::kMixed : decodes ? StepKind::kDecode : StepKind::kPrefill;
    StepMetrics& m = metrics_.steps[static_cast<int>(kind)];
    m.seconds.observe(seconds(start, Clock::now()));
    m.forward_seconds.observe(forward_s);
    for (const RunnerStep& s : steps) m.tokens += s.ids.size();
  }
  metrics_.running = static_cast<int64_t>(scheduler_.num_running());
  metrics_.waiting = static_cast<int64_t>(scheduler_.num_waiting());
  metrics_.cache = runner_.usage();
  return !steps.empty();
}

void Engine::run_until_idle() {
  while (has_work()) step();
}

void Engine::serve() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stopping_ || !requests_.empty() || !inbox_.empty() || !cancels_.empty() || cancel_all_; });
      if (stopping_ && requests_.empty() && inbox_.empty()) return;
    }
    step();
  }
}

}  // namespace klinear

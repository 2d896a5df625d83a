#include "server/metrics.h"

#include <sstream>
#include <string>

namespace klinear {

namespace {

// Writes series under one name prefix, every sample carrying the prefix's own labels (vLLM's
// series carry model_name; klinear's none).
class Writer {
 public:
  Writer(std::ostringstream& o, std::string prefix, std::string labels)
      : o_(o), prefix_(std::move(prefix)), labels_(std::move(labels)) {}

  void header(const char* name, const char* type, const char* help) {
    o_ << "# HELP " << prefix_ << name << " " << help << "\n# TYPE " << prefix_ << name << " " << type << "\n";
  }
  // One sample of `name` (with its suffix) with `labels` (may be empty) after the writer's own.
  template <typename T>
  void sample(const std::string& name, const std::string& labels, T value) {
    o_ << prefix_ << name;
    const std::string all = labels_.empty() ? labels : labels.empty() ? labels_ : labels_ + "," + labels;
    if (!all.empty()) o_ << "{" << all << "}";
    o_ << " " << value << "\n";
  }
  template <typename T>
  void scalar(const char* name, const char* type, const char* help, T value) {
    header(name, type, help);
    sample(name, "", value);
  }
  // A histogram's rows; `labels` (e.g. `kind="decode"`, or empty) go before le and on the sum and count.
  void histogram_rows(const std::string& name, const std::string& labels, const Histogram& h) {
    const std::string sep = labels.empty() ? "" : ",";
    uint64_t cumulative = 0;
    for (size_t i = 0; i < h.bounds().size(); ++i) {
      cumulative += h.counts()[i];
      std::ostringstream le;
      le << h.bounds()[i];
      sample(name + "_bucket", labels + sep + "le=\"" + le.str() + "\"", cumulative);
    }
    sample(name + "_bucket", labels + sep + "le=\"+Inf\"", h.count());
    sample(name + "_sum", labels, h.sum());
    sample(name + "_count", labels, h.count());
  }
  void histogram(const char* name, const char* help, const Histogram& h) {
    header(name, "histogram", help);
    histogram_rows(name, "", h);
  }

 private:
  std::ostringstream& o_;
  std::string prefix_, labels_;
};

// The series klinear and vLLM both export under the same names.
void shared_series(Writer& w, const EngineMetrics& m) {
  w.header("request_success_total", "counter", "Finished requests by how they ended (stop, length, cancelled, error).");
  for (const char* status : {"stop", "length", "cancelled", "error"}) {
    const auto it = m.requests.find(status);
    w.sample("request_success_total", std::string("finished_reason=\"") + status + "\"",
             it == m.requests.end() ? 0 : it->second);
  }
  w.scalar("prompt_tokens_total", "counter", "Prompt tokens of finished requests.", m.prompt_tokens);
  w.scalar("generation_tokens_total", "counter", "Generated tokens.", m.generation_tokens);
  w.scalar("num_requests_running", "gauge", "Sequences running.", m.running);
  w.scalar("num_requests_waiting", "gauge", "Sequences waiting for admission.", m.waiting);
  w.scalar("num_preemptions_total", "counter", "Sequences preempted for recompute.", m.preemptions);
  w.scalar("prefix_cache_queries_total", "counter", "Tokens of admitted sequences looked up in the prefix cache.",
           m.prefix_query_tokens);
  w.scalar("prefix_cache_hits_total", "counter", "Tokens of admitted sequences restored from the prefix cache.",
           m.prefix_hit_tokens);
  const CacheUsage& c = m.cache;
  w.scalar("kv_cache_usage_perc", "gauge", "Fraction of cache pages in use (pages the prefix cache alone holds count as free).",
           c.pages_total ? 1.0 - static_cast<double>(c.pages_free) / static_cast<double>(c.pages_total) : 0.0);
  w.histogram("time_to_first_token_seconds", "Time from arrival to the first generated token.", m.ttft_s);
  w.histogram("inter_token_latency_seconds", "Time between two tokens of a sequence.", m.inter_token_s);
  w.histogram("e2e_request_latency_seconds", "Time from arrival to the end of a request.", m.e2e_s);
  w.histogram("request_queue_time_seconds", "Time from arrival to admission.", m.queue_s);
}

// Engine steps by kind: the step and forward histograms and the token counter, a series per kind.
void steps(Writer& w, const std::array<StepMetrics, kStepKinds>& by_kind) {
  auto label = [](int k) { return std::string("kind=\"") + step_kind_name(static_cast<StepKind>(k)) + "\""; };
  w.header("engine_step_seconds", "histogram",
           "Engine steps by kind (decode, prefill, mixed): schedule, forward, sampling and post-processing.");
  for (int k = 0; k < kStepKinds; ++k) w.histogram_rows("engine_step_seconds", label(k), by_kind[k].seconds);
  w.header("engine_step_forward_seconds", "histogram", "The forward (and device sampling) of engine steps by kind.");
  for (int k = 0; k < kStepKinds; ++k) w.histogram_rows("engine_step_forward_seconds", label(k), by_kind[k].forward_seconds);
  w.header("engine_step_tokens_total", "counter", "Tokens computed by engine steps by kind.");
  for (int k = 0; k < kStepKinds; ++k) w.sample("engine_step_tokens_total", label(k), by_kind[k].tokens);
}

std::string escape_label(const std::string& v) {
  std::string out;
  for (char ch : v) {
    if (ch == '\\' || ch == '"') out += '\\';
    if (ch == '\n') {
      out += "\\n";
      continue;
    }
    out += ch;
  }
  return out;
}

}  // namespace

std::string prometheus_text(const EngineMetrics& m, const std::map<int, uint64_t>& http_responses,
                            const std::string& model_name) {
  std::ostringstream o;
  Writer k(o, "klinear:", "");
  shared_series(k, m);
  k.header("http_responses_total", "counter", "HTTP responses by status code.");
  for (const auto& [code, count] : http_responses) k.sample("http_responses_total", "code=\"" + std::to_string(code) + "\"", count);
  k.scalar("prefix_cache_hit_rate", "gauge", "Prefix-cache hits over queries, in tokens.",
           m.prefix_query_tokens ? static_cast<double>(m.prefix_hit_tokens) / static_cast<double>(m.prefix_query_tokens) : 0.0);
  const CacheUsage& c = m.cache;
  k.scalar("state_slot_usage_perc", "gauge", "Fraction of sequence state slots in use.",
           c.slots_total ? 1.0 - static_cast<double>(c.slots_free) / static_cast<double>(c.slots_total) : 0.0);
  steps(k, m.steps);
  Writer v(o, "vllm:", "model_name=\"" + escape_label(model_name) + "\"");
  shared_series(v, m);
  return o.str();
}

}  // namespace klinear

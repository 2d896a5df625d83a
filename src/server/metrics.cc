#include "server/metrics.h"

#include <sstream>
#include <string>

namespace klinear {

namespace {

void header(std::ostringstream& o, const char* name, const char* type, const char* help) {
  o << "# HELP klinear:" << name << " " << help << "\n# TYPE klinear:" << name << " " << type << "\n";
}

template <typename T>
void scalar(std::ostringstream& o, const char* name, const char* type, const char* help, T value) {
  header(o, name, type, help);
  o << "klinear:" << name << " " << value << "\n";
}

// A histogram's rows; `labels` (e.g. `kind="decode"`, or empty) go before le and on the sum and count.
void histogram_rows(std::ostringstream& o, const char* name, const std::string& labels, const Histogram& h) {
  const char* sep = labels.empty() ? "" : ",";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < h.bounds().size(); ++i) {
    cumulative += h.counts()[i];
    o << "klinear:" << name << "_bucket{" << labels << sep << "le=\"" << h.bounds()[i] << "\"} " << cumulative << "\n";
  }
  o << "klinear:" << name << "_bucket{" << labels << sep << "le=\"+Inf\"} " << h.count() << "\n";
  auto series = [&](const char* suffix) -> std::ostringstream& {
    o << "klinear:" << name << suffix;
    if (!labels.empty()) o << "{" << labels << "}";
    o << " ";
    return o;
  };
  series("_sum") << h.sum() << "\n";
  series("_count") << h.count() << "\n";
}

void histogram(std::ostringstream& o, const char* name, const char* help, const Histogram& h) {
  header(o, name, "histogram", help);
  histogram_rows(o, name, "", h);
}

// Engine steps by kind: the step and forward histograms and the token counter, a series per kind.
void steps(std::ostringstream& o, const std::array<StepMetrics, kStepKinds>& by_kind) {
  auto label = [](int k) { return std::string("kind=\"") + step_kind_name(static_cast<StepKind>(k)) + "\""; };
  header(o, "engine_step_seconds", "histogram",
         "Engine steps by kind (decode, prefill, mixed): schedule, forward, sampling and post-processing.");
  for (int k = 0; k < kStepKinds; ++k) histogram_rows(o, "engine_step_seconds", label(k), by_kind[k].seconds);
  header(o, "engine_step_forward_seconds", "histogram", "The forward (and device sampling) of engine steps by kind.");
  for (int k = 0; k < kStepKinds; ++k) histogram_rows(o, "engine_step_forward_seconds", label(k), by_kind[k].forward_seconds);
  header(o, "engine_step_tokens_total", "counter", "Tokens computed by engine steps by kind.");
  for (int k = 0; k < kStepKinds; ++k) o << "klinear:engine_step_tokens_total{" << label(k) << "} " << by_kind[k].tokens << "\n";
}

}  // namespace

std::string prometheus_text(const EngineMetrics& m, const std::map<int, uint64_t>& http_responses) {
  std::ostringstream o;
  header(o, "request_success_total", "counter", "Finished requests by how they ended (stop, length, cancelled, error).");
  for (const char* status : {"stop", "length", "cancelled", "error"}) {
    const auto it = m.requests.find(status);
    o << "klinear:request_success_total{finished_reason=\"" << status << "\"} " << (it == m.requests.end() ? 0 : it->second)
      << "\n";
  }
  header(o, "http_responses_total", "counter", "HTTP responses by status code.");
  for (const auto& [code, count] : http_responses) o << "klinear:http_responses_total{code=\"" << code << "\"} " << count << "\n";
  scalar(o, "prompt_tokens_total", "counter", "Prompt tokens of finished requests.", m.prompt_tokens);
  scalar(o, "generation_tokens_total", "counter", "Generated tokens.", m.generation_tokens);
  scalar(o, "num_requests_running", "gauge", "Sequences running.", m.running);
  scalar(o, "num_requests_waiting", "gauge", "Sequences waiting for admission.", m.waiting);
  scalar(o, "num_preemptions_total", "counter", "Sequences preempted for recompute.", m.preemptions);
  scalar(o, "prefix_cache_queries_total", "counter", "Tokens of admitted sequences looked up in the prefix cache.",
         m.prefix_query_tokens);
  scalar(o, "prefix_cache_hits_total", "counter", "Tokens of admitted sequences restored from the prefix cache.",
         m.prefix_hit_tokens);
  scalar(o, "prefix_cache_hit_rate", "gauge", "Prefix-cache hits over queries, in tokens.",
         m.prefix_query_tokens ? static_cast<double>(m.prefix_hit_tokens) / static_cast<double>(m.prefix_query_tokens) : 0.0);
  const CacheUsage& c = m.cache;
  scalar(o, "kv_cache_usage_perc", "gauge", "Fraction of cache pages in use (pages the prefix cache alone holds count as free).",
         c.pages_total ? 1.0 - static_cast<double>(c.pages_free) / static_cast<double>(c.pages_total) : 0.0);
  scalar(o, "state_slot_usage_perc", "gauge", "Fraction of sequence state slots in use.",
         c.slots_total ? 1.0 - static_cast<double>(c.slots_free) / static_cast<double>(c.slots_total) : 0.0);
  histogram(o, "time_to_first_token_seconds", "Time from arrival to the first generated token.", m.ttft_s);
  histogram(o, "inter_token_latency_seconds", "Time between two tokens of a sequence.", m.inter_token_s);
  histogram(o, "e2e_request_latency_seconds", "Time from arrival to the end of a request.", m.e2e_s);
  histogram(o, "request_queue_time_seconds", "Time from arrival to admission.", m.queue_s);
  steps(o, m.steps);
  return o.str();
}

}  // namespace klinear

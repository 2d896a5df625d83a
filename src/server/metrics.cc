#include "server/metrics.h"

#include <sstream>

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

void histogram(std::ostringstream& o, const char* name, const char* help, const Histogram& h) {
  header(o, name, "histogram", help);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < h.bounds().size(); ++i) {
    cumulative += h.counts()[i];
    o << "klinear:" << name << "_bucket{le=\"" << h.bounds()[i] << "\"} " << cumulative << "\n";
  }
  o << "klinear:" << name << "_bucket{le=\"+Inf\"} " << h.count() << "\n";
  o << "klinear:" << name << "_sum " << h.sum() << "\n";
  o << "klinear:" << name << "_count " << h.count() << "\n";
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
  return o.str();
}

}  // namespace klinear

#include "bench_client.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <random>
#include <thread>

#include "io/json.h"

namespace klinear {

using Clock = std::chrono::steady_clock;

namespace {

struct One {
  bool ok = false;
  std::string error;
  int64_t output_tokens = 0;
  double ttft = 0, e2e = 0;
  std::vector<double> itl;
};

One send_one(httplib::Client& cli, const BenchOptions& o, const std::string& model, const std::vector<int32_t>& prompt) {
  One r;
  const Json body{{"model", model}, {"prompt", prompt}, {"max_tokens", o.output_len}, {"ignore_eos", true},
                  {"temperature", 0}, {"stream", true}, {"stream_options", {{"include_usage", true}}}};
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  if (!o.api_key.empty()) req.set_header("Authorization", "Bearer " + o.api_key);
  const Clock::time_point start = Clock::now();
  std::optional<Clock::time_point> last;
  std::string buffer;
  bool done = false;
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    buffer.append(data, len);
    for (size_t end; (end = buffer.find("\n\n")) != std::string::npos;) {
      const std::string event = buffer.substr(0, end);
      buffer.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0) continue;
      const std::string payload = event.substr(6);
      if (payload == "[DONE]") {
        done = true;
        continue;
      }
      auto j = parse_json(payload, "chunk");
      if (!j.ok()) continue;
      if (j->contains("error")) r.error = (*j)["error"].dump();
      if (j->contains("usage") && (*j)["usage"].is_object()) r.output_tokens = (*j)["usage"]["completion_tokens"];
      const Json& choices = (*j)["choices"];
      if (!choices.is_array() || choices.empty()) continue;
      const Clock::time_point now = Clock::now();
      if (!last) r.ttft = std::chrono::duration<double>(now - start).count();
      else r.itl.push_back(std::chrono::duration<double>(now - *last).count());
      last = now;
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool sent = cli.send(req, res, err);
  r.e2e = std::chrono::duration<double>(Clock::now() - start).count();
  if (!sent) r.error = "request failed: " + httplib::to_string(err);
  else if (res.status != 200 && r.error.empty()) r.error = "HTTP " + std::to_string(res.status) + " " + res.body;
  r.ok = r.error.empty() && done;
  if (r.error.empty() && !done) r.error = "stream ended without [DONE]";
  return r;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

}  // namespace

Result<BenchResult> run_bench(const BenchOptions& o) {
  if (o.concurrency < 1 || o.requests < 1 || o.input_len < 1 || o.output_len < 1 || o.prefix_len < 0 ||
      o.prefix_len > o.input_len)
    return Status::InvalidArgument("bench-serve needs concurrency, requests, input-len and output-len >= 1 and "
                                   "0 <= prefix-len <= input-len");
  httplib::Client probe(o.url);
  httplib::Headers headers;
  if (!o.api_key.empty()) headers.emplace("Authorization", "Bearer " + o.api_key);
  auto models = probe.Get("/v1/models", headers);
  if (!models || models->status != 200)
    return Status::IOError(o.url + "/v1/models: " + (models ? "HTTP " + std::to_string(models->status) : httplib::to_string(models.error())));
  KL_ASSIGN_OR_RETURN(Json list, parse_json(models->body, "/v1/models"));
  if (!list.contains("data") || list["data"].empty()) return Status::IOError(o.url + "/v1/models lists no model");
  const std::string model = list["data"][0].value("id", "");

  // Token ids below 256 exist in every vocabulary klinear serves (byte tokens of the Kimi
  // tokenizer, and the test checkpoints' vocabularies are larger).
  BenchResult result;
  result.seed = o.seed ? *o.seed : (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
  std::mt19937_64 rng(result.seed);
  auto random_ids = [&](int n) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (int32_t& id : v) id = static_cast<int32_t>(rng() % 256);
    return v;
  };
  const std::vector<int32_t> prefix = random_ids(o.prefix_len);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < o.requests; ++i) {
    std::vector<int32_t> p = prefix;
    const std::vector<int32_t> rest = random_ids(o.input_len - o.prefix_len);
    p.insert(p.end(), rest.begin(), rest.end());
    prompts.push_back(std::move(p));
  }

  std::mutex mu;
  std::atomic<int> next{0};
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> workers;
  for (int w = 0; w < o.concurrency; ++w)
    workers.emplace_back([&] {
      httplib::Client cli(o.url);
      cli.set_read_timeout(600, 0);
      for (int i; (i = next++) < o.requests;) {
        One one = send_one(cli, o, model, prompts[static_cast<size_t>(i)]);
        std::lock_guard<std::mutex> lock(mu);
        if (!one.ok) {
          ++result.failed;
          if (result.first_error.empty()) result.first_error = one.error;
          continue;
        }
        ++result.completed;
        result.input_tokens += o.input_len;
        result.output_tokens += one.output_tokens;
        result.ttft_s.push_back(one.ttft);
        result.e2e_s.push_back(one.e2e);
        result.itl_s.insert(result.itl_s.end(), one.itl.begin(), one.itl.end());
      }
    });
  for (std::thread& t : workers) t.join();
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

std::string bench_report(const BenchOptions& o, const BenchResult& r) {
  char buf[2048];
  auto ms = [](const std::vector<double>& v, double p) { return 1e3 * percentile(v, p); };
  std::snprintf(buf, sizeof(buf),
                "requests %d ok, %d failed (concurrency %d, input %d tokens with a %d-token shared prefix, output %d, "
                "seed %llu)\n"
                "time %.2f s; output %.1f tokens/s; total (input + output) %.1f tokens/s\n"
                "TTFT ms         p50 %9.1f  p90 %9.1f  p99 %9.1f\n"
                "ITL ms          p50 %9.1f  p90 %9.1f  p99 %9.1f\n"
                "end-to-end ms   p50 %9.1f  p90 %9.1f  p99 %9.1f\n",
                r.completed, r.failed, o.concurrency, o.input_len, o.prefix_len, o.output_len,
                static_cast<unsigned long long>(r.seed), r.seconds,
                static_cast<double>(r.output_tokens) / r.seconds,
                static_cast<double>(r.input_tokens + r.output_tokens) / r.seconds, ms(r.ttft_s, 0.5), ms(r.ttft_s, 0.9),
                ms(r.ttft_s, 0.99), ms(r.itl_s, 0.5), ms(r.itl_s, 0.9), ms(r.itl_s, 0.99), ms(r.e2e_s, 0.5),
                ms(r.e2e_s, 0.9), ms(r.e2e_s, 0.99));
  std::string s = buf;
  if (!r.first_error.empty()) s += "first error: " + r.first_error + "\n";
  return s;
}

}  // namespace klinear

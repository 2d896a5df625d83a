// HttpServer: the OpenAI-compatible HTTP front of an Engine (with tools/klinear/bench_client.cc, the
// only user of cpp-httplib).
//
// HTTP threads only parse, enqueue and stream: each request is validated (openai.h), submitted
// to the engine with a sink that feeds a per-request channel, and its handler (or its SSE content
// provider) drains the channel. A client that disconnects has its request cancelled, so its slot
// and pages return: a streaming one when a write fails, a waiting non-streaming one when its
// connection reports the hang-up (Connection::client_gone: a half-close is not one). Connections,
// deadlines and threads are http_transport.h's. Routes: POST /v1/chat/completions, /v1/completions, /tokenize,
// /detokenize; GET /v1/models, /v1/models/{id}, /health, /metrics, /version; GET or POST /ping;
// OPTIONS for CORS preflights (--allowed-origins). A request's X-Request-Id header is echoed (and
// names its response when the body has no request_id). With an API key, /v1/* and the tokenizer routes
// need "Authorization: Bearer KEY" (401 otherwise); unknown paths are 404, bodies over the limit
// 413 (the limit holds on the decoded body: gzip, chunked), a full queue or a draining server 503, all as
// OpenAI error objects; /health is 503 once drain() was called. The API key is compared in constant
// time; the listening socket takes no SO_REUSEPORT, so a busy port is an error.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>
#include <thread>

#include "chat/chat_format.h"
#include "io/tokenizer.h"
#include "runtime/engine.h"
#include "server/openai.h"

namespace klinear {

class HttpTransport;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                         // 0: any free port (see HttpServer::port())
  std::string api_key;                     // empty: no authentication
  std::string model_name;                  // the id /v1/models lists and requests must name
  size_t max_body_bytes = 8u << 20;        // larger bodies get 413
  std::optional<int64_t> truncate_prompt;  // requests without truncate_prompt_tokens: -1 truncates, none refuses
  int http_threads = 64;                   // requests served at once (/health and /metrics have 2 more)
  double header_timeout_s = 10;            // a request's line and headers must arrive within this (408)
  double body_timeout_s = 60;              // and its body within this of the headers (408)
  int max_slow_connections_per_client = 16;  // connections of one client with a head partly sent (429 above)
  std::string model_root;                  // the checkpoint directory (the model card's root)
  // Origins a browser may call from (CORS): "*" any; empty: no CORS headers (browsers refuse).
  std::vector<std::string> allowed_origins;
  bool log_requests = true;                // a stderr line per finished request
};

class HttpServer {
 public:
  // `engine` and `tokenizer` (may be null) must outlive the server; the engine runs on its own
  // thread (Engine::serve), started by the caller.
  HttpServer(Engine& engine, const Tokenizer* tokenizer, ChatFormat format, ServerOptions options);
  ~HttpServer();

  // Binds and starts listening on a background thread. IOError naming the address on failure.
  Status start();
  int port() const { return port_; }
  // From now on /health answers 503 (a load balancer stops sending); requests still run.
  void drain();
  // Waits until no request is in flight (call after the engine drained), then stops listening.
  void stop();

 private:
  struct Channel;
  class Waker;
  struct Part;
  static std::vector<Json> route(std::vector<Part>& parts, const EngineEvent& e);
  static bool all_ended(const std::vector<Part>& parts);
  static RequestStats summed_stats(const std::vector<Part>& parts);
  static Status first_failure(const std::vector<Part>& parts);
  void routes();
  void count(int status);
  // A response id unique across requests and server runs: this run's random 64 bits, then a count.
  std::string fresh_response_id();
  // The CORS origin to allow for a request from `origin` (empty: none).
  std::string allowed_origin(const std::string& origin) const;
  // The stderr line of a finished request (--disable-log-requests turns it off).
  void log_request(const std::string& id, ApiKind kind, bool stream, int status, const RequestStats& stats,
                   const std::string& note, const std::string& user) const;

  Engine& engine_;
  const Tokenizer* tokenizer_;
  ChatFormat format_;
  ServerOptions options_;
  std::unique_ptr<HttpTransport> http_;
  std::thread listener_;
  int port_ = 0;
  std::atomic<int> in_flight_{0};
  std::atomic<bool> draining_{false};
  std::string run_id_;  // 16 hex digits drawn at start
  int64_t started_;     // Unix seconds at start (the model card's `created`)
  std::atomic<uint64_t> next_response_id_{1};
  std::mutex mu_;
  std::map<int, uint64_t> responses_;  // by HTTP status; guarded by mu_
  // Shared with the engine's sinks, which may outlive the server in an engine not yet drained.
  std::shared_ptr<Waker> waker_;
};

}  // namespace klinear

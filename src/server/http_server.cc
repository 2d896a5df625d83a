#include "server/http_server.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <condition_variable>
#include <deque>
#include <random>

#include "server/http_transport.h"
#include "server/metrics.h"
#include "server/openai.h"

namespace klinear {

// Events of one request, from the engine thread to the HTTP thread that answers it.
struct HttpServer::Channel {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<EngineEvent> events;

  // Queues `e`; returns whether the queue was empty, i.e. whether the HTTP thread may be asleep
  // (it sleeps only on an empty queue) and needs a wake.
  bool push(const EngineEvent& e) {
    std::lock_guard<std::mutex> lock(mu);
    const bool was_empty = events.empty();
    events.push_back(e);
    return was_empty;
  }
  // Waits up to `timeout` for events and takes them all.
  std::deque<EngineEvent> take(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, timeout, [&] { return !events.empty(); });
    std::deque<EngineEvent> out;
    out.swap(events);
    return out;
  }
};

// Wakes the HTTP threads of channels that got events, on a thread of its own, so the engine
// thread only queues. A wake is a system call (and an interrupt to another core for a sleeping
// thread): made by the engine thread for every token of every stream, it cost 13-17 us a stream
// where queueing costs 0.2-0.3 (256 waiting threads on the 2-core build machine), milliseconds of
// every decode step at 256 streams (issue 8: 6.4 ms of host time a step on the H200).
class HttpServer::Waker {
 public:
  Waker() : thread_([this] { run(); }) {}
  ~Waker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  void wake(std::shared_ptr<Channel> c) {
    bool was_empty;
    {
      std::lock_guard<std::mutex> lock(mu_);
      was_empty = pending_.empty();
      pending_.push_back(std::move(c));
    }
    if (was_empty) cv_.notify_one();
  }

 private:
  void run() {
    std::vector<std::shared_ptr<Channel>> batch;
    for (bool stop = false; !stop;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !pending_.empty(); });
        batch.swap(pending_);
        stop = stop_;
      }
      for (const auto& c : batch) c->cv.notify_all();
      batch.clear();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<Channel>> pending_;  // guarded by mu_
  bool stop_ = false;                              // guarded by mu_
  std::thread thread_;
};

namespace {

std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

void send_json(httplib::Response& res, int status, const Json& j) {
  res.status = status;
  res.set_content(dump(j), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) { send_json(res, e.status, error_json(e)); }

std::string sse(const Json& j) { return "data: " + dump(j) + "\n\n"; }

// The listening socket's options: SO_REUSEADDR (a restart binds while old connections linger in
// TIME_WAIT) but not cpp-httplib's default SO_REUSEPORT, with which a second server on a busy port
// started and the kernel split the connections between the two.
void reuse_address(socket_t sock) {
  const int yes = 1;
  setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
}

// Whether `header` is "Bearer KEY", in time that does not depend on where they differ.
bool bearer_matches(const std::string& header, const std::string& key) {
  const std::string want = "Bearer " + key;
  unsigned diff = header.size() != want.size();
  for (size_t i = 0; i < want.size(); ++i) diff |= static_cast<unsigned char>(want[i]) ^ static_cast<unsigned char>(i < header.size() ? header[i] : 0);
  return diff == 0;
}

// Reads a request body as it arrives, decoded (chunked transfer, gzip), stopping at `limit` bytes:
// the limit holds on what the handler sees, not only on Content-Length (a 194 KB gzip body
// inflated to 200 MB; a chunked body had no limit). The error to send when it cannot: 413 over
// the limit (httplib's own Content-Length check sets 413 too), 400 for a body that cannot be read.
std::optional<ApiError> read_body(const httplib::ContentReader& reader, const httplib::Response& res, size_t limit,
                                  double timeout_s, std::string& body) {
  bool over = false;
  const bool read = reader([&](const char* data, size_t n) {
    over = n > limit - body.size();
    if (!over) body.append(data, n);
    return !over;
  });
  if (over || (!read && res.status == 413))
    return ApiError{413, "the request body is over the limit of " + std::to_string(limit) + " bytes (after decoding)",
                    "invalid_request_error", "", ""};
  const Connection* connection = HttpTransport::current();
  if (!read && connection && connection->timed_out()) {
    char seconds[32];
    std::snprintf(seconds, sizeof(seconds), "%g", timeout_s);
    return ApiError{408, std::string("the request body did not arrive within --body-timeout (") + seconds + " s)",
                    "invalid_request_error", "", ""};
  }
  if (!read)
    return ApiError{400, "the request body could not be read (a broken chunked or compressed encoding?)",
                    "invalid_request_error", "", ""};
  return std::nullopt;
}

}  // namespace

// One prompt's engine request within an HTTP request (a completion's list of prompts has several).
struct HttpServer::Part {
  ApiRequest r;
  std::vector<int32_t> prompt;  // what the builder needs of it (echo, return_token_ids, usage)
  uint64_t id = 0;              // the engine's request id
  std::shared_ptr<ResponseBuilder> builder;
  EngineEvent last;             // the request's last event, once it ended
  bool ended = false;
};

namespace {

constexpr size_t kMaxPrompts = 1024;  // prompts of one completion request

// For a completion whose prompt is a list of prompts (texts, or lists of token ids; vLLM's batch),
// one body per prompt with the other fields; for any other body none (it is its own one request).
Result<std::vector<Json>> split_prompts(ApiKind kind, const Json& body) {
  std::vector<Json> out;
  const Json* p = kind == ApiKind::kCompletion && body.is_object() && body.contains("prompt") ? &body["prompt"] : nullptr;
  const bool texts = p && p->is_array() && p->size() >= 2 &&
                     std::all_of(p->begin(), p->end(), [](const Json& x) { return x.is_string(); });
  const bool lists = p && p->is_array() && !p->empty() &&
                     std::all_of(p->begin(), p->end(), [](const Json& x) { return x.is_array(); });
  if (!texts && !lists) return out;
  if (p->size() > kMaxPrompts)
    return Status::InvalidArgument("field 'prompt' holds " + std::to_string(p->size()) + " prompts; at most " +
                                   std::to_string(kMaxPrompts) + " in one request");
  Json rest = body;
  rest.erase("prompt");
  for (const Json& one : *p) {
    Json b = rest;
    b["prompt"] = one;
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace

// Hands an event to its prompt's builder; returns the builder's chunks with their choices numbered
// across the prompts (prompt k's choice i is k·n + i).
std::vector<Json> HttpServer::route(std::vector<Part>& parts, const EngineEvent& e) {
  for (size_t k = 0; k < parts.size(); ++k) {
    Part& p = parts[k];
    if (p.id != e.request_id) continue;
    std::vector<Json> chunks = p.builder->chunks(e);
    if (e.end != RequestEnd::kRunning) {
      p.last = e;
      p.ended = true;
    }
    const int64_t base = static_cast<int64_t>(k) * p.r.spec.n;
    if (base > 0)
      for (Json& j : chunks)
        for (Json& c : j["choices"]) c["index"] = c["index"].get<int64_t>() + base;
    return chunks;
  }
  return {};
}

bool HttpServer::all_ended(const std::vector<Part>& parts) {
  return std::all_of(parts.begin(), parts.end(), [](const Part& p) { return p.ended; });
}

RequestStats HttpServer::summed_stats(const std::vector<Part>& parts) {
  RequestStats s;
  for (const Part& p : parts) {
    s.prompt_tokens += p.last.stats.prompt_tokens;
    s.completion_tokens += p.last.stats.completion_tokens;
    s.queue_s = std::max(s.queue_s, p.last.stats.queue_s);
    s.ttft_s = std::max(s.ttft_s, p.last.stats.ttft_s);
    s.e2e_s = std::max(s.e2e_s, p.last.stats.e2e_s);
  }
  return s;
}

Status HttpServer::first_failure(const std::vector<Part>& parts) {
  for (const Part& p : parts)
    if (p.last.end == RequestEnd::kFailed) return p.last.error;
  return Status();
}

HttpServer::HttpServer(Engine& engine, const Tokenizer* tokenizer, ChatFormat format, ServerOptions options)
    : engine_(engine), tokenizer_(tokenizer), format_(format), options_(std::move(options)),
      waker_(std::make_shared<Waker>()) {
  started_ = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::random_device rd;
  char run[17];
  std::snprintf(run, sizeof(run), "%08x%08x", rd(), rd());
  run_id_ = run;
  auto ms = [](double s) { return std::chrono::milliseconds(static_cast<int64_t>(s * 1e3)); };
  http_ = std::make_unique<HttpTransport>(TransportOptions{ms(options_.header_timeout_s), ms(options_.body_timeout_s),
                                                           options_.max_slow_connections_per_client, options_.http_threads,
                                                           {"/health", "/metrics"}, [this](int status) { count(status); }});
  routes();
}

HttpServer::~HttpServer() {
  if (http_->is_running()) http_->stop();
  if (listener_.joinable()) listener_.join();
}

std::string HttpServer::fresh_response_id() {
  char count[24];
  std::snprintf(count, sizeof(count), "%llx", static_cast<unsigned long long>(next_response_id_++));
  return run_id_ + count;
}

std::string HttpServer::allowed_origin(const std::string& origin) const {
  for (const std::string& o : options_.allowed_origins)
    if (o == "*" || o == origin) return o == "*" ? std::string("*") : origin;
  return std::string();
}

void HttpServer::log_request(const std::string& id, ApiKind kind, bool stream, int status, const RequestStats& s,
                             const std::string& note, const std::string& user) const {
  if (!options_.log_requests) return;
  // The user is the client's text: quoted as JSON, so it cannot forge a log line.
  const std::string who = user.empty() ? std::string() : "; user " + Json(user).dump(-1, ' ', true, Json::error_handler_t::replace);
  std::fprintf(stderr, "klinear serve: %s %s%s %d: prompt %lld, completion %lld tokens; queue %.3f s, first token %.3f s, "
               "end %.3f s%s%s%s\n", id.c_str(), kind == ApiKind::kChat ? "chat" : "completion", stream ? " stream" : "",
               status, static_cast<long long>(s.prompt_tokens), static_cast<long long>(s.completion_tokens), s.queue_s,
               s.ttft_s, s.e2e_s, note.empty() ? "" : "; ", note.c_str(), who.c_str());
}

void HttpServer::count(int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++responses_[status];
}

Status HttpServer::start() {
  // Debian's cpp-httplib (0.11, compiled) listens with a backlog of 5: a burst of connections
  // (bench-serve at 256 streams) overflowed it and dropped clients read nothing. listen() again on
  // the bound socket raises the backlog (Linux); the socket is the last one the options saw.
  int listen_fd = -1;
  http_->set_socket_options([&listen_fd](socket_t sock) {
    reuse_address(sock);
    listen_fd = sock;
  });
  errno = 0;
  port_ = options_.port == 0 ? http_->bind_to_any_port(options_.host) : (http_->bind_to_port(options_.host, options_.port) ? options_.port : -1);
  const int bind_errno = errno;
  http_->set_socket_options(reuse_address);
  if (port_ < 0)
    return Status::IOError("cannot listen on " + options_.host + ":" + std::to_string(options_.port) +
                           (bind_errno ? std::string(": ") + std::strerror(bind_errno) : std::string()));
  if (::listen(listen_fd, SOMAXCONN) != 0)
    return Status::IOError("cannot raise the listen backlog on " + options_.host + ":" + std::to_string(port_));
  listener_ = std::thread([this] { http_->listen_after_bind(); });
  return Status();
}

void HttpServer::drain() { draining_ = true; }

void HttpServer::stop() {
  while (in_flight_.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  http_->stop();
  if (listener_.joinable()) listener_.join();
}

void HttpServer::routes() {
  httplib::Server& s = *http_;
  s.set_payload_max_length(options_.max_body_bytes);
  s.set_keep_alive_max_count(1000);
  s.set_tcp_nodelay(true);  // a reply's header and body writes go out at once (Nagle held the body ~40 ms)

  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    const bool protected_path = req.path.rfind("/v1/", 0) == 0 || req.path == "/tokenize" || req.path == "/detokenize";
    // A browser's CORS preflight carries no credentials.
    if (options_.api_key.empty() || !protected_path || req.method == "OPTIONS")
      return httplib::Server::HandlerResponse::Unhandled;
    if (bearer_matches(req.get_header_value("Authorization"), options_.api_key))
      return httplib::Server::HandlerResponse::Unhandled;
    ApiError e{401, "a valid API key is required: send the header 'Authorization: Bearer <key>'", "authentication_error",
               "", "invalid_api_key"};
    send_error(res, e);
    return httplib::Server::HandlerResponse::Handled;
  });
  // Responses httplib makes itself (unknown path, body too large) get OpenAI error objects.
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 404) send_error(res, ApiError{404, "no route " + req.method + " " + req.path, "not_found_error", "", ""});
    else if (res.status == 413) send_error(res, ApiError{413, "the request body is over the size limit", "invalid_request_error", "", ""});
    else send_error(res, ApiError{res.status, "HTTP error " + std::to_string(res.status), "invalid_request_error", "", ""});
  });
  s.set_logger([this](const httplib::Request&, const httplib::Response& res) { count(res.status); });
  // Every response: the request's X-Request-Id echoed, and CORS headers for an allowed origin.
  s.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (req.has_header("X-Request-Id")) res.set_header("X-Request-Id", req.get_header_value("X-Request-Id"));
    if (!req.has_header("Origin")) return;
    const std::string origin = allowed_origin(req.get_header_value("Origin"));
    if (origin.empty()) return;
    res.set_header("Access-Control-Allow-Origin", origin);
    if (origin != "*") res.set_header("Vary", "Origin");
  });
  s.Options(R"(/.*)", [this](const httplib::Request& req, httplib::Response& res) {
    res.status = 204;
    if (allowed_origin(req.get_header_value("Origin")).empty()) return;
    res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    const std::string asked = req.get_header_value("Access-Control-Request-Headers");
    res.set_header("Access-Control-Allow-Headers", asked.empty() ? "Authorization, Content-Type, X-Request-Id" : asked);
    res.set_header("Access-Control-Max-Age", "600");
  });
  // An exception out of a handler (a failed allocation: the request asked for more than there is)
  // fails that request alone.
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "the request failed";
    try {
      std::rethrow_exception(ep);
    } catch (const std::bad_alloc&) {
      what = "the server ran out of memory serving this request";
    } catch (const std::exception& e) {
      what = std::string("the request failed: ") + e.what();
    } catch (...) {
    }
    res.body.clear();
    send_error(res, ApiError{500, what, "server_error", "", ""});
  });

  // While draining /health is 503, so a load balancer stops sending before the server goes.
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    res.status = draining_ ? 503 : 200;
    res.set_content(draining_ ? "draining" : "", "text/plain");
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    std::map<int, uint64_t> responses;
    {
      std::lock_guard<std::mutex> lock(mu_);
      responses = responses_;
    }
    res.set_content(prometheus_text(engine_.metrics(), responses, options_.model_name), "text/plain; version=0.0.4");
  });
  // The model card, as vLLM writes it: created is the server's start.
  auto card = [this] {
    return Json{{"id", options_.model_name}, {"object", "model"},   {"created", started_},
                {"owned_by", "klinear"},     {"root", options_.model_root.empty() ? options_.model_name : options_.model_root},
                {"parent", nullptr},         {"max_model_len", engine_.max_sequence_tokens()},
                {"permission", Json::array()}};
  };
  s.Get("/v1/models", [card](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, Json{{"object", "list"}, {"data", {card()}}});
  });
  s.Get(R"(/v1/models/(.+))", [this, card](const httplib::Request& req, httplib::Response& res) {
    if (req.matches[1] == options_.model_name) return send_json(res, 200, card());
    send_error(res, ApiError{404, "the model '" + std::string(req.matches[1]) + "' does not exist; this server serves '" +
                                      options_.model_name + "'", "not_found_error", "model", "model_not_found"});
  });
  s.Get("/version", [](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, Json{{"version", KLINEAR_VERSION}});
  });
  auto ping = [](const httplib::Request&, httplib::Response& res) { res.status = 200; };
  s.Get("/ping", ping);
  s.Post("/ping", ping);

  // The POST routes take their body through read_body, so its limit holds on the decoded bytes.
  using BodyHandler = std::function<void(const httplib::Request&, httplib::Response&, const std::string& body)>;
  auto post = [this](const char* path, BodyHandler handler) {
    http_->Post(path, [this, handler = std::move(handler)](const httplib::Request& req, httplib::Response& res,
                                                          const httplib::ContentReader& reader) {
      std::string body;
      if (auto e = read_body(reader, res, options_.max_body_bytes, options_.body_timeout_s, body)) return send_error(res, *e);
      handler(req, res, body);
    });
  };

  post("/tokenize", [this](const httplib::Request&, httplib::Response& res, const std::string& text) {
    auto body = parse_json(text, "request body");
    if (!body.ok()) return send_error(res, api_error(body.status()));
    ReleaseJsonOnExit release{*body};
    std::string param;
    // /tokenize's own fields; the rest is a request's prompt (messages and their chat options, or prompt).
    bool token_strs = false;
    if (body->is_object() && body->contains("return_token_strs")) {
      auto v = json_opt_bool(*body, "return_token_strs", "request");
      if (!v.ok()) return send_error(res, api_error(v.status(), "return_token_strs"));
      token_strs = v->value_or(false);
      body->erase("return_token_strs");
    }
    ApiRequest r;
    r.kind = body->contains("messages") ? ApiKind::kChat : ApiKind::kCompletion;
    if (r.kind == ApiKind::kChat) {
      auto parsed = parse_api_request(ApiKind::kChat, format_, *body, &param);
      if (!parsed.ok()) return send_error(res, api_error(parsed.status(), param));
      r = std::move(parsed).value();
    } else {
      auto text = json_opt_string(*body, "prompt", "request");
      if (!text.ok() || !text->has_value())
        return send_error(res, api_error(Status::InvalidArgument("field 'prompt' must be a string (or send 'messages')"), "prompt"));
      r.prompt_text = **text;
    }
    auto ids = request_prompt_ids(r, tokenizer_, format_);
    if (!ids.ok()) return send_error(res, api_error(ids.status()));
    Json out{{"tokens", *ids}, {"count", ids->size()}, {"max_model_len", engine_.max_sequence_tokens()}};
    if (token_strs) {
      out["token_strs"] = Json::array();
      for (int32_t id : *ids) out["token_strs"].push_back(tokenizer_->token_bytes(id));
    }
    send_json(res, 200, out);
  });
  post("/detokenize", [this](const httplib::Request&, httplib::Response& res, const std::string& text) {
    auto body = parse_json(text, "request body");
    if (!body.ok()) return send_error(res, api_error(body.status()));
    ReleaseJsonOnExit release{*body};
    auto ids = json_opt_int_list(*body, "tokens", "request");
    if (!ids.ok() || !ids->has_value())
      return send_error(res, api_error(Status::InvalidArgument("field 'tokens' must be a list of token ids"), "tokens"));
    if (!tokenizer_) return send_error(res, api_error(Status::NotSupported("this model has no tokenizer")));
    std::vector<int32_t> v((*ids)->begin(), (*ids)->end());
    Status check = tokenizer_->check_ids(v);
    if (!check.ok()) return send_error(res, api_error(check, "tokens"));
    send_json(res, 200, Json{{"prompt", tokenizer_->decode(v)}});
  });

  auto generate = [this](ApiKind kind) {
    return [this, kind](const httplib::Request& req, httplib::Response& res, const std::string& text) {
      auto body = parse_json(text, "request body");
      if (!body.ok()) return send_error(res, api_error(body.status()));
      ReleaseJsonOnExit release{*body};
      auto bodies = split_prompts(kind, *body);
      if (!bodies.ok()) return send_error(res, api_error(bodies.status(), "prompt"));
      struct ReleaseAll {  // the split bodies, freed as the whole one is (release_json)
        std::vector<Json>& docs;
        ~ReleaseAll() {
          for (Json& d : docs) release_json(d);
        }
      } release_parts{*bodies};
      std::vector<const Json*> each;
      for (const Json& b : *bodies) each.push_back(&b);
      if (each.empty()) each.push_back(&*body);
      // One engine request per prompt, their events on one channel; choice i of prompt k is the
      // response's choice k·n + i, as vLLM numbers a batch's choices.
      auto channel = std::make_shared<Channel>();
      auto parts = std::make_shared<std::vector<Part>>();
      std::string request_id;
      auto cancel_all = [this, parts] {
        for (const Part& p : *parts) engine_.cancel(p.id);
      };
      for (size_t k = 0; k < each.size(); ++k) {
        std::string param;
        auto parsed = parse_api_request(kind, format_, *each[k], &param);
        if (!parsed.ok()) return cancel_all(), send_error(res, api_error(parsed.status(), param));
        Part part;
        part.r = std::move(parsed).value();
        const ApiRequest& r = part.r;
        if (!r.model.empty() && r.model != options_.model_name)
          return cancel_all(), send_error(res, ApiError{404, "the model '" + r.model + "' does not exist; this server serves '" +
                                                                 options_.model_name + "'", "not_found_error", "model",
                                                        "model_not_found"});
        if (r.echo && !tokenizer_)
          return cancel_all(), send_error(res, api_error(Status::NotSupported("field 'echo' needs the prompt's text: this "
                                                                              "model has no tokenizer"), "echo"));
        const std::string field = kind == ApiKind::kChat ? "messages" : "prompt";
        auto ids = request_prompt_ids(r, tokenizer_, format_);
        if (!ids.ok()) return cancel_all(), send_error(res, api_error(ids.status(), field));
        RequestSpec spec = r.spec;
        spec.prompt = std::move(ids).value();
        auto room = fit_prompt(r, options_.truncate_prompt, engine_.max_sequence_tokens(), spec.prompt);
        if (!room.ok()) return cancel_all(), send_error(res, api_error(room.status(), field));
        if (r.return_token_ids || r.continuous_usage || r.echo) part.prompt = spec.prompt;
        spec.stop.max_tokens = r.max_tokens.value_or(*room);
        if (!r.seed_given) spec.sampling.seed = std::random_device{}() * 0x100000001ull + std::random_device{}();
        if (kind == ApiKind::kChat && tokenizer_)
          if (auto marker = tokenizer_->special_id(chat_stop_marker(format_))) spec.stop.stop_ids.push_back(*marker);
        // The sink runs on the engine thread for every token: it queues, the waker wakes.
        auto id = engine_.submit(std::move(spec), [channel, waker = waker_](const EngineEvent& e) {
          if (channel->push(e)) waker->wake(channel);
        });
        if (!id.ok()) return cancel_all(), send_error(res, api_error(id.status()));
        part.id = *id;
        if (k == 0) request_id = r.request_id;
        parts->push_back(std::move(part));
      }
      const ApiRequest& first = parts->front().r;
      const std::string prefix = kind == ApiKind::kChat ? "chatcmpl-" : "cmpl-";
      if (request_id.empty() && req.has_header("X-Request-Id")) {
        const std::string header = req.get_header_value("X-Request-Id");
        if (!header.empty() && header.size() <= 128 &&
            std::all_of(header.begin(), header.end(), [](char c) { return c > ' ' && c < 127; }))
          request_id = header;
      }
      const std::string response_id = prefix + (request_id.empty() ? fresh_response_id() : request_id);
      for (Part& p : *parts)
        p.builder = std::make_shared<ResponseBuilder>(p.r, format_, response_id, options_.model_name, tokenizer_, p.prompt);
      ++in_flight_;
      if (!first.stream) {
        // While waiting, a client that hangs up has its requests cancelled (their end events follow).
        Connection* connection = HttpTransport::current();
        bool cancelled = false;
        while (!all_ended(*parts)) {
          for (const EngineEvent& e : channel->take(std::chrono::milliseconds(50))) route(*parts, e);
          if (!all_ended(*parts) && !cancelled && connection && connection->client_gone()) {
            cancel_all();
            cancelled = true;
          }
        }
        --in_flight_;
        const RequestStats stats = summed_stats(*parts);
        const Status failure = first_failure(*parts);
        if (!failure.ok()) {
          log_request(response_id, kind, false, 500, stats, failure.to_string(), first.user);
          return send_error(res, ApiError{500, failure.to_string(), "server_error", "", ""});
        }
        log_request(response_id, kind, false, 200, stats, cancelled ? "cancelled: the client hung up" : "", first.user);
        Json response = (*parts)[0].builder->response((*parts)[0].last.stats);
        for (size_t k = 1; k < parts->size(); ++k) {
          Json more = (*parts)[k].builder->response((*parts)[k].last.stats);
          for (Json& c : more["choices"]) {
            c["index"] = c["index"].get<int64_t>() + static_cast<int64_t>(k) * first.spec.n;
            response["choices"].push_back(std::move(c));
          }
        }
        if (parts->size() > 1) response["usage"] = usage_json(stats);
        return send_json(res, 200, response);
      }
      const bool usage = first.include_usage;
      auto opened = std::make_shared<bool>(false);
      res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider(
          "text/event-stream",
          [parts, channel, usage, opened](size_t, httplib::DataSink& sink) {
            auto write = [&](const std::string& text) { return sink.write(text.data(), text.size()); };
            if (!*opened) {
              *opened = true;
              for (const Part& p : *parts)
                for (const Json& j : p.builder->opening_chunks())
                  if (!write(sse(j))) return false;
            }
            if (!sink.is_writable()) return false;
            for (const EngineEvent& e : channel->take(std::chrono::milliseconds(50)))
              for (const Json& j : route(*parts, e))
                if (!write(sse(j))) return false;
            if (!all_ended(*parts)) return true;
            const Status failure = first_failure(*parts);
            if (!failure.ok()) {
              if (!write(sse(error_json(ApiError{500, failure.to_string(), "server_error", "", ""})))) return false;
            } else if (usage && !write(sse((*parts)[0].builder->usage_chunk(summed_stats(*parts))))) {
              return false;
            }
            if (!write("data: [DONE]\n\n")) return false;
            sink.done();
            return true;
          },
          [this, parts, response_id, kind, cancel_all](bool success) {
            // What the content provider did not see end is cancelled (cancelling an ended request
            // does nothing).
            const bool ended = all_ended(*parts);
            if (!success || !ended) cancel_all();
            const Status failure = first_failure(*parts);
            log_request(response_id, kind, true, 200, summed_stats(*parts),
                        !failure.ok() ? failure.to_string() : !success || !ended ? "cancelled: the client hung up" : "",
                        parts->front().r.user);
            --in_flight_;
          });
    };
  };
  post("/v1/chat/completions", generate(ApiKind::kChat));
  post("/v1/completions", generate(ApiKind::kCompletion));
}

}  // namespace klinear

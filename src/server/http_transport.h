// HttpTransport: cpp-httplib 0.11's Server with klinear's own connections. httplib parses
// requests and writes responses (process_request); klinear owns everything around them, which
// 0.11 has no hooks for (issue 34):
//
//   accept ──> gate thread (epoll) ──complete head──> request threads ──> back to the gate
//              reads every connection's                 (or 2 control threads for GET
//              request line and headers                  /health and /metrics)
//
// - A head (request line and headers) costs no thread while it arrives: the gate reads them all,
//   so slow clients cannot hold the request threads, and /health and /metrics have threads of
//   their own, answered while every request thread is busy.
// - Deadlines are totals, not per read: the head within `header_timeout` of the connection's
//   first wait (a new connection, or the end of the previous response), else 408 (silently closed
//   when nothing came); the body within `body_timeout` of the head, else the request fails
//   (Connection::timed_out). Heads over 64 KiB get 431; a client with more than
//   `max_slow_heads_per_client` heads partly sent gets 429 for the next.
// - A connection keeps its unread bytes between requests: pipelined requests are answered in turn.
// - A client's FIN does not end its request (a half-close still reads the response); see
//   Connection::client_gone.
// - An exception out of a request (std::bad_alloc included) fails that request with 500 and
//   closes its connection; the process and the other requests go on.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace klinear {

struct TransportOptions {
  std::chrono::milliseconds header_timeout{10000};
  std::chrono::milliseconds body_timeout{60000};
  int max_slow_heads_per_client = 16;
  int request_threads = 64;
  std::vector<std::string> control_paths;  // GET paths served by the 2 control threads
  std::function<void(int status)> count;   // called for each reply the transport makes itself
};

// The connection a request thread serves, as its handler sees it (HttpTransport::current()).
class Connection {
 public:
  Connection(int fd, std::string client);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Whether the client went away (closed or reset its end). A FIN alone may be a half-close whose
  // sender still reads: to an HTTP/1.1 client the first FIN is answered with an interim
  // "100 Continue" (which clients skip), and a socket the client closed answers that with a reset,
  // seen by the next call. An HTTP/1.0 client's FIN counts as gone.
  bool client_gone();
  // Whether the request's body missed its deadline.
  bool timed_out() const { return timed_out_; }

 private:
  friend class HttpTransport;
  class Stream;

  int fd_;
  std::string client_;  // the peer's address: slow heads are counted per client
  std::string in_;      // bytes read and not yet consumed
  size_t used_ = 0;     // the consumed prefix of in_
  std::chrono::steady_clock::time_point deadline_;
  bool eof_ = false;            // the client shut down its write side
  bool slow_ = false;           // counted among its client's partly sent heads
  bool http11_ = false;         // the current request is HTTP/1.1 (interim replies allowed)
  bool probed_ = false;         // client_gone sent its probe for this request
  bool timed_out_ = false;
  size_t requests_ = 0;
};

class HttpTransport : public httplib::Server {
 public:
  explicit HttpTransport(TransportOptions options);
  ~HttpTransport() override;

  // The connection whose request the calling thread is serving (in a handler or a content
  // provider), else null.
  static Connection* current();

 private:
  class Gate;
  class Pool;

  // Called by httplib's accept loop (through a task queue that runs it at once): hands the socket
  // to the gate.
  bool process_and_close_socket(socket_t sock) override;
  // Serves the request whose head `c` holds, on a request or control thread; gives the
  // connection back to the gate or closes it.
  void serve(std::unique_ptr<Connection> c);

  TransportOptions options_;
  std::atomic<bool> stopping_{false};
  std::unique_ptr<Pool> requests_, control_;
  std::unique_ptr<Gate> gate_;  // last: destroyed first, it dispatches to the pools
};

}  // namespace klinear

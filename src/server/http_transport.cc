#include "server/http_transport.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <new>
#include <thread>
#include <unordered_map>

#include "server/openai.h"

namespace klinear {

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxHeadBytes = 64 << 10;  // request line and headers; 431 above
constexpr int kControlThreads = 2;
// Waits are cut into slices this long, so a stopping server is not held by a slow client.
constexpr auto kSlice = std::chrono::milliseconds(100);
constexpr auto kWriteTimeout = std::chrono::seconds(5);  // per write: cpp-httplib's default

thread_local Connection* g_current = nullptr;

// A socket address as cpp-httplib writes it into a Request (numeric host, port).
void address_of(int fd, bool peer, std::string& host, int& port) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  const int rc = peer ? getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) : getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  char h[NI_MAXHOST], p[NI_MAXSERV];
  if (rc != 0 || getnameinfo(reinterpret_cast<sockaddr*>(&a), len, h, sizeof(h), p, sizeof(p), NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return;
  host = h;
  port = std::atoi(p);
}

// Polls `fd` for `events` until `deadline`, in slices that stop early once `stopping` is set.
// The revents, or 0 at the deadline (or when stopping).
short wait_for(int fd, short events, Clock::time_point deadline, const std::atomic<bool>& stopping) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0 || stopping) return 0;
    pollfd p{fd, events, 0};
    const int rc = poll(&p, 1, static_cast<int>(std::min(left, std::chrono::milliseconds(kSlice)).count()));
    if (rc > 0) return p.revents;
    if (rc < 0 && errno != EINTR) return POLLERR;
  }
}

// A whole reply the transport makes itself, with Connection: close.
enum class Refusal { kTimeout = 408, kTooMany = 429, kHeadTooLarge = 431, kFailed = 500 };

std::string reply(Refusal refusal, const std::string& message) {
  const int status = static_cast<int>(refusal);
  const char* reason = refusal == Refusal::kTimeout   ? "Request Timeout"
                       : refusal == Refusal::kTooMany ? "Too Many Requests"
                       : refusal == Refusal::kFailed  ? "Internal Server Error"
                                                      : "Request Header Fields Too Large";
  const std::string body =
      error_json(ApiError{status, message, refusal == Refusal::kFailed ? "server_error" : "invalid_request_error", "", ""}).dump();
  return "HTTP/1.1 " + std::to_string(status) + " " + reason +
         "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\nConnection: close\r\n\r\n" + body;
}

std::string seconds(std::chrono::milliseconds t) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", t.count() / 1e3);
  return text;
}

void close_socket(int fd) {
  shutdown(fd, SHUT_RDWR);
  close(fd);
}

}  // namespace

Connection::Connection(int fd, std::string client) : fd_(fd), client_(std::move(client)) {}

Connection::~Connection() { close_socket(fd_); }

bool Connection::client_gone() {
  pollfd p{fd_, POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return true;
  if (!(p.revents & POLLRDHUP) || probed_) return false;
  probed_ = true;
  if (!http11_) return true;
  static const char probe[] = "HTTP/1.1 100 Continue\r\n\r\n";
  return send(fd_, probe, sizeof(probe) - 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0;
}

// The connection as the httplib::Stream that process_request reads the request from (its buffered
// bytes first) and writes the response to. Reads past the buffer end at the connection's deadline.
class Connection::Stream : public httplib::Stream {
 public:
  Stream(Connection& c, const std::atomic<bool>& stopping) : c_(c), stopping_(stopping) {}
  size_t written() const { return written_; }

  bool is_readable() const override {
    return c_.used_ < c_.in_.size() || (wait_for(c_.fd_, POLLIN, c_.deadline_, stopping_) & POLLIN);
  }
  bool is_writable() const override {
    const short r = wait_for(c_.fd_, POLLOUT, Clock::now() + kWriteTimeout, stopping_);
    return (r & POLLOUT) && !(r & (POLLERR | POLLHUP));
  }
  ssize_t read(char* ptr, size_t size) override {
    if (c_.used_ == c_.in_.size()) {
      c_.in_.clear();
      c_.used_ = 0;
      if (c_.eof_) return 0;
      for (;;) {
        if (!wait_for(c_.fd_, POLLIN, c_.deadline_, stopping_)) {
          c_.timed_out_ = !stopping_;
          return -1;
        }
        char chunk[16 << 10];
        const ssize_t n = recv(c_.fd_, chunk, sizeof(chunk), 0);
        if (n == 0) {
          c_.eof_ = true;
          return 0;
        }
        if (n > 0) {
          c_.in_.assign(chunk, static_cast<size_t>(n));
          break;
        }
        if (errno != EAGAIN && errno != EINTR) return -1;
      }
    }
    const size_t n = std::min(size, c_.in_.size() - c_.used_);
    std::memcpy(ptr, c_.in_.data() + c_.used_, n);
    c_.used_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    for (size_t done = 0; done < size;) {
      const ssize_t n = send(c_.fd_, ptr + done, size - done, MSG_NOSIGNAL);
      if (n > 0) {
        done += static_cast<size_t>(n);
        written_ += static_cast<size_t>(n);
      } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
        return -1;
      } else if (!is_writable()) {
        return -1;
      }
    }
    return static_cast<ssize_t>(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override { address_of(c_.fd_, true, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { address_of(c_.fd_, false, ip, port); }
  socket_t socket() const override { return c_.fd_; }

 private:
  Connection& c_;
  const std::atomic<bool>& stopping_;
  size_t written_ = 0;
};

// Threads that serve connections whose heads are complete, first come first served.
class HttpTransport::Pool {
 public:
  Pool(int threads, std::function<void(std::unique_ptr<Connection>)> serve) : serve_(std::move(serve)) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { run(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  void push(std::unique_ptr<Connection> c) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(c));
    }
    cv_.notify_one();
  }

 private:
  void run() {
    for (;;) {
      std::unique_ptr<Connection> c;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (stop_) return;  // the connections still queued close with the pool
        c = std::move(queue_.front());
        queue_.pop_front();
      }
      serve_(std::move(c));
    }
  }

  std::function<void(std::unique_ptr<Connection>)> serve_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Connection>> queue_;  // guarded by mu_
  bool stop_ = false;                              // guarded by mu_
  std::vector<std::thread> threads_;
};

// The thread that reads every connection's head (epoll, non-blocking), enforces the head deadline,
// size and per-client cap, and hands complete heads to the pools.
class HttpTransport::Gate {
 public:
  Gate(const TransportOptions& options, Pool& requests, Pool& control)
      : options_(options), requests_(requests), control_(control), epoll_(epoll_create1(EPOLL_CLOEXEC)),
        wake_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.ptr = nullptr;
    epoll_ctl(epoll_, EPOLL_CTL_ADD, wake_, &e);
    thread_ = std::thread([this] { run(); });
  }
  ~Gate() {
    stop();
    close(wake_);
    close(epoll_);
  }
  // Stops the gate's thread; connections added later wait, and close with the gate.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake();
    if (thread_.joinable()) thread_.join();
  }
  // A new connection, or one whose response was written: its next head is awaited.
  void add(std::unique_ptr<Connection> c) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      inbox_.push_back(std::move(c));
    }
    wake();
  }

 private:
  void wake() {
    const uint64_t one = 1;
    (void)!::write(wake_, &one, sizeof(one));
  }

  void run() {
    epoll_event events[256];
    for (;;) {
      const int n = epoll_wait(epoll_, events, 256, static_cast<int>(kSlice.count()));
      std::vector<std::unique_ptr<Connection>> arrived;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_) return;  // the connections in waiting_ close with the gate
        arrived.swap(inbox_);
      }
      for (auto& c : arrived) {
        Connection* p = c.get();
        p->deadline_ = Clock::now() + options_.header_timeout;
        epoll_event e{};
        e.events = EPOLLIN | EPOLLRDHUP;
        e.data.ptr = p;
        waiting_[p] = std::move(c);
        epoll_ctl(epoll_, EPOLL_CTL_ADD, p->fd_, &e);
        examine(p);  // a pipelined head may already be buffered
      }
      for (int i = 0; i < n; ++i) {
        if (!events[i].data.ptr) {
          uint64_t count;
          (void)!::read(wake_, &count, sizeof(count));
        } else if (waiting_.count(static_cast<Connection*>(events[i].data.ptr))) {
          receive(static_cast<Connection*>(events[i].data.ptr));
        }
      }
      const auto now = Clock::now();
      std::vector<Connection*> late;
      for (auto& [p, c] : waiting_)
        if (p->deadline_ <= now) late.push_back(p);
      for (Connection* p : late) {
        // A connection that sent nothing (an idle keep-alive one) closes without a word.
        if (p->used_ < p->in_.size())
          refuse(p, Refusal::kTimeout, "the request head did not arrive within --header-timeout (" +
                                           seconds(options_.header_timeout) + " s)");
        else
          release(p);
      }
    }
  }

  // Reads what `p` has sent, then examines it.
  void receive(Connection* p) {
    char chunk[16 << 10];
    while (p->in_.size() - p->used_ <= kMaxHeadBytes) {
      const ssize_t n = recv(p->fd_, chunk, sizeof(chunk), MSG_DONTWAIT);
      if (n > 0) {
        p->in_.append(chunk, static_cast<size_t>(n));
        continue;
      }
      if (n == 0) p->eof_ = true;
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno != EAGAIN) {
        release(p);
        return;
      }
      break;
    }
    examine(p);
  }

  // Dispatches a complete head, refuses one too large or from a client with too many slow ones.
  void examine(Connection* p) {
    const size_t end = p->in_.find("\r\n\r\n", p->used_);
    const size_t head = end == std::string::npos ? p->in_.size() - p->used_ : end + 4 - p->used_;
    if (head > kMaxHeadBytes)
      return refuse(p, Refusal::kHeadTooLarge,
                    "the request line and headers are over the limit of " + std::to_string(kMaxHeadBytes) + " bytes");
    if (end != std::string::npos) return dispatch(p);
    if (p->eof_) {  // the client stopped sending before a whole head
      release(p);
      return;
    }
    if (head == 0 || p->slow_) return;
    p->slow_ = true;
    if (++slow_heads_[p->client_] > options_.max_slow_heads_per_client)
      refuse(p, Refusal::kTooMany, "more than " + std::to_string(options_.max_slow_heads_per_client) +
                         " connections from this client are sending request heads slowly (--max-slow-connections-per-client)");
  }

  void dispatch(Connection* p) {
    std::unique_ptr<Connection> c = release(p);
    const std::string_view line(c->in_.data() + c->used_, c->in_.find("\r\n", c->used_) - c->used_);
    c->http11_ = line.ends_with(" HTTP/1.1");
    c->probed_ = false;
    c->timed_out_ = false;
    c->deadline_ = Clock::now() + options_.body_timeout;
    const std::string_view target = line.substr(0, line.find(' ', line.find(' ') + 1));
    const bool control = target.starts_with("GET ") && [&] {
      const std::string_view path = target.substr(4, target.find('?') - 4);
      for (const std::string& p : options_.control_paths)
        if (path == p) return true;
      return false;
    }();
    (control ? control_ : requests_).push(std::move(c));
  }

  // Answers `refusal` with `message` and closes the connection.
  void refuse(Connection* p, Refusal refusal, const std::string& message) {
    std::unique_ptr<Connection> c = release(p);
    const std::string r = reply(refusal, message);
    (void)!send(c->fd_, r.data(), r.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (options_.count) options_.count(static_cast<int>(refusal));
  }

  // Takes `p` out of the gate's care (uncounted, off epoll); the connection closes unless the
  // caller keeps what this returns.
  std::unique_ptr<Connection> release(Connection* p) {
    epoll_ctl(epoll_, EPOLL_CTL_DEL, p->fd_, nullptr);
    if (p->slow_ && --slow_heads_[p->client_] == 0) slow_heads_.erase(p->client_);
    p->slow_ = false;
    auto it = waiting_.find(p);
    std::unique_ptr<Connection> c = std::move(it->second);
    waiting_.erase(it);
    return c;
  }

  const TransportOptions& options_;
  Pool& requests_;
  Pool& control_;
  int epoll_, wake_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Connection>> inbox_;  // guarded by mu_
  bool stop_ = false;                               // guarded by mu_
  std::unordered_map<Connection*, std::unique_ptr<Connection>> waiting_;  // the gate thread's
  std::map<std::string, int> slow_heads_;           // by client; the gate thread's
  std::thread thread_;
};

namespace {

// cpp-httplib's accept loop hands each socket to a task queue; this one runs the task at once on
// the accept thread, where process_and_close_socket passes the socket to the gate.
class AtOnce : public httplib::TaskQueue {
 public:
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override {}
};

}  // namespace

HttpTransport::HttpTransport(TransportOptions options) : options_(std::move(options)) {
  new_task_queue = [] { return new AtOnce; };
  auto serve = [this](std::unique_ptr<Connection> c) { this->serve(std::move(c)); };
  requests_ = std::make_unique<Pool>(options_.request_threads, serve);
  control_ = std::make_unique<Pool>(kControlThreads, serve);
  gate_ = std::make_unique<Gate>(options_, *requests_, *control_);
}

HttpTransport::~HttpTransport() {
  // The gate stops dispatching, then the pools' threads end (their waits see stopping_), then the
  // connections still with the gate close.
  stopping_ = true;
  gate_->stop();
  requests_.reset();
  control_.reset();
  gate_.reset();
}

Connection* HttpTransport::current() { return g_current; }

bool HttpTransport::process_and_close_socket(socket_t sock) {
  fcntl(sock, F_SETFL, fcntl(sock, F_GETFL) | O_NONBLOCK);
  std::string client;
  int port = 0;
  address_of(sock, true, client, port);
  gate_->add(std::make_unique<Connection>(sock, std::move(client)));
  return true;
}

void HttpTransport::serve(std::unique_ptr<Connection> c) {
  Connection::Stream stream(*c, stopping_);
  const bool last = ++c->requests_ >= keep_alive_max_count_;
  bool closed = false, written = false;
  g_current = c.get();
  try {
    written = process_request(stream, last, closed, nullptr);
  } catch (const std::exception& e) {
    // Outside the handler (httplib catches those): the response could not be made or written.
    // If none of it went out, the client still learns the request failed.
    const bool oom = dynamic_cast<const std::bad_alloc*>(&e) != nullptr;
    if (stream.written() == 0) {
      const std::string r = reply(Refusal::kFailed, oom ? "the server ran out of memory serving this request" : e.what());
      stream.write(r.data(), r.size());
      if (options_.count) options_.count(500);
    }
  }
  g_current = nullptr;
  if (!written || closed || last || c->timed_out_ || stopping_ || (c->eof_ && c->used_ == c->in_.size())) return;
  gate_->add(std::move(c));
}

}  // namespace klinear

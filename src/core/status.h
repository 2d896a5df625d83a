// Status and Result<T>: how errors that come from outside (files, config, CLI, HTTP) travel.
//
// A Status is a small value: OK, or a code plus a message that names the thing that is wrong, what
// was expected and what was found. Our code never throws; adapters around throwing libraries catch
// and return a Status. Broken invariants (our own bugs) use KL_CHECK in check.h instead.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "core/check.h"

namespace klinear {

enum class StatusCode {
  kOk = 0,
  kNotFound,
  kCorruption,
  kNotSupported,
  kInvalidArgument,
  kIOError,
  kResourceExhausted,
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status Corruption(std::string m) { return {StatusCode::kCorruption, std::move(m)}; }
  static Status NotSupported(std::string m) { return {StatusCode::kNotSupported, std::move(m)}; }
  static Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status IOError(std::string m) { return {StatusCode::kIOError, std::move(m)}; }
  static Status ResourceExhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "Corruption: model.safetensors: header length 99999 exceeds file size 1024"
  std::string to_string() const;
  // The same status with `prefix: ` in front of the message (adds context on the way up).
  Status with_context(const std::string& prefix) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Result<T>: a T or a non-OK Status. Accessing value() of an error aborts (a bug, not input).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}
  Result(Status status) : v_(std::move(status)) {
    KL_CHECK(!std::get<Status>(v_).ok(), "Result built from an OK status without a value");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & {
    KL_CHECK(ok(), "value() of an error Result: " + std::get<Status>(v_).to_string());
    return std::get<T>(v_);
  }
  const T& value() const& {
    KL_CHECK(ok(), "value() of an error Result: " + std::get<Status>(v_).to_string());
    return std::get<T>(v_);
  }
  T&& value() && {
    KL_CHECK(ok(), "value() of an error Result: " + std::get<Status>(v_).to_string());
    return std::get<T>(std::move(v_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace klinear

#define KL_CONCAT_INNER(a, b) a##b
#define KL_CONCAT(a, b) KL_CONCAT_INNER(a, b)

// Return the status from the enclosing function if `expr` (a Status) is not OK.
#define KL_RETURN_IF_ERROR(expr)            \
  do {                                      \
    ::klinear::Status kl_status_ = (expr);  \
    if (!kl_status_.ok()) return kl_status_; \
  } while (0)

// `KL_ASSIGN_OR_RETURN(auto x, f())`: unwrap a Result or return its status.
#define KL_ASSIGN_OR_RETURN(lhs, expr) KL_ASSIGN_OR_RETURN_IMPL(KL_CONCAT(kl_result_, __LINE__), lhs, expr)
#define KL_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()

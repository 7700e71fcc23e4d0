// common/status.h — errors as values across module boundaries.
//
// `Status` carries a code and a message; `Result<T>` carries a value or a
// non-OK Status. Everything that can fail for reasons outside the program
// (bad input, I/O, a lost peer, an exhausted pool) returns one of these.
// Broken invariants use BATON_CHECK (common/check.h) instead.
#pragma once

#include <cassert>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace baton {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,    // the caller passed something malformed
  kNotFound,           // a named thing (file, weight, key) does not exist
  kOutOfRange,         // an index or size outside what is allowed
  kDataLoss,           // a file or message is corrupt or truncated
  kUnimplemented,      // a feature we recognise but deliberately do not support
  kResourceExhausted,  // out of KV blocks, queue full
  kIoError,            // the OS said no
  kDeadlineExceeded,   // a bounded wait ran out
  kUnavailable,        // a peer is gone or not ready
  kAborted,            // cancelled by the caller
  kInternal,           // a bug, reported instead of crashing
};

std::string_view status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return Status(); }

  bool is_ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "CODE: message", for logs and error lines.
  std::string to_string() const;

  // Prepends context ("loading model.safetensors: ") to the message.
  Status with_context(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status out_of_range(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status data_loss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status resource_exhausted(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status io_error(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
inline Status deadline_exceeded(std::string m) {
  return {StatusCode::kDeadlineExceeded, std::move(m)};
}
inline Status unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status internal_error(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// A value or an error. Accessing the value of an error is a bug (asserts).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : data_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : data_(std::move(status)) {  // NOLINT
    assert(!std::get<Status>(data_).is_ok() && "Result built from an OK Status");
  }

  bool is_ok() const { return std::holds_alternative<T>(data_); }
  explicit operator bool() const { return is_ok(); }

  const Status& status() const {
    static const Status kOk;
    return is_ok() ? kOk : std::get<Status>(data_);
  }
  T& value() & {
    assert(is_ok());
    return std::get<T>(data_);
  }
  const T& value() const& {
    assert(is_ok());
    return std::get<T>(data_);
  }
  T&& value() && {
    assert(is_ok());
    return std::get<T>(std::move(data_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> data_;
};

}  // namespace baton

#define BATON_CONCAT_INNER_(a, b) a##b
#define BATON_CONCAT_(a, b) BATON_CONCAT_INNER_(a, b)

// Returns the Status from the enclosing function if `expr` is not OK.
#define BATON_RETURN_IF_ERROR(expr)                   \
  do {                                                \
    ::baton::Status baton_status_ = (expr);           \
    if (!baton_status_.is_ok()) return baton_status_; \
  } while (0)

// `BATON_ASSIGN_OR_RETURN(auto x, make_x());` declares x from a Result or
// returns its Status.
#define BATON_ASSIGN_OR_RETURN(lhs, expr) \
  BATON_ASSIGN_OR_RETURN_IMPL_(BATON_CONCAT_(baton_result_, __LINE__), lhs, expr)
#define BATON_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.is_ok()) return tmp.status();             \
  lhs = std::move(tmp).value()

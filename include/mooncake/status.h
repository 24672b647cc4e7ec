// Status and Result<T>: the one error convention of the C++ core.
//
// Codes are chosen by what the caller should do next (abseil-style):
//   kInvalidArgument    fix the arguments; retrying the same call fails again
//   kNotFound           the named thing (segment, buffer, batch) does not exist
//   kAlreadyExists      e.g. overlapping registration
//   kFailedPrecondition fix the state first (free a busy batch, unregister in-use memory)
//   kUnavailable        transient: peer unreachable, connection broken; retry may succeed
//   kDeadlineExceeded   the operation ran past its deadline
//   kResourceExhausted  a capacity limit (batch full, too many connections)
//   kUnimplemented      not built into this binary (a transport without its SDK)
//   kPermissionDenied   the peer refused us (authentication, range not registered for remote access)
//   kDataLoss           the wire carried something malformed
//   kInternal           a bug; please report
// An OK status holds no allocation. Thread-compatible (like std::string).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>

namespace mooncake {

class [[nodiscard]] Status {
 public:
  enum class Code : int {
    kOk = 0,
    kInvalidArgument = 1,
    kNotFound = 2,
    kAlreadyExists = 3,
    kFailedPrecondition = 4,
    kUnavailable = 5,
    kDeadlineExceeded = 6,
    kResourceExhausted = 7,
    kUnimplemented = 8,
    kPermissionDenied = 9,
    kDataLoss = 10,
    kInternal = 11,
  };

  Status() = default;
  Status(Code code, std::string message);
  Status(const Status& other);
  Status& operator=(const Status& other);
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;

  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string m) { return {Code::kInvalidArgument, std::move(m)}; }
  static Status NotFound(std::string m) { return {Code::kNotFound, std::move(m)}; }
  static Status AlreadyExists(std::string m) { return {Code::kAlreadyExists, std::move(m)}; }
  static Status FailedPrecondition(std::string m) {
    return {Code::kFailedPrecondition, std::move(m)};
  }
  static Status Unavailable(std::string m) { return {Code::kUnavailable, std::move(m)}; }
  static Status DeadlineExceeded(std::string m) {
    return {Code::kDeadlineExceeded, std::move(m)};
  }
  static Status ResourceExhausted(std::string m) {
    return {Code::kResourceExhausted, std::move(m)};
  }
  static Status Unimplemented(std::string m) { return {Code::kUnimplemented, std::move(m)}; }
  static Status PermissionDenied(std::string m) {
    return {Code::kPermissionDenied, std::move(m)};
  }
  static Status DataLoss(std::string m) { return {Code::kDataLoss, std::move(m)}; }
  static Status Internal(std::string m) { return {Code::kInternal, std::move(m)}; }

  bool ok() const { return rep_ == nullptr; }
  Code code() const { return rep_ ? rep_->code : Code::kOk; }
  // The message without the code name; empty when OK.
  const std::string& message() const;
  // "InvalidArgument: <message>" or "OK".
  std::string ToString() const;
  // Returns a copy whose message is "<prefix>: <message>"; OK stays OK.
  Status WithContext(const std::string& prefix) const;

  bool IsInvalidArgument() const { return code() == Code::kInvalidArgument; }
  bool IsNotFound() const { return code() == Code::kNotFound; }
  bool IsUnavailable() const { return code() == Code::kUnavailable; }
  bool IsDeadlineExceeded() const { return code() == Code::kDeadlineExceeded; }
  bool IsFailedPrecondition() const { return code() == Code::kFailedPrecondition; }

 private:
  struct Rep {
    Code code;
    std::string message;
  };
  std::unique_ptr<Rep> rep_;
};

const char* CodeName(Status::Code code);

// Result<T>: a value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  // A Result holds a value or an error: built from an OK Status it holds Internal.
  Result(Status status)  // NOLINT: implicit by design
      : status_(status.ok() ? Status::Internal("Result built from an OK Status without a value")
                            : std::move(status)) {}
  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() { return *value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace mooncake

#define MC_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::mooncake::Status _mc_s = (expr);       \
    if (!_mc_s.ok()) return _mc_s;           \
  } while (0)

#define MC_CONCAT_INNER(a, b) a##b
#define MC_CONCAT(a, b) MC_CONCAT_INNER(a, b)
#define MC_ASSIGN_OR_RETURN(lhs, expr) \
  MC_ASSIGN_OR_RETURN_IMPL(MC_CONCAT(_mc_r_, __LINE__), lhs, expr)
#define MC_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()

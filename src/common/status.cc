#include "mooncake/status.h"

namespace mooncake {

Status::Status(Code code, std::string message) {
  if (code != Code::kOk) rep_ = std::make_unique<Rep>(Rep{code, std::move(message)});
}

Status::Status(const Status& other)
    : rep_(other.rep_ ? std::make_unique<Rep>(*other.rep_) : nullptr) {}

Status& Status::operator=(const Status& other) {
  if (this != &other) rep_ = other.rep_ ? std::make_unique<Rep>(*other.rep_) : nullptr;
  return *this;
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return rep_ ? rep_->message : kEmpty;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(CodeName(rep_->code)) + ": " + rep_->message;
}

Status Status::WithContext(const std::string& prefix) const {
  if (ok()) return Status();
  return Status(rep_->code, prefix + ": " + rep_->message);
}

const char* CodeName(Status::Code code) {
  switch (code) {
    case Status::Code::kOk: return "OK";
    case Status::Code::kInvalidArgument: return "InvalidArgument";
    case Status::Code::kNotFound: return "NotFound";
    case Status::Code::kAlreadyExists: return "AlreadyExists";
    case Status::Code::kFailedPrecondition: return "FailedPrecondition";
    case Status::Code::kUnavailable: return "Unavailable";
    case Status::Code::kDeadlineExceeded: return "DeadlineExceeded";
    case Status::Code::kResourceExhausted: return "ResourceExhausted";
    case Status::Code::kUnimplemented: return "Unimplemented";
    case Status::Code::kPermissionDenied: return "PermissionDenied";
    case Status::Code::kDataLoss: return "DataLoss";
    case Status::Code::kInternal: return "Internal";
  }
  return "Unknown";
}

}  // namespace mooncake

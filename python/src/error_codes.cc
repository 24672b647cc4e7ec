#include "error_codes.h"

namespace mooncake {
namespace pyapi {

int ToUpstreamCode(const Status& status) {
  using Code = Status::Code;
  switch (status.code()) {
    case Code::kOk: return 0;
    case Code::kInvalidArgument: return kErrInvalidArgument;
    case Code::kNotFound: return kErrAddressNotRegistered;
    case Code::kAlreadyExists: return kErrAddressOverlapped;
    case Code::kFailedPrecondition: return kErrBatchBusy;
    case Code::kResourceExhausted: return kErrTooManyRequests;
    case Code::kUnavailable: return kErrSocket;
    case Code::kDeadlineExceeded: return kErrSocket;
    case Code::kDataLoss: return kErrMalformedJson;
    case Code::kPermissionDenied: return kErrRejectHandshake;
    case Code::kUnimplemented: return kErrNotImplemented;
    case Code::kInternal: return kErrInvalidArgument;
  }
  return kErrInvalidArgument;
}

}  // namespace pyapi
}  // namespace mooncake

// Upstream Mooncake's integer error codes (its include/error.h), and the one mapping from our
// Status codes to them. Only the Python layer speaks these integers; the C++ core returns
// Status (see include/mooncake/status.h).
#pragma once

#include "mooncake/status.h"

namespace mooncake {
namespace pyapi {

constexpr int kErrInvalidArgument = -1;
constexpr int kErrTooManyRequests = -2;
constexpr int kErrAddressNotRegistered = -3;
constexpr int kErrBatchBusy = -4;
constexpr int kErrDeviceNotFound = -6;
constexpr int kErrAddressOverlapped = -7;
constexpr int kErrDns = -101;
constexpr int kErrSocket = -102;
constexpr int kErrMalformedJson = -103;
constexpr int kErrRejectHandshake = -104;
constexpr int kErrMetadata = -200;
constexpr int kErrEndpoint = -201;
constexpr int kErrNotImplemented = -303;

// Status code -> upstream code, used by the methods documented as returning "an error code"
// (register/unregister, send_probe). Transfer methods return -1 on every failure, as upstream.
//   OK                  0
//   InvalidArgument    -1    ERR_INVALID_ARGUMENT (null address, zero length, bad name, ...)
//   NotFound           -3    ERR_ADDRESS_NOT_REGISTERED (not the start of a registered buffer)
//   AlreadyExists      -7    ERR_ADDRESS_OVERLAPPED (overlaps a registered buffer)
//   FailedPrecondition -4    ERR_BATCH_BUSY (a batch or buffer still has transfers in flight)
//   ResourceExhausted  -2    ERR_TOO_MANY_REQUESTS
//   Unavailable      -102    ERR_SOCKET (peer unreachable; upstream's send_probe gives -102 too)
//   DeadlineExceeded -102    ERR_SOCKET (peer did not answer in time)
//   DataLoss         -103    ERR_MALFORMED_JSON (peer sent something malformed)
//   PermissionDenied -104    ERR_REJECT_HANDSHAKE
//   Unimplemented    -303    ERR_NOT_IMPLEMENTED (not built into this engine)
//   Internal           -1
int ToUpstreamCode(const Status& status);

}  // namespace pyapi
}  // namespace mooncake

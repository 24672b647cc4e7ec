// The master's HTTP endpoints (served on --metrics_port by MetricsServer): the read-only ones
// of upstream's master, in upstream's formats. None changes state: /query_key and
// /batch_query_keys grant no lease (upstream's do) and count as no access.
//
//   GET /metrics            Prometheus text (MasterService::MetricsText)
//   GET /metrics/summary    one line: role, state, storage, keys, clients, segments
//   GET /health             {"status":"ok","role":"leader","ha_state":"serving","service_ready":true}
//   GET /role, /ha_status   "leader", "serving" (this master has no HA: it always serves)
//   GET /get_all_keys       keys of complete objects, one per line
//   GET /get_all_segments   names of the mounted segments, one per line (mount order)
//   GET /query_segment?segment=NAME
//                           "NAME\nUsed(bytes): U\nCapacity(bytes) : C\n" (summed over the
//                           segments mounted under NAME); 404 when none is
//   GET /query_key?key=K    {"success":true,"data":[{"size_","buffer_address_","protocol_",
//                           "transport_endpoint_"}...]} per complete replica; 404
//                           {"success":false,"error_code":-704,"error_message":"OBJECT_NOT_FOUND"}
//   GET /batch_query_keys?keys=K1,K2,...
//                           {"success":true,"data":{"K1":{"ok":true,"values":[...]},
//                           "K2":{"ok":false,"error":"OBJECT_NOT_FOUND"}}}
// Query values are percent-decoded ('+' is a space); keys= is split at ',' after decoding,
// as upstream. "protocol_" is "tcp": the master does not know which transport a reader will
// use (the engine picks tcp or the same-host path per peer).
//
// Bounds: a listing holds at most kMaxListed entries and kMaxListedBytes bytes; a cut listing
// says so in the headers X-Mooncake-Truncated: true and X-Mooncake-Total-Count: <all>.
// A bad query (no key, a key over kMaxKeyBytes, over kMaxBatchItems keys, bad percent-
// encoding) is 400 with a message; other paths 404 with the list of endpoints.
#pragma once

#include <cstddef>
#include <string>

#include "store/master_service.h"
#include "store/metrics_server.h"

namespace mooncake {
namespace store {

constexpr size_t kMaxListed = 100000;
constexpr size_t kMaxListedBytes = 16 << 20;

// The reply to GET `target` (path and query as sent). Thread-safe (MasterService is).
HttpReply ServeMasterHttp(MasterService& master, const std::string& target);

}  // namespace store
}  // namespace mooncake

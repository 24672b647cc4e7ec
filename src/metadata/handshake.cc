#include "metadata/handshake.h"

#include <endian.h>
#include <fcntl.h>
#include <glog/logging.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/auth.h"

namespace mooncake {

const char* HandshakeTypeName(HandshakeType t) {
  switch (t) {
    case HandshakeType::kConnection: return "Connection";
    case HandshakeType::kMetadata: return "Metadata";
    case HandshakeType::kNotify: return "Notify";
    case HandshakeType::kProbe: return "Probe";
  }
  return "Unknown";
}

std::string EncodeHandshakeFrame(HandshakeType type, std::string_view payload) {
  std::string out(9 + payload.size(), '\0');
  uint64_t len = htole64(payload.size() + 1);
  std::memcpy(out.data(), &len, 8);
  out[8] = static_cast<char>(type);
  std::memcpy(out.data() + 9, payload.data(), payload.size());
  return out;
}

Status CheckHandshakeLength(uint64_t length, size_t max_length) {
  if (length == 0) return Status::DataLoss("handshake frame of length 0");
  if (length > max_length) {
    return Status::DataLoss("handshake frame of " + std::to_string(length) +
                            " bytes exceeds the limit of " + std::to_string(max_length) +
                            " (MC_HANDSHAKE_MAX_LENGTH)");
  }
  return Status::OK();
}

Result<HandshakeFrame> DecodeHandshakeBody(std::string_view body) {
  if (body.empty()) return Status::DataLoss("handshake frame body is empty");
  HandshakeFrame f;
  auto first = static_cast<uint8_t>(body[0]);
  if (first == 0xfe || first == 0xff) {
    return Status::DataLoss("handshake frame has the reserved type byte " + std::to_string(first));
  }
  if (first > 3) {
    f.legacy = true;  // no type byte: the body is the JSON of a Connection request
    f.type = HandshakeType::kConnection;
    f.payload.assign(body.data(), body.size());
  } else {
    f.type = static_cast<HandshakeType>(first);
    f.payload.assign(body.data() + 1, body.size() - 1);
  }
  return f;
}

Result<HandshakeFrame> DecodeHandshakeFrame(std::string_view bytes, size_t max_length) {
  if (bytes.size() < 8) return Status::DataLoss("handshake frame shorter than its length prefix");
  uint64_t len = 0;
  std::memcpy(&len, bytes.data(), 8);
  len = le64toh(len);
  MC_RETURN_IF_ERROR(CheckHandshakeLength(len, max_length));
  if (bytes.size() - 8 < len) return Status::DataLoss("handshake frame truncated");
  return DecodeHandshakeBody(bytes.substr(8, len));
}

Result<HandshakeFrame> ReadHandshakeFrame(int fd, size_t max_length, int timeout_ms) {
  uint64_t len = 0;
  MC_RETURN_IF_ERROR(ReadFull(fd, &len, 8, timeout_ms));
  len = le64toh(len);
  MC_RETURN_IF_ERROR(CheckHandshakeLength(len, max_length));
  std::string body(len, '\0');
  MC_RETURN_IF_ERROR(ReadFull(fd, body.data(), len, timeout_ms));
  return DecodeHandshakeBody(body);
}

Result<std::string> HandshakeCall(const std::string& host, uint16_t port,
                                  const std::string& segment, HandshakeType type,
                                  std::string_view payload, const HandshakeLimits& limits) {
  std::string where = "handshake " + std::string(HandshakeTypeName(type)) + " to " +
                      HostPort{host, port, true}.ToString();
  auto fd = ConnectTcp(host, port, limits.connect_timeout_ms);
  if (!fd.ok()) return fd.status().WithContext(where);
  MC_RETURN_IF_ERROR(Authenticator(limits.auth_secret)
                         .Answer(fd->get(), "handshake", segment, limits.io_timeout_ms)
                         .WithContext(where));
  std::string frame = EncodeHandshakeFrame(type, payload);
  MC_RETURN_IF_ERROR(
      WriteFull(fd->get(), frame.data(), frame.size(), limits.io_timeout_ms).WithContext(where));
  auto reply = ReadHandshakeFrame(fd->get(), limits.max_length, limits.io_timeout_ms);
  if (!reply.ok()) return reply.status().WithContext(where);
  if (reply->type != type) {
    return Status::DataLoss(where + ": reply has type " + HandshakeTypeName(reply->type));
  }
  return std::move(reply->payload);
}

HandshakeServer::HandshakeServer(HandshakeLimits limits) : limits_(std::move(limits)) {}

HandshakeServer::~HandshakeServer() { Stop(); }

Status HandshakeServer::Start(UniqueFd listen_fd, Handler handler,
                              std::vector<std::string> own_names) {
  handler_ = std::move(handler);
  own_names_ = std::move(own_names);
  ConnLimits cl;
  cl.max_connections = limits_.max_connections;
  cl.max_per_address = limits_.max_per_address;
  cl.first_frame_timeout_ms = limits_.first_frame_timeout_ms;
  server_ = std::make_unique<ConnServer>("handshake server", cl, [this](int fd) { Serve(fd); });
  return server_->Start(std::move(listen_fd));
}

void HandshakeServer::Stop() {
  if (server_) server_->Stop();
}

ConnCounters HandshakeServer::counters() const {
  return server_ ? server_->counters() : ConnCounters{};
}

void HandshakeServer::Serve(int fd) {
  // Authentication and the first frame share one deadline; ConnServer closes the
  // connection at that deadline too, should a read outlast it.
  const auto start = std::chrono::steady_clock::now();
  Status auth = Authenticator(limits_.auth_secret)
                    .Challenge(fd, "handshake", own_names_, limits_.first_frame_timeout_ms);
  if (!auth.ok()) {
    // At most one line per 10 s: a flood of bad peers must not flood the log.
    LOG_EVERY_T(WARNING, 10) << "handshake: refused a connection: " << auth.ToString();
    return;
  }
  int left = limits_.first_frame_timeout_ms -
             static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                  std::chrono::steady_clock::now() - start)
                                  .count());
  auto request = ReadHandshakeFrame(fd, limits_.max_length, left < 1 ? 1 : left);
  if (!request.ok()) {
    VLOG(1) << "handshake: dropping connection: " << request.status().ToString();
    return;
  }
  ConnServer::MarkEstablished();
  auto reply = handler_(*request);
  if (!reply.ok()) {
    LOG(WARNING) << "handshake " << HandshakeTypeName(request->type)
                 << " request refused: " << reply.status().ToString();
    return;
  }
  std::string frame;
  if (request->legacy) {
    uint64_t len = htole64(reply->size());
    frame.assign(reinterpret_cast<const char*>(&len), 8);
    frame += *reply;
  } else {
    frame = EncodeHandshakeFrame(request->type, *reply);
  }
  Status s = WriteFull(fd, frame.data(), frame.size(), limits_.io_timeout_ms);
  if (!s.ok()) {
    VLOG(1) << "handshake reply: " << s.ToString();
    return;
  }
  ::shutdown(fd, SHUT_WR);
  // Wait (bounded) for the client's EOF so that it reads the whole reply before we close.
  char sink[256];
  pollfd p{fd, POLLIN, 0};
  for (int i = 0; i < 16 && ::poll(&p, 1, 1000) > 0; ++i) {
    if (::recv(fd, sink, sizeof(sink), 0) <= 0) break;
  }
}

}  // namespace mooncake

#include "metadata/stores/redis_store.h"

#include <hiredis/hiredis.h>
#include <sys/time.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace mooncake {
namespace {

timeval ToTimeval(int ms) {
  timeval tv;
  tv.tv_sec = ms / 1000;
  tv.tv_usec = (ms % 1000) * 1000;
  return tv;
}

bool StartsWith(const std::string& s, const char* prefix) {
  return s.compare(0, std::strlen(prefix), prefix) == 0;
}

// An error reply ("-ERR ...", "-WRONGPASS ...") as a Status.
Status ErrorReplyStatus(const std::string& m, const std::string& reply) {
  if (StartsWith(reply, "NOAUTH") || StartsWith(reply, "WRONGPASS") ||
      StartsWith(reply, "NOPERM") || reply.find("invalid password") != std::string::npos ||
      reply.find("invalid username-password") != std::string::npos) {
    return Status::PermissionDenied(m);
  }
  if (StartsWith(reply, "LOADING") || StartsWith(reply, "BUSY") ||
      StartsWith(reply, "MASTERDOWN") || StartsWith(reply, "TRYAGAIN") ||
      StartsWith(reply, "CLUSTERDOWN")) {
    return Status::Unavailable(m);
  }
  if (reply.find("DB index") != std::string::npos) return Status::InvalidArgument(m);
  return Status::FailedPrecondition(m);
}

}  // namespace

struct RedisStore::Reply {
  int type = 0;
  std::string str;
};

Result<std::unique_ptr<MetadataStore>> RedisStore::Create(const HostPort& address,
                                                          const StoreOptions& options) {
  if (options.redis_db_index < 0 || options.redis_db_index > 255) {
    return Status::InvalidArgument("redis " + address.ToString() + ": database index " +
                                   std::to_string(options.redis_db_index) +
                                   " is not in [0, 255] (MC_REDIS_DB_INDEX)");
  }
  std::unique_ptr<RedisStore> store(new RedisStore(address, options));
  {
    std::lock_guard<std::mutex> lock(store->mu_);
    MC_RETURN_IF_ERROR(store->ConnectLocked());
  }
  return std::unique_ptr<MetadataStore>(std::move(store));
}

RedisStore::RedisStore(const HostPort& address, const StoreOptions& options)
    : address_(address), options_(options), where_("redis " + address.ToString()) {}

RedisStore::~RedisStore() {
  std::lock_guard<std::mutex> lock(mu_);
  DisconnectLocked();
}

std::string RedisStore::Describe() const { return "redis://" + address_.ToString(); }

void RedisStore::DisconnectLocked() {
  if (ctx_) redisFree(ctx_);
  ctx_ = nullptr;
}

Status RedisStore::ConnectLocked() {
  DisconnectLocked();
  ctx_ = redisConnectWithTimeout(address_.host.c_str(), address_.port,
                                 ToTimeval(options_.connect_timeout_ms));
  if (!ctx_) return Status::ResourceExhausted(where_ + ": cannot allocate a redis context");
  if (ctx_->err) {
    Status s = Status::Unavailable(where_ + ": connect: " + ctx_->errstr);
    DisconnectLocked();
    return s;
  }
  if (redisSetTimeout(ctx_, ToTimeval(options_.request_timeout_ms)) != REDIS_OK) {
    Status s = Status::Unavailable(where_ + ": setting the command timeout failed: " +
                                   ctx_->errstr);
    DisconnectLocked();
    return s;
  }
  if (!options_.redis_password.empty()) {
    std::vector<std::string> auth = {"AUTH"};
    if (!options_.redis_username.empty()) auth.push_back(options_.redis_username);
    auth.push_back(options_.redis_password);
    auto r = RunLocked(auth);
    if (!r.ok()) {
      DisconnectLocked();
      // "redis h:p: AUTH: WRONGPASS ..." -> "redis h:p: AUTH failed: WRONGPASS ..."
      std::string m = r.status().message();
      size_t at = m.find(": AUTH: ");
      if (at != std::string::npos) m.replace(at, 8, ": AUTH failed: ");
      return Status(r.status().code(), m);
    }
  }
  if (options_.redis_db_index != 0) {
    auto r = RunLocked({"SELECT", std::to_string(options_.redis_db_index)});
    if (!r.ok()) {
      DisconnectLocked();
      return r.status().WithContext("SELECT " + std::to_string(options_.redis_db_index));
    }
  }
  // Proves that the server serves us (a server with requirepass and no AUTH says NOAUTH).
  auto r = RunLocked({"PING"});
  if (!r.ok()) {
    DisconnectLocked();
    Status s = r.status();
    if (s.code() == Status::Code::kPermissionDenied && options_.redis_password.empty()) {
      return Status::PermissionDenied(s.message() + " (set MC_REDIS_PASSWORD)");
    }
    return s;
  }
  return Status::OK();
}

Result<RedisStore::Reply> RedisStore::RunLocked(const std::vector<std::string>& args) {
  std::vector<const char*> argv;
  std::vector<size_t> argvlen;
  for (const auto& a : args) {
    argv.push_back(a.data());
    argvlen.push_back(a.size());
  }
  auto* raw = static_cast<redisReply*>(
      redisCommandArgv(ctx_, int(argv.size()), argv.data(), argvlen.data()));
  if (!raw) {
    // The connection is unusable after any context error; it is remade on the next call.
    std::string err = ctx_->errstr;
    int code = ctx_->err;
    int saved_errno = errno;
    DisconnectLocked();
    if (code == REDIS_ERR_IO && (saved_errno == EAGAIN || saved_errno == EWOULDBLOCK ||
                                 err.find("temporarily unavailable") != std::string::npos)) {
      // Unavailable like the other stores' timeouts; not retried, to keep the bound.
      return Status::Unavailable(where_ + ": " + args[0] + ": timed out: no reply within " +
                                 std::to_string(options_.request_timeout_ms) + " ms");
    }
    broken_ = true;
    return Status::Unavailable(where_ + ": " + args[0] + ": connection broken: " + err);
  }
  Reply reply;
  reply.type = raw->type;
  if (raw->str) reply.str.assign(raw->str, raw->len);
  freeReplyObject(raw);
  if (reply.type == REDIS_REPLY_ERROR) {
    return ErrorReplyStatus(where_ + ": " + args[0] + ": " + reply.str, reply.str);
  }
  return reply;
}

Result<RedisStore::Reply> RedisStore::Command(const std::vector<std::string>& args) {
  std::lock_guard<std::mutex> lock(mu_);
  const bool had_connection = ctx_ != nullptr;
  if (!ctx_) MC_RETURN_IF_ERROR(ConnectLocked());
  broken_ = false;
  auto r = RunLocked(args);
  // A connection that broke while idle (server restarted, idle timeout): remake it once.
  if (!r.ok() && broken_ && had_connection) {
    MC_RETURN_IF_ERROR(ConnectLocked());
    r = RunLocked(args);
  }
  return r;
}

Result<std::string> RedisStore::Get(const std::string& key) {
  MC_ASSIGN_OR_RETURN(Reply reply, Command({"GET", key}));
  if (reply.type == REDIS_REPLY_NIL) return Status::NotFound(where_ + ": no key '" + key + "'");
  if (reply.type != REDIS_REPLY_STRING) {
    return Status::DataLoss(where_ + ": GET '" + key + "': unexpected reply type " +
                            std::to_string(reply.type));
  }
  return std::move(reply.str);
}

Status RedisStore::Put(const std::string& key, const std::string& value) {
  auto r = Command({"SET", key, value});
  return r.ok() ? Status::OK() : r.status();
}

Status RedisStore::Remove(const std::string& key) {
  auto r = Command({"DEL", key});
  return r.ok() ? Status::OK() : r.status();
}

}  // namespace mooncake

#include "metadata/http_server/metadata_http_server.h"

#include <httplib.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <unordered_set>
#include <utility>

#include "common/auth.h"
#include "common/thread_annotations.h"

namespace mooncake::http {
namespace {

std::string Trim(const std::string& s) {
  const char* ws = " \t\r\n\f\v";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

void Reply(httplib::Response& res, int status, const std::string& text) {
  res.status = status;
  res.set_content(text, "application/json");
}

bool IsRpcMeta(const std::string& key) { return key.find("rpc_meta") != std::string::npos; }

// Finds the top-level "mc_auth_instance" string of a JSON object without building it (a
// value may be a 16 MiB descriptor): "" when the value is not JSON, not an object, or has
// none. At most kMaxOwner bytes are kept (instances are 32 hex digits).
constexpr size_t kMaxOwner = 128;
class OwnerSax {
 public:
  using json = nlohmann::json;
  bool null() { return Scalar(); }
  bool boolean(bool) { return Scalar(); }
  bool number_integer(json::number_integer_t) { return Scalar(); }
  bool number_unsigned(json::number_unsigned_t) { return Scalar(); }
  bool number_float(json::number_float_t, const json::string_t&) { return Scalar(); }
  bool binary(json::binary_t&) { return Scalar(); }
  bool string(json::string_t& v) {
    if (want_) owner = v.substr(0, kMaxOwner);
    return Scalar();
  }
  bool start_object(std::size_t) { return Open(true); }
  bool start_array(std::size_t) { return Open(false); }
  bool end_object() { return Close(); }
  bool end_array() { return Close(); }
  bool key(json::string_t& k) {
    want_ = depth_ == 1 && in_object_ && k == "mc_auth_instance";
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) {
    owner.clear();
    return false;
  }
  std::string owner;

 private:
  bool Scalar() {
    want_ = false;
    return true;
  }
  bool Open(bool object) {
    if (depth_ == 0) in_object_ = object;
    ++depth_;
    want_ = false;
    return true;
  }
  bool Close() {
    --depth_;
    return true;
  }
  int depth_ = 0;
  bool want_ = false;
  bool in_object_ = false;  // the top-level value is an object
};

std::string OwnerOf(const std::string& value) {
  OwnerSax sax;
  const bool ok = nlohmann::json::sax_parse(value, &sax);
  return ok ? sax.owner : "";
}

bool IsHex(const std::string& s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) {
      return false;
    }
  }
  return true;
}

// The proof a PUT or DELETE must carry when the server has the secret (see the header).
class WriteGuard {
 public:
  WriteGuard(const std::string& secret, int window_s, size_t max_nonces)
      : auth_(secret), window_s_(window_s < 1 ? 1 : window_s),
        max_nonces_(max_nonces < 1 ? 1 : max_nonces) {}
  bool enabled() const { return auth_.enabled(); }

  // "" when the request proves the secret (its nonce is then used up); else why not.
  std::string Check(const httplib::Request& req, const std::string& method,
                    const std::string& raw_key, const std::string& body) {
    const std::string what = method + " refused: ";
    const std::string fix =
        " Run the engine with the server's MC_AUTH_SECRET: engines of this project then sign "
        "every PUT and DELETE (docs/wire_protocol.md §5.5).";
    const std::string time = req.get_header_value("X-MC-Auth-Time");
    const std::string nonce = req.get_header_value("X-MC-Auth-Nonce");
    const std::string sig = req.get_header_value("X-MC-Auth-Sig");
    if (time.empty() && nonce.empty() && sig.empty()) {
      return what + "this metadata server has the cluster's shared secret and the request "
                    "carries no proof of it (no X-MC-Auth-* headers: an engine without "
                    "MC_AUTH_SECRET, an upstream engine, or someone without the secret)." + fix;
    }
    if (time.empty() || time.size() > 18 || time.find_first_not_of("0123456789") != std::string::npos ||
        nonce.size() < 16 || nonce.size() > 64 || !IsHex(nonce) || sig.size() != 64 ||
        !IsHex(sig)) {
      return what + "malformed X-MC-Auth-* headers (want X-MC-Auth-Time: decimal Unix seconds, "
                    "X-MC-Auth-Nonce: 16-64 hex digits, X-MC-Auth-Sig: 64 hex digits)." + fix;
    }
    if (!auth_.VerifyStoreRequest(method, raw_key, body, time, nonce, sig)) {
      return what + "the proof of the shared secret does not verify (another secret than the "
                    "server's MC_AUTH_SECRET, or the method, key or body changed after "
                    "signing)." + fix;
    }
    const int64_t t = std::stoll(time);
    const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
    if (t < now - window_s_ || t > now + window_s_) {
      return what + "the request was signed at Unix time " + time + ", " +
             std::to_string(t < now ? now - t : t - now) + " s from this server's clock " +
             "(allowed: " + std::to_string(window_s_) + " s): a replayed request, or clocks " +
             "out of step (synchronize them, e.g. with NTP).";
    }
    MutexLock lock(&mu_);
    while (!by_time_.empty() && by_time_.begin()->first < now - window_s_) {
      seen_.erase(by_time_.begin()->second);
      by_time_.erase(by_time_.begin());
    }
    if (t <= floor_) {
      return what + "more than " + std::to_string(max_nonces_) + " signed writes within the " +
             std::to_string(window_s_) + " s replay window; this one is no newer than the " +
             "oldest forgotten one. Retry it (a new signature).";
    }
    if (!seen_.insert(nonce).second) {
      return what + "a replayed request (its nonce was already used).";
    }
    by_time_.emplace(t, nonce);
    while (by_time_.size() > max_nonces_) {
      floor_ = std::max(floor_, by_time_.begin()->first);
      seen_.erase(by_time_.begin()->second);
      by_time_.erase(by_time_.begin());
    }
    return "";
  }

 private:
  const mooncake::Authenticator auth_;
  const int64_t window_s_;
  const size_t max_nonces_;
  Mutex mu_;
  std::set<std::pair<int64_t, std::string>> by_time_ MC_GUARDED_BY(mu_);
  std::unordered_set<std::string> seen_ MC_GUARDED_BY(mu_);
  int64_t floor_ MC_GUARDED_BY(mu_) = std::numeric_limits<int64_t>::min();
};

// The store. Thread-safe.
class MetadataTable {
 public:
  // `owners`: keep owners' entries (the secret is set; see the header).
  MetadataTable(size_t max_total_bytes, bool owners)
      : max_total_bytes_(max_total_bytes), owners_(owners) {}

  void Get(const std::string& key, httplib::Response& res) {
    MutexLock lock(&mu_);
    auto it = map_.find(key);
    if (it == map_.end()) return Reply(res, 404, "metadata not found");
    res.status = 200;
    res.set_content(it->second.value, "application/json");
  }

  void Put(const std::string& key, const std::string& value, httplib::Response& res) {
    const std::string owner = owners_ ? OwnerOf(value) : "";
    MutexLock lock(&mu_);
    auto it = map_.find(key);
    if (it != map_.end() && IsRpcMeta(key)) {
      // Identical value: idempotent (see the header); a different one: refused.
      if (it->second.value == value) return Reply(res, 200, "metadata unchanged");
      return Reply(res, 400, "Duplicate rpc_meta key not allowed");
    }
    if (it != map_.end() && owners_ && !it->second.owner.empty() &&
        it->second.owner != owner && rpc_owners_.count(it->second.owner) != 0) {
      return Reply(res, 409,
                   "PUT refused: '" + key.substr(0, 200) + "' belongs to engine instance " +
                       it->second.owner + ", which still holds an rpc_meta entry on this "
                       "server, and the new value is " +
                       (owner.empty() ? std::string("not signed by an engine instance")
                                      : "signed by instance " + owner) +
                       ". Only the owner may replace it until its rpc_meta entry is deleted "
                       "(at its shutdown, or by a new start of that engine that found it dead). "
                       "Two engines with one segment name? Give each its own name.");
    }
    size_t old_bytes = it == map_.end() ? 0 : key.size() + it->second.value.size();
    size_t new_total = total_bytes_ - old_bytes + key.size() + value.size();
    if (new_total > max_total_bytes_) return Reply(res, 507, "metadata store is full");
    total_bytes_ = new_total;
    if (it != map_.end()) {
      Disown(key, it->second.owner);
      it->second = Entry{value, owner};
    } else {
      map_.emplace(key, Entry{value, owner});
    }
    if (IsRpcMeta(key) && !owner.empty()) ++rpc_owners_[owner];
    Reply(res, 200, "metadata updated");
  }

  void Delete(const std::string& key, httplib::Response& res) {
    MutexLock lock(&mu_);
    auto it = map_.find(key);
    if (it == map_.end()) return Reply(res, 404, "metadata not found");
    total_bytes_ -= key.size() + it->second.value.size();
    Disown(key, it->second.owner);
    map_.erase(it);
    Reply(res, 200, "metadata deleted");
  }

 private:
  struct Entry {
    std::string value;
    std::string owner;  // its "mc_auth_instance" (only when owners_)
  };
  // The entry of `key` owned by `owner` goes away.
  void Disown(const std::string& key, const std::string& owner) MC_REQUIRES(mu_) {
    if (owner.empty() || !IsRpcMeta(key)) return;
    auto o = rpc_owners_.find(owner);
    if (o != rpc_owners_.end() && --o->second == 0) rpc_owners_.erase(o);
  }

  Mutex mu_;
  std::map<std::string, Entry> map_ MC_GUARDED_BY(mu_);
  std::map<std::string, size_t> rpc_owners_ MC_GUARDED_BY(mu_);  // instance -> its rpc_meta keys
  size_t total_bytes_ MC_GUARDED_BY(mu_) = 0;
  const size_t max_total_bytes_;
  const bool owners_;
};

}  // namespace

struct MetadataHttpServer::Impl {
  explicit Impl(const MetadataServerOptions& o)
      : options(o),
        table(o.max_total_bytes, !o.auth_secret.empty()),
        guard(o.auth_secret, o.auth_window_s, o.auth_max_nonces),
        server(o.guard) {}
  void Routes();

  const MetadataServerOptions options;
  MetadataTable table;
  WriteGuard guard;
  GuardedServer server;
  std::thread thread;
  std::atomic<bool> listen_done{false};
};

void MetadataHttpServer::Impl::Routes() {
  server.set_payload_max_length(options.max_body_bytes);  // TCP_NODELAY: GuardedServer::Bind
  const bool log = options.log_requests;
  // Wraps a handler with the key check and optional request logging.
  auto with_key = [log](auto handler) {
    return [log, handler](const httplib::Request& req, httplib::Response& res) {
      std::string key = req.has_param("key") ? Trim(req.get_param_value("key")) : "";
      if (key.empty()) {
        Reply(res, 400, "metadata key is required");
      } else {
        handler(key, req, res);
      }
      if (log) {
        std::fprintf(stderr, "%s %s key='%s' -> %d\n", req.method.c_str(), req.path.c_str(),
                     key.c_str(), res.status);
      }
    };
  };
  MetadataTable* t = &table;
  WriteGuard* g = &guard;
  server.Get("/metadata", with_key([t](const std::string& key, const httplib::Request&,
                                       httplib::Response& res) { t->Get(key, res); }));
  // PUT reads its body through a content reader: cpp-httplib's plain handlers refuse
  // form-encoded bodies over 8 KiB (a limit compiled into the library), whatever
  // set_payload_max_length says; the reader has only the payload limit (413 past it).
  server.Put("/metadata", [t, g, with_key](const httplib::Request& req, httplib::Response& res,
                                        const httplib::ContentReader& reader) {
    if (req.is_multipart_form_data()) {
      res.set_header("Connection", "close");
      return Reply(res, 415, "multipart bodies are not supported; send the value as the raw body");
    }
    std::string body;
    if (!reader([&](const char* data, size_t n) {
          body.append(data, n);
          return true;
        })) {
      return;  // cut short or over the limit: cpp-httplib answers (413) or drops it
    }
    with_key([t, g, &body](const std::string& key, const httplib::Request& q,
                           httplib::Response& r) {
      if (g->enabled()) {
        std::string why = g->Check(q, "PUT", q.get_param_value("key"), body);
        if (!why.empty()) return Reply(r, 403, why);
      }
      t->Put(key, body, r);
    })(req, res);
  });
  server.Delete("/metadata", with_key([t, g](const std::string& key, const httplib::Request& q,
                                             httplib::Response& res) {
                  if (g->enabled()) {
                    std::string why = g->Check(q, "DELETE", q.get_param_value("key"), q.body);
                    if (!why.empty()) return Reply(res, 403, why);
                  }
                  t->Delete(key, res);
                }));
  auto not_allowed = [](const httplib::Request&, httplib::Response& res) {
    Reply(res, 405, "Method not allowed");
  };
  server.Post("/metadata", not_allowed);
  server.Patch("/metadata", not_allowed);
  // As upstream's master-embedded server.
  server.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.status = 200;
    res.set_content("OK", "text/plain");
  });
}

MetadataHttpServer::MetadataHttpServer(MetadataServerOptions options)
    : impl_(std::make_unique<Impl>(options)) {
  impl_->Routes();
}

MetadataHttpServer::~MetadataHttpServer() { Stop(); }

Status MetadataHttpServer::Start(const std::string& host, int port) {
  if (port_ != 0) return Status::FailedPrecondition("already started");
  auto bound = impl_->server.Bind(host, port);
  if (!bound.ok()) return bound.status();
  port_ = *bound;
  impl_->listen_done.store(false);
  impl_->thread = std::thread([this] {
    impl_->server.listen_after_bind();
    impl_->listen_done.store(true);
  });
  return Status::OK();
}

void MetadataHttpServer::Stop() {
  if (!impl_->thread.joinable()) return;
  // stop() acts only once listen_after_bind() has started: wait for that (or for the loop
  // to have ended by itself).
  while (!impl_->listen_done.load()) {
    if (impl_->server.is_running()) {
      impl_->server.stop();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  impl_->thread.join();
}

bool MetadataHttpServer::serving() const {
  return impl_->thread.joinable() && !impl_->listen_done.load();
}

GuardCounters MetadataHttpServer::counters() const { return impl_->server.counters(); }

}  // namespace mooncake::http

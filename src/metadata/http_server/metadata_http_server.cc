#include "metadata/http_server/metadata_http_server.h"

#include <httplib.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

namespace mooncake::http {
namespace {

std::string Trim(const std::string& s) {
  const char* ws = " \t\r\n\f\v";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

void Reply(httplib::Response& res, int status, const char* text) {
  res.status = status;
  res.set_content(text, "application/json");
}

// The store. Thread-safe.
class MetadataTable {
 public:
  explicit MetadataTable(size_t max_total_bytes) : max_total_bytes_(max_total_bytes) {}

  void Get(const std::string& key, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it == map_.end()) return Reply(res, 404, "metadata not found");
    res.status = 200;
    res.set_content(it->second, "application/json");
  }

  void Put(const std::string& key, const std::string& value, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it != map_.end() && key.find("rpc_meta") != std::string::npos) {
      // Identical value: idempotent (see the header); a different one: refused.
      if (it->second == value) return Reply(res, 200, "metadata unchanged");
      return Reply(res, 400, "Duplicate rpc_meta key not allowed");
    }
    size_t old_bytes = it == map_.end() ? 0 : key.size() + it->second.size();
    size_t new_total = total_bytes_ - old_bytes + key.size() + value.size();
    if (new_total > max_total_bytes_) return Reply(res, 507, "metadata store is full");
    total_bytes_ = new_total;
    map_[key] = value;
    Reply(res, 200, "metadata updated");
  }

  void Delete(const std::string& key, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it == map_.end()) return Reply(res, 404, "metadata not found");
    total_bytes_ -= key.size() + it->second.size();
    map_.erase(it);
    Reply(res, 200, "metadata deleted");
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::string> map_;  // GUARDED_BY(mu_)
  size_t total_bytes_ = 0;                  // GUARDED_BY(mu_)
  const size_t max_total_bytes_;
};

}  // namespace

struct MetadataHttpServer::Impl {
  explicit Impl(const MetadataServerOptions& o)
      : options(o), table(o.max_total_bytes), server(o.guard) {}
  void Routes();

  const MetadataServerOptions options;
  MetadataTable table;
  GuardedServer server;
  std::thread thread;
  std::atomic<bool> listen_done{false};
};

void MetadataHttpServer::Impl::Routes() {
  server.set_payload_max_length(options.max_body_bytes);
  server.set_tcp_nodelay(true);  // small replies: no Nagle / delayed-ACK stalls
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
  server.Get("/metadata", with_key([t](const std::string& key, const httplib::Request&,
                                       httplib::Response& res) { t->Get(key, res); }));
  // PUT reads its body through a content reader: cpp-httplib's plain handlers refuse
  // form-encoded bodies over 8 KiB (a limit compiled into the library), whatever
  // set_payload_max_length says; the reader has only the payload limit (413 past it).
  server.Put("/metadata", [t, with_key](const httplib::Request& req, httplib::Response& res,
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
    with_key([t, &body](const std::string& key, const httplib::Request&, httplib::Response& r) {
      t->Put(key, body, r);
    })(req, res);
  });
  server.Delete("/metadata", with_key([t](const std::string& key, const httplib::Request&,
                                          httplib::Response& res) { t->Delete(key, res); }));
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

std::string MetadataHttpServer::Start(const std::string& host, int port) {
  if (port_ != 0) return "already started";
  errno = 0;
  int bound = port;
  if (port == 0) {
    bound = impl_->server.bind_to_any_port(host);
  } else if (!impl_->server.bind_to_port(host, port)) {
    bound = -1;
  }
  if (bound <= 0) {
    const int err = errno;
    std::string why = err != 0 ? std::strerror(err) : "cannot bind";
    if (err == EADDRINUSE) why += " (the port is in use)";
    return "cannot listen on " + host + ":" + std::to_string(port) + ": " + why;
  }
  port_ = bound;
  impl_->listen_done.store(false);
  impl_->thread = std::thread([this] {
    impl_->server.listen_after_bind();
    impl_->listen_done.store(true);
  });
  return "";
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

// mooncake_http_metadata_server: an in-memory key-value store behind upstream Mooncake's HTTP
// metadata protocol, a drop-in for upstream's `mooncake_http_metadata_server` (Python).
//
//   mooncake_http_metadata_server [--port 8080] [--host 0.0.0.0] [--max_body_bytes N]
//                                 [--max_total_bytes N] [--max_connections 256]
//                                 [--max_per_address 32] [--head_timeout_ms 3000]
//                                 [--log-level INFO|DEBUG|...]
//
// Route /metadata, with the key in the query (?key=...; surrounding whitespace is dropped):
//   GET     200 + the value | 404 "metadata not found"
//   PUT     200 "metadata updated" (the body is the value); a key containing "rpc_meta" that
//           exists already with a different value: 400 "Duplicate rpc_meta key not allowed".
//           Upstream's first server refused every re-PUT of an rpc_meta key, so a restarted
//           engine that republished the very same address failed to start; like upstream's
//           later servers, a re-PUT of the identical value is accepted (200 "metadata unchanged").
//   DELETE  200 "metadata deleted" | 404 "metadata not found"
//   other methods 405; no or empty key 400 "metadata key is required"; other paths 404.
// Bounds: a body over --max_body_bytes (16 MiB) is 413, whatever its Content-Type (form-
// encoded bodies too: cpp-httplib's own 8 KiB form limit does not apply); a PUT that would
// take the stored keys and values over --max_total_bytes (1 GiB) is 507; URIs and headers
// are bounded by cpp-httplib (8 KiB). Connections (guarded_server.h): a thread each, up to
// --max_connections, at most --max_per_address from one IP; a request head must arrive
// within --head_timeout_ms, no read of a body may wait over 5 s, idle keep-alive connections
// close after 5 s. A port in use is refused (no SO_REUSEPORT), so two servers never split
// the keys between them.
// Prints one line when listening: "mooncake_http_metadata_server listening on <host>:<port>"
// (with --port 0 the port is the one the kernel chose). SIGINT/SIGTERM stop it cleanly (exit 0).
#include <httplib.h>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "guarded_server.h"

namespace {

struct Flags {
  int port = 8080;
  std::string host = "0.0.0.0";
  size_t max_body_bytes = 16u << 20;
  size_t max_total_bytes = size_t(1) << 30;
  mooncake::http::GuardLimits guard;
  bool debug = false;
};

const char kUsage[] =
    "usage: mooncake_http_metadata_server [--port 8080] [--host 0.0.0.0]\n"
    "         [--max_body_bytes 16777216] [--max_total_bytes 1073741824]\n"
    "         [--max_connections 256] [--max_per_address 32] [--head_timeout_ms 3000]\n"
    "         [--log-level DEBUG|INFO|WARNING|ERROR|CRITICAL]\n";

bool ParseSize(const std::string& s, long long lo, long long hi, long long* out) {
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

// Accepts "--name value" and "--name=value" (and '_' or '-' inside names). False on error.
bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (arg.rfind("--", 0) != 0) return false;
    std::string name = arg.substr(2), value;
    size_t eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      std::fprintf(stderr, "flag --%s needs a value\n", name.c_str());
      return false;
    }
    for (char& c : name) c = (c == '-') ? '_' : c;
    long long n = 0;
    if (name == "port" && ParseSize(value, 0, 65535, &n)) {
      f->port = int(n);
    } else if (name == "host" && !value.empty()) {
      f->host = value;
    } else if (name == "max_body_bytes" && ParseSize(value, 1, 1LL << 40, &n)) {
      f->max_body_bytes = size_t(n);
    } else if (name == "max_total_bytes" && ParseSize(value, 1, 1LL << 50, &n)) {
      f->max_total_bytes = size_t(n);
    } else if (name == "max_connections" && ParseSize(value, 1, 65536, &n)) {
      f->guard.max_connections = size_t(n);
    } else if (name == "max_per_address" && ParseSize(value, 1, 65536, &n)) {
      f->guard.max_per_address = size_t(n);
    } else if (name == "head_timeout_ms" && ParseSize(value, 10, 600000, &n)) {
      f->guard.head_timeout_ms = int(n);
    } else if (name == "log_level") {
      f->debug = value == "DEBUG" || value == "debug";
    } else {
      std::fprintf(stderr, "bad flag or value: %s %s\n", arg.c_str(), value.c_str());
      return false;
    }
  }
  return true;
}

std::string Trim(const std::string& s) {
  const char* ws = " \t\r\n\f\v";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
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
      // Identical value: idempotent (see the file comment); a different one: refused.
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

  static void Reply(httplib::Response& res, int status, const char* text) {
    res.status = status;
    res.set_content(text, "application/json");
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::string> map_;
  size_t total_bytes_ = 0;
  const size_t max_total_bytes_;
};

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) {
    std::fputs(kUsage, stderr);
    return 2;
  }

  // Every thread inherits this mask; one thread takes the signals with sigwait().
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  MetadataTable table(flags.max_total_bytes);
  mooncake::http::GuardedServer server(flags.guard);
  server.set_payload_max_length(flags.max_body_bytes);
  server.set_tcp_nodelay(true);  // small replies: no Nagle / delayed-ACK stalls

  // Wraps a handler with the key check and optional request logging.
  auto with_key = [&](auto handler) {
    return [&, handler](const httplib::Request& req, httplib::Response& res) {
      std::string key = req.has_param("key") ? Trim(req.get_param_value("key")) : "";
      if (key.empty()) {
        MetadataTable::Reply(res, 400, "metadata key is required");
      } else {
        handler(key, req, res);
      }
      if (flags.debug) {
        std::fprintf(stderr, "%s %s key='%s' -> %d\n", req.method.c_str(), req.path.c_str(),
                     key.c_str(), res.status);
      }
    };
  };
  server.Get("/metadata", with_key([&](const std::string& key, const httplib::Request&,
                                       httplib::Response& res) { table.Get(key, res); }));
  // PUT reads its body through a content reader: cpp-httplib's plain handlers refuse
  // form-encoded bodies over 8 KiB (a limit compiled into the library), whatever
  // set_payload_max_length says; the reader has only the payload limit (413 past it).
  server.Put("/metadata", [&](const httplib::Request& req, httplib::Response& res,
                              const httplib::ContentReader& reader) {
    if (req.is_multipart_form_data()) {
      res.set_header("Connection", "close");
      return MetadataTable::Reply(res, 415, "multipart bodies are not supported; send the value "
                                            "as the raw body");
    }
    std::string body;
    if (!reader([&](const char* data, size_t n) {
          body.append(data, n);
          return true;
        })) {
      return;  // cut short or over the limit: cpp-httplib answers (413) or drops it
    }
    with_key([&](const std::string& key, const httplib::Request&, httplib::Response& r) {
      table.Put(key, body, r);
    })(req, res);
  });
  server.Delete("/metadata", with_key([&](const std::string& key, const httplib::Request&,
                                          httplib::Response& res) { table.Delete(key, res); }));
  auto not_allowed = [](const httplib::Request&, httplib::Response& res) {
    MetadataTable::Reply(res, 405, "Method not allowed");
  };
  server.Post("/metadata", not_allowed);
  server.Patch("/metadata", not_allowed);

  int port = flags.port;
  if (port == 0) {
    port = server.bind_to_any_port(flags.host);
  } else if (!server.bind_to_port(flags.host, port)) {
    port = -1;
  }
  if (port <= 0) {
    int err = errno;
    std::fprintf(stderr, "mooncake_http_metadata_server: cannot listen on %s:%d: %s%s\n",
                 flags.host.c_str(), flags.port, std::strerror(err),
                 err == EADDRINUSE ? " (another server holds the port; choose another with --port)"
                                   : "");
    return 1;
  }
  std::printf("mooncake_http_metadata_server listening on %s:%d\n", flags.host.c_str(), port);
  std::fflush(stdout);

  std::atomic<bool> listen_done{false};
  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    // stop() only acts on a running server: a signal that came before listen_after_bind()
    // started is held until it runs.
    auto stopped_at = std::chrono::steady_clock::time_point();
    while (!listen_done.load()) {
      if (stopped_at == std::chrono::steady_clock::time_point() && server.is_running()) {
        server.stop();
        stopped_at = std::chrono::steady_clock::now();
      }
      // listen_after_bind() waits for the workers, and a worker holds an idle keep-alive
      // connection for up to 5 s: past a second, leave without them (nothing to flush).
      if (stopped_at != std::chrono::steady_clock::time_point() &&
          std::chrono::steady_clock::now() - stopped_at > std::chrono::seconds(1)) {
        std::fprintf(stderr, "mooncake_http_metadata_server: stopped (open connections closed)\n");
        std::_Exit(0);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  bool ok = server.listen_after_bind();
  listen_done.store(true);
  // listen_after_bind() returns once stop() ran; if it failed by itself, wake the waiter.
  pthread_kill(signal_thread.native_handle(), SIGTERM);
  signal_thread.join();
  std::fprintf(stderr, "mooncake_http_metadata_server: stopped\n");
  return ok ? 0 : 1;
}

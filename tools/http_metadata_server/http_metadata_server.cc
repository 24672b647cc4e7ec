// mooncake_http_metadata_server: an in-memory key-value store behind upstream Mooncake's HTTP
// metadata protocol, a drop-in for upstream's `mooncake_http_metadata_server` (Python).
//
//   mooncake_http_metadata_server [--port 8080] [--host 0.0.0.0] [--max_body_bytes N]
//                                 [--max_total_bytes N] [--max_connections 256]
//                                 [--max_per_address 32] [--head_timeout_ms 3000]
//                                 [--auth_secret_file PATH] [--log-level INFO|DEBUG|...]
//
// Shared secret: with MC_AUTH_SECRET in the environment (as engines read it) or
// --auth_secret_file PATH (the file's contents, one trailing newline dropped; it wins over the
// variable), every PUT and DELETE must prove knowledge of the secret, and an engine
// instance's entries may not be replaced by another instance while it holds its rpc_meta entry
// (metadata_http_server.h, docs/wire_protocol.md §5.5). Never give the secret on the command
// line (other users see it in ps). Without a secret anyone who reaches the server may PUT or
// DELETE any key, as with upstream.
//
// The protocol and its bounds: metadata_http_server.h (the same code serves
// mooncake_master --enable_http_metadata_server). Connections (guarded_server.h): up to
// --max_connections served at once, a worker thread each, as many more waiting; at most
// --max_per_address from one IP; when connections wait, the one served longest while slow
// or idle (>= 250 ms), from the busiest address, is closed to make room. A request head
// must arrive within --head_timeout_ms (however it trickles), no read of a body may wait
// over 5 s, idle keep-alive connections close after 5 s. A port in use is refused (no
// SO_REUSEPORT).
// Prints one line when listening: "mooncake_http_metadata_server listening on <host>:<port>"
// (with --port 0 the port is the one the kernel chose). SIGINT/SIGTERM stop it cleanly (exit 0).
#include <pthread.h>
#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "metadata/http_server/metadata_http_server.h"

namespace {

struct Flags {
  int port = 8080;
  std::string host = "0.0.0.0";
  size_t max_body_bytes = 16u << 20;
  size_t max_total_bytes = size_t(1) << 30;
  mooncake::http::GuardLimits guard;
  bool debug = false;
  std::string auth_secret_file;
};

const char kUsage[] =
    "usage: mooncake_http_metadata_server [--port 8080] [--host 0.0.0.0]\n"
    "         [--max_body_bytes 16777216] [--max_total_bytes 1073741824]\n"
    "         [--max_connections 256] [--max_per_address 32] [--head_timeout_ms 3000]\n"
    "         [--auth_secret_file PATH] [--log-level DEBUG|INFO|WARNING|ERROR|CRITICAL]\n"
    "  MC_AUTH_SECRET (or --auth_secret_file): PUT and DELETE must prove the cluster's secret\n";

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
    } else if (name == "auth_secret_file" && !value.empty()) {
      f->auth_secret_file = value;
    } else if (name == "auth_secret") {
      std::fprintf(stderr, "--auth_secret is not accepted: a secret on the command line is "
                           "visible to every user (ps). Set MC_AUTH_SECRET in the server's "
                           "environment or use --auth_secret_file PATH\n");
      return false;
    } else if (name == "log_level") {
      f->debug = value == "DEBUG" || value == "debug";
    } else {
      std::fprintf(stderr, "bad flag or value: %s %s\n", arg.c_str(), value.c_str());
      return false;
    }
  }
  return true;
}

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

  std::string secret, secret_from;
  if (!flags.auth_secret_file.empty()) {
    std::ifstream in(flags.auth_secret_file, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    if (!in) {
      std::fprintf(stderr, "mooncake_http_metadata_server: cannot read --auth_secret_file %s: %s\n",
                   flags.auth_secret_file.c_str(), std::strerror(errno));
      return 2;
    }
    secret = ss.str();
    if (!secret.empty() && secret.back() == '\n') secret.pop_back();
    if (!secret.empty() && secret.back() == '\r') secret.pop_back();
    if (secret.empty()) {
      std::fprintf(stderr, "mooncake_http_metadata_server: --auth_secret_file %s is empty\n",
                   flags.auth_secret_file.c_str());
      return 2;
    }
    secret_from = "--auth_secret_file";
  } else if (const char* v = std::getenv("MC_AUTH_SECRET"); v != nullptr && *v != '\0') {
    secret = v;
    secret_from = "MC_AUTH_SECRET";
  }

  mooncake::http::MetadataServerOptions options;
  options.auth_secret = secret;
  options.max_body_bytes = flags.max_body_bytes;
  options.max_total_bytes = flags.max_total_bytes;
  options.guard = flags.guard;
  options.log_requests = flags.debug;
  mooncake::http::MetadataHttpServer server(options);
  const mooncake::Status started = server.Start(flags.host, flags.port);
  if (!started.ok()) {
    const std::string& error = started.message();
    std::fprintf(stderr, "mooncake_http_metadata_server: %s%s\n", error.c_str(),
                 error.find("in use") != std::string::npos
                     ? " (another server holds the port; choose another with --port)"
                     : "");
    return 1;
  }
  if (secret.empty()) {
    std::fprintf(stderr, "mooncake_http_metadata_server: no shared secret (MC_AUTH_SECRET): "
                         "anyone who reaches this server may PUT or DELETE any key\n");
  } else {
    std::fprintf(stderr, "mooncake_http_metadata_server: PUT and DELETE require proof of the "
                         "shared secret (from %s); GET stays open\n", secret_from.c_str());
  }
  std::printf("mooncake_http_metadata_server listening on %s:%d\n", flags.host.c_str(),
              server.port());
  std::fflush(stdout);

  // Until a signal comes, or (it should not) the server's loop ends by itself.
  const timespec poll_interval{0, 200 * 1000 * 1000};
  while (sigtimedwait(&stop_signals, nullptr, &poll_interval) < 0 && server.serving()) {
  }
  server.Stop();  // ends open connections within about 100 ms
  std::fprintf(stderr, "mooncake_http_metadata_server: stopped\n");
  return 0;
}

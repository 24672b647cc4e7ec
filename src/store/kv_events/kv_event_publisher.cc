#include "store/kv_events/kv_event_publisher.h"

#include <endian.h>
#include <glog/logging.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "store/kv_events/zmq_lib.h"
#include "store/tenants/tenant_id.h"

namespace mooncake::store::kv_events {
namespace {

constexpr int kPubHighWater = 10000;      // messages a slow subscriber may have queued
constexpr int kReplyHighWater = 1000;     // replay messages queued per client
constexpr int64_t kMaxRequestBytes = 1024;  // ZMQ_MAXMSGSIZE on the replay socket
constexpr size_t kMaxIdentityBytes = 256;
constexpr int kRequestsPerWake = 16;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string Be64(uint64_t v) {
  const uint64_t be = htobe64(v);
  return std::string(reinterpret_cast<const char*>(&be), sizeof(be));
}

}  // namespace

struct KvEventPublisher::Sockets {
  const ZmqLib* z = nullptr;
  void* ctx = nullptr;
  void* pub = nullptr;
  void* replay = nullptr;

  ~Sockets() {
    if (pub != nullptr) z->close(pub);
    if (replay != nullptr) z->close(replay);
    if (ctx != nullptr) z->ctx_term(ctx);
  }
  std::string Error() const { return z->strerror(z->errno_fn()); }
  // Sends frames as one message; false (nothing more should be sent to that peer) when the
  // socket would block or the peer is gone.
  bool SendAll(void* s, const std::vector<std::string>& frames, int flags) const {
    for (size_t i = 0; i < frames.size(); ++i) {
      const int more = i + 1 < frames.size() ? ZMQ_SNDMORE : 0;
      if (z->send(s, frames[i].data(), frames[i].size(), more | flags) < 0) return false;
    }
    return true;
  }
};

KvEventPublisher::KvEventPublisher(PublisherOptions options, SnapshotFn snapshot)
    : options_(std::move(options)), snapshot_(std::move(snapshot)) {}

Result<std::unique_ptr<KvEventPublisher>> KvEventPublisher::Start(PublisherOptions options,
                                                                  SnapshotFn snapshot) {
  if (options.bind_endpoint.empty()) {
    return Status::InvalidArgument("--kv_events_bind_endpoint is empty (e.g. tcp://0.0.0.0:5557)");
  }
  if (options.codec.backend_id.empty()) {
    return Status::InvalidArgument("--kv_events_backend_id is empty: name this pool for the "
                                   "routers (e.g. mooncake-store-0)");
  }
  auto z = LoadZmq();
  if (!z.ok()) return z.status();
  std::unique_ptr<KvEventPublisher> p(new KvEventPublisher(std::move(options), snapshot));
  auto s = std::make_unique<Sockets>();
  s->z = *z;
  s->ctx = s->z->ctx_new();
  if (s->ctx == nullptr) return Status::Unavailable("kv_events: zmq_ctx_new: " + s->Error());
  s->pub = s->z->socket(s->ctx, ZMQ_PUB);
  if (s->pub == nullptr) return Status::Unavailable("kv_events: zmq_socket: " + s->Error());
  const int hwm = kPubHighWater, linger = 0;
  s->z->setsockopt(s->pub, ZMQ_SNDHWM, &hwm, sizeof(hwm));
  s->z->setsockopt(s->pub, ZMQ_LINGER, &linger, sizeof(linger));
  if (s->z->bind(s->pub, p->options_.bind_endpoint.c_str()) != 0) {
    return Status::Unavailable("kv_events: cannot bind " + p->options_.bind_endpoint + ": " +
                               s->Error());
  }
  if (!p->options_.replay_endpoint.empty()) {
    s->replay = s->z->socket(s->ctx, ZMQ_ROUTER);
    if (s->replay == nullptr) return Status::Unavailable("kv_events: zmq_socket: " + s->Error());
    const int reply_hwm = kReplyHighWater;
    const int64_t max_request = kMaxRequestBytes;
    s->z->setsockopt(s->replay, ZMQ_SNDHWM, &reply_hwm, sizeof(reply_hwm));
    s->z->setsockopt(s->replay, ZMQ_LINGER, &linger, sizeof(linger));
    s->z->setsockopt(s->replay, ZMQ_MAXMSGSIZE, &max_request, sizeof(max_request));
    if (s->z->bind(s->replay, p->options_.replay_endpoint.c_str()) != 0) {
      return Status::Unavailable("kv_events: cannot bind the replay endpoint " +
                                 p->options_.replay_endpoint + ": " + s->Error());
    }
  }
  p->wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (p->wake_fd_ < 0) return Status::Unavailable(std::string("eventfd: ") + strerror(errno));
  p->sockets_ = std::move(s);
  p->thread_ = std::thread([raw = p.get()] { raw->Run(); });
  LOG(INFO) << "kv_events: publishing on " << p->options_.bind_endpoint << " as backend "
            << p->options_.codec.backend_id
            << (p->options_.replay_endpoint.empty()
                    ? std::string()
                    : ", replay and snapshots on " + p->options_.replay_endpoint);
  return p;
}

KvEventPublisher::~KvEventPublisher() {
  if (thread_.joinable()) {
    stop_.store(true);
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
    thread_.join();
  }
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

Event KvEventPublisher::MakeEvent(bool stored, std::string key) const {
  Event e;
  e.stored = stored;
  if (options_.scoped_keys) {
    e.tenant_id = std::string(TenantOf(key));
    e.key = std::string(LocalKey(key));
  } else {
    e.key = std::move(key);
  }
  return e;
}

void KvEventPublisher::Enqueue(bool stored, const std::string& key) {
  bool was_empty;
  {
    MutexLock lock(&mu_);
    if (options_.queue_capacity > 0 && queue_.size() >= options_.queue_capacity) {
      queue_.pop_front();
      ++dropped_;
      ++next_seq_;  // the lost event's number: subscribers see a gap
    }
    was_empty = queue_.empty();
    queue_.push_back(Pending{stored, key});
  }
  if (was_empty) {
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
  }
}

void KvEventPublisher::Run() {
  const ZmqLib* z = sockets_->z;
  while (true) {
    zmq_pollitem_t items[2] = {};
    items[0].fd = wake_fd_;
    items[0].events = ZMQ_POLLIN;
    int n = 1;
    if (sockets_->replay != nullptr) {
      items[1].socket = sockets_->replay;
      items[1].events = ZMQ_POLLIN;
      n = 2;
    }
    z->poll(items, n, 1000);
    uint64_t drained;
    while (::read(wake_fd_, &drained, sizeof(drained)) > 0) {
    }
    PublishQueued();
    if (n == 2 && (items[1].revents & ZMQ_POLLIN)) ServeReplay();
    if (stop_.load()) {
      PublishQueued();
      return;
    }
  }
}

void KvEventPublisher::PauseForTest(bool paused) {
  paused_.store(paused);
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
}

void KvEventPublisher::PublishQueued() {
  std::vector<Event> batch;
  while (!paused_.load() || stop_.load()) {
    uint64_t seq;
    batch.clear();
    {
      MutexLock lock(&mu_);
      if (queue_.empty()) return;
      while (!queue_.empty() && batch.size() < kMaxBatchEvents) {
        batch.push_back(MakeEvent(queue_.front().stored, std::move(queue_.front().key)));
        queue_.pop_front();
      }
      seq = next_seq_++;
    }
    std::string payload;
    uint64_t unparsed = 0;
    const size_t events = EncodeBatch(batch, options_.codec, NowMs(), &next_event_id_,
                                      &unparsed, &payload);
    unparsed_.fetch_add(unparsed, std::memory_order_relaxed);
    if (events == 0) continue;  // its number stays unused: a gap, as for a dropped event
    Send(seq, payload, events);
  }
}

void KvEventPublisher::Send(uint64_t seq, const std::string& payload, size_t events) {
  // PUB never blocks: past the high-water mark a slow subscriber's messages are dropped.
  if (sockets_->SendAll(sockets_->pub, {std::string(), Be64(seq), payload}, ZMQ_DONTWAIT)) {
    batches_.fetch_add(1, std::memory_order_relaxed);
    events_.fetch_add(events, std::memory_order_relaxed);
  }
  if (sockets_->replay == nullptr || options_.replay_batches == 0) return;
  kept_.emplace_back(seq, payload);
  kept_bytes_ += payload.size();
  while (kept_.size() > options_.replay_batches || kept_bytes_ > kReplayBytes) {
    kept_bytes_ -= kept_.front().second.size();
    kept_.pop_front();
  }
}

void KvEventPublisher::ServeReplay() {
  const ZmqLib* z = sockets_->z;
  for (int served = 0; served < kRequestsPerWake; ++served) {
    std::vector<std::string> frames;
    bool more = true, any = false;
    while (more) {
      zmq_msg_t msg;
      z->msg_init(&msg);
      if (z->msg_recv(&msg, sockets_->replay, ZMQ_DONTWAIT) < 0) {
        z->msg_close(&msg);
        break;
      }
      any = true;
      more = z->msg_more(&msg) != 0;
      if (frames.size() < 4) {
        frames.emplace_back(static_cast<const char*>(z->msg_data(&msg)), z->msg_size(&msg));
      }
      z->msg_close(&msg);
    }
    if (!any) return;
    // [identity, request] from a DEALER, [identity, "", request] from a REQ socket.
    const bool delimiter = frames.size() == 3 && frames[1].empty();
    const std::string* request = frames.size() == 2 ? &frames[1]
                                 : delimiter        ? &frames[2]
                                                    : nullptr;
    if (request == nullptr || request->size() != 8 || frames[0].empty() ||
        frames[0].size() > kMaxIdentityBytes) {
      continue;  // not a request: ignored, nothing is answered
    }
    replays_.fetch_add(1, std::memory_order_relaxed);
    uint64_t start;
    std::memcpy(&start, request->data(), sizeof(start));
    Reply(frames[0], delimiter, be64toh(start));
  }
}

void KvEventPublisher::Reply(const std::string& identity, bool delimiter, uint64_t start) {
  uint64_t next;
  {
    MutexLock lock(&mu_);
    next = next_seq_;
  }
  const bool covered = start != kSnapshotRequest && start <= next &&
                       (start == next || (!kept_.empty() && kept_.front().first <= start));
  if (!covered) {
    ReplySnapshot(identity, delimiter);
    return;
  }
  auto frames = [&](std::string seq, const std::string& payload) {
    std::vector<std::string> f{identity};
    if (delimiter) f.emplace_back();
    f.push_back(std::move(seq));
    f.push_back(payload);
    return f;
  };
  for (const auto& [seq, payload] : kept_) {
    if (seq < start) continue;
    if (!sockets_->SendAll(sockets_->replay, frames(Be64(seq), payload), ZMQ_DONTWAIT)) return;
  }
  sockets_->SendAll(sockets_->replay, frames(Be64(kEndOfReplay), std::string()), ZMQ_DONTWAIT);
}

void KvEventPublisher::ReplySnapshot(const std::string& identity, bool delimiter) {
  auto send = [&](uint64_t marker, const std::string& payload) {
    std::vector<std::string> f{identity};
    if (delimiter) f.emplace_back();
    f.push_back(Be64(marker));
    f.push_back(payload);
    return sockets_->SendAll(sockets_->replay, f, ZMQ_DONTWAIT);
  };
  const auto now = std::chrono::steady_clock::now();
  if (!snapshot_ || (snapshots_.load() > 0 && now - last_snapshot_ < options_.snapshot_interval)) {
    const auto wait = options_.snapshot_interval - (now - last_snapshot_);
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(wait).count();
    if (send(kRetryMarker, Be64(static_cast<uint64_t>(ms > 0 ? ms : 1)))) {
      send(kEndOfReplay, std::string());
    }
    return;
  }
  last_snapshot_ = now;
  snapshots_.fetch_add(1, std::memory_order_relaxed);
  // Live batches numbered from `first_live` apply on top of the snapshot: every change that
  // queued an event before it was published before the keys were read, and a change after
  // it is in a later batch (applying it to a snapshot that already has it changes nothing).
  PublishQueued();
  uint64_t first_live;
  {
    MutexLock lock(&mu_);
    first_live = next_seq_;
  }
  std::vector<std::string> keys;
  snapshot_([&keys](const std::string& key) { keys.push_back(key); });
  if (!send(kSnapshotMarker, Be64(first_live))) return;
  std::vector<Event> batch;
  std::string payload;
  uint64_t event_ids = 0, unparsed = 0;  // snapshot events are numbered on their own
  for (size_t i = 0; i < keys.size(); i += kMaxBatchEvents) {
    batch.clear();
    for (size_t j = i; j < keys.size() && j < i + kMaxBatchEvents; ++j) {
      batch.push_back(MakeEvent(true, std::move(keys[j])));
    }
    if (EncodeBatch(batch, options_.codec, NowMs(), &event_ids, &unparsed, &payload) == 0) {
      continue;
    }
    if (!send(kSnapshotMarker, payload)) return;  // the client is not reading: it stops here
  }
  send(kEndOfReplay, std::string());
}

PublisherStats KvEventPublisher::Stats() const {
  PublisherStats s;
  {
    MutexLock lock(&mu_);
    s.dropped_events = dropped_;
    s.next_sequence = next_seq_;
  }
  s.published_batches = batches_.load();
  s.published_events = events_.load();
  s.skipped_unparsed_keys = unparsed_.load();
  s.replay_requests = replays_.load();
  s.snapshots = snapshots_.load();
  return s;
}

std::string KvEventPublisher::StatusJson() const {
  const PublisherStats s = Stats();
  return "{\"enabled\":true,\"published_batches\":" + std::to_string(s.published_batches) +
         ",\"published_events\":" + std::to_string(s.published_events) +
         ",\"dropped_events\":" + std::to_string(s.dropped_events) +
         ",\"skipped_unparsed_keys\":" + std::to_string(s.skipped_unparsed_keys) +
         ",\"next_sequence\":" + std::to_string(s.next_sequence) +
         ",\"replay_requests\":" + std::to_string(s.replay_requests) +
         ",\"snapshots\":" + std::to_string(s.snapshots) + "}";
}

}  // namespace mooncake::store::kv_events

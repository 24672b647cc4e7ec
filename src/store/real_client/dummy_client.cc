#include "mooncake/store/dummy_client.h"

#include <glog/logging.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "common/net.h"
#include "mooncake/store/store_client.h"
#include "mooncake/store/error_code.h"
#include "store/common/offset_allocator.h"
#include "store/real_client/real_client_wire.h"

namespace mooncake {
namespace store {

namespace {

using Clock = std::chrono::steady_clock;

// Connects, says the hello and reads the config line, all within timeout_ms.
Result<UniqueFd> Join(const std::string& address, int timeout_ms, RealClientConfig* config) {
  MC_ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(address));
  if (!hp.has_port) return Status::InvalidArgument("'" + address + "' has no :port");
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  MC_ASSIGN_OR_RETURN(UniqueFd fd, ConnectTcp(hp.host, hp.port, timeout_ms));
  MC_RETURN_IF_ERROR(WriteFull(fd.get(), kDummyHello, sizeof(kDummyHello) - 1, timeout_ms));
  std::string line;
  while (line.find('\n') == std::string::npos) {
    if (line.size() > kMaxConfigBytes) return Status::DataLoss("config line over 4 KiB");
    const int left = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
    if (left <= 0) return Status::Unavailable("no config from the real client in time");
    pollfd p{fd.get(), POLLIN, 0};
    int n = ::poll(&p, 1, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    char buf[1024];
    ssize_t r = ::recv(fd.get(), buf, sizeof(buf), 0);
    if (r == 0) return Status::Unavailable("the real client closed the connection");
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return ErrnoStatus("recv", errno);
    }
    line.append(buf, static_cast<size_t>(r));
  }
  MC_ASSIGN_OR_RETURN(*config, DecodeConfig(line.substr(0, line.find('\n'))));
  return fd;
}

}  // namespace

class DummyClient::Impl {
 public:
  ~Impl() { Stop(); }

  void Watch() {
    auto last = Clock::now();
    while (!stopping_.load()) {
      if (!fd_.valid()) {
        // Gone: try again every second.
        std::unique_lock<std::mutex> lock(mu_);
        if (cv_.wait_for(lock, std::chrono::seconds(1), [this] { return stopping_.load(); })) {
          break;
        }
        lock.unlock();
        RealClientConfig c;
        auto fd = Join(address, 2000, &c);
        if (!fd.ok()) continue;
        if (!SameCluster(c, config)) {
          LOG(ERROR) << "dummy client: the real client at " << address
                     << " is back with another master, cluster or metadata server ("
                     << c.master_server_address << ", '" << c.store_cluster_id << "', "
                     << c.metadata_server << "); staying disconnected";
          continue;
        }
        LOG(WARNING) << "dummy client: the real client at " << address << " is back (segment "
                     << c.segment_name << "); objects stored in its old segment ("
                     << config.segment_name << ") are gone";
        fd_ = std::move(fd).value();
        last = Clock::now();
        alive_.store(true);
        continue;
      }
      pollfd p{fd_.get(), POLLIN, 0};
      int n = ::poll(&p, 1, 200);
      bool lost = false;
      std::string why;
      if (n > 0) {
        char buf[256];
        ssize_t r = ::recv(fd_.get(), buf, sizeof(buf), MSG_DONTWAIT);
        if (r > 0) {
          last = Clock::now();
        } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
          lost = true;
          why = r == 0 ? "closed the connection" : std::string("recv: ") + std::strerror(errno);
        }
      } else if (n < 0 && errno != EINTR) {
        lost = true;
        why = std::string("poll: ") + std::strerror(errno);
      }
      if (!lost && Clock::now() - last > kLostAfter) {
        lost = true;
        why = "sent no heartbeat for 3 s";
      }
      if (lost) {
        alive_.store(false);
        fd_.Reset();
        LOG(ERROR) << "dummy client: the real client at " << address << " " << why
                   << "; operations fail until it is back";
      }
    }
  }

  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_.store(true);
    }
    cv_.notify_all();
    if (watcher_.joinable()) watcher_.join();
    client.reset();  // closed once the last call holding it ends
  }

  std::string address;
  RealClientConfig config;
  std::shared_ptr<StoreClient> client;
  UniqueFd fd_;  // the watcher's after Create
  std::atomic<bool> alive_{true};
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread watcher_;

  std::mutex pool_mu;
  char* pool = nullptr;
  std::unique_ptr<AddressedAllocator> pool_alloc;
};

std::unique_ptr<DummyClient> DummyClient::Create(uint64_t mem_pool_size,
                                                 uint64_t local_buffer_size,
                                                 const std::string& server_address, int* code,
                                                 std::string* message) {
  auto fail = [&](int c, const std::string& m) -> std::unique_ptr<DummyClient> {
    LOG(ERROR) << "setup_dummy: " << m;
    if (code) *code = c;
    if (message) *message = m;
    return nullptr;
  };
  auto impl = std::make_unique<Impl>();
  impl->address = server_address;
  auto fd = Join(server_address, 5000, &impl->config);
  if (!fd.ok()) {
    return fail(ToInt(ErrorCode::RPC_FAIL), "no real client (mooncake_client) answers at " +
                                                server_address + ": " + fd.status().ToString());
  }
  impl->fd_ = std::move(fd).value();
  const RealClientConfig& rc = impl->config;
  StoreClientOptions o;
  o.client_mode = "dummy";  // its metrics' label (upstream's)
  o.local_hostname = rc.host;
  o.metadata_server = rc.metadata_server;
  o.protocol = rc.protocol.empty() ? "tcp" : rc.protocol;
  o.master_server_addr = rc.master_server_address;
  o.cluster_id = rc.store_cluster_id;  // "": this process's MC_STORE_CLUSTER_ID
  o.tenant_id = rc.tenant_id;          // the real client's: its objects are the same tenant's
  o.global_segment_size = 0;
  o.local_buffer_size = local_buffer_size;
  int c = 0;
  std::string m;
  auto client = StoreClient::Create(o, &c, &m);
  if (!client) return fail(c != 0 ? c : ToInt(ErrorCode::INTERNAL_ERROR), m);
  impl->client = std::shared_ptr<StoreClient>(std::move(client));
  if (mem_pool_size > 0) {
    void* p = impl->client->AllocateSharedBuffer(mem_pool_size);
    if (p == nullptr) {
      impl->client->Close();
      return fail(ToInt(ErrorCode::INTERNAL_ERROR),
                  "cannot allocate the memory pool of " + std::to_string(mem_pool_size) + " bytes");
    }
    impl->pool = static_cast<char*>(p);
    impl->pool_alloc = std::make_unique<AddressedAllocator>(mem_pool_size, 64);
  }
  Impl* raw = impl.get();
  impl->watcher_ = std::thread([raw] { raw->Watch(); });
  LOG(INFO) << "dummy client of the real client at " << server_address << " (segment "
            << rc.segment_name << "): store client " << impl->client->segment_name()
            << ", memory pool " << mem_pool_size << " bytes";
  if (code) *code = 0;
  return std::unique_ptr<DummyClient>(new DummyClient(std::move(impl)));
}

DummyClient::DummyClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DummyClient::~DummyClient() { impl_->Stop(); }

std::shared_ptr<StoreClient> DummyClient::client() const { return impl_->client; }
bool DummyClient::alive() const { return impl_->alive_.load(); }
std::string DummyClient::real_client_address() const { return impl_->address; }

void* DummyClient::AllocFromMemPool(size_t size) {
  std::lock_guard<std::mutex> lock(impl_->pool_mu);
  if (!impl_->pool_alloc) {
    LOG(WARNING) << "alloc_from_mem_pool: this dummy client has no memory pool (mem_pool_size 0)";
    return nullptr;
  }
  if (size == 0) {
    LOG(WARNING) << "alloc_from_mem_pool: zero size";
    return nullptr;
  }
  auto off = impl_->pool_alloc->Allocate(size);
  if (!off) {
    LOG(WARNING) << "alloc_from_mem_pool: " << size << " bytes do not fit in the memory pool";
    return nullptr;
  }
  return impl_->pool + *off;
}

bool DummyClient::FreeToMemPool(void* p) {
  std::lock_guard<std::mutex> lock(impl_->pool_mu);
  if (!impl_->pool_alloc || p < impl_->pool) return false;
  return impl_->pool_alloc->Free(static_cast<uint64_t>(static_cast<char*>(p) - impl_->pool));
}

}  // namespace store
}  // namespace mooncake

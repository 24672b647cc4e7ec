// DummyClient: a Store client that lends no memory of its own and runs beside a real client
// (`mooncake_client`) on the same host, as upstream's setup_dummy.
//
// It asks the real client (at server_address, its --port) which master, metadata server and
// protocol to use, then runs a StoreClient of its own with no global segment: every object
// it puts lands in the pool (normally in the real client's segment) and its engine moves the
// bytes, one copy on the same host (the real client's engine copies straight between its
// segment and this process's memory). Its memory pool (alloc_from_mem_pool) is shareable
// memory registered with that engine, so puts from and gets into it are never staged.
//
// It keeps a connection to the real client (real_client_wire.h): when the real client is gone
// (the connection closes, or no heartbeat for 3 s), alive() turns false; callers then fail
// operations at once instead of reaching a segment that is gone. It reconnects every second;
// when the real client is back with the same master and metadata server, alive() is true
// again (objects stored in the old real client's segment are lost with it).
//
// Thread safety: every method may be called from any thread at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace mooncake {
namespace store {

class StoreClient;

class DummyClient {
 public:
  // Connects to the real client (5 s), starts the store client, allocates the pool
  // (mem_pool_size bytes; 0: none). Null and *code / *message on failure: RPC_FAIL when no
  // real client answers there, else the store client's code.
  static std::unique_ptr<DummyClient> Create(uint64_t mem_pool_size, uint64_t local_buffer_size,
                                             const std::string& server_address, int* code,
                                             std::string* message);
  ~DummyClient();  // stops the watch, closes the client
  DummyClient(const DummyClient&) = delete;
  DummyClient& operator=(const DummyClient&) = delete;

  std::shared_ptr<StoreClient> client() const;
  // False while the real client is gone (see above).
  bool alive() const;
  std::string real_client_address() const;
  // `size` bytes of the pool (64-byte aligned), or null when it does not fit (logged).
  void* AllocFromMemPool(size_t size);
  // Returns a range AllocFromMemPool gave; false for anything else.
  bool FreeToMemPool(void* p);

  class Impl;

 private:
  explicit DummyClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace store
}  // namespace mooncake

// TransferEngine::Impl: the engine's state. transfer_engine.cc holds set-up, registration,
// segments and notifies; transfer_submit.cc the data path (submit, status, sync).
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/batch.h"
#include "engine/memory_registry.h"
#include "engine/segment_cache.h"
#include "engine/transport.h"
#include "common/auth.h"
#include "common/net.h"
#include "common/thread_annotations.h"
#include "metadata/handshake.h"
#include "metadata/metadata_store.h"
#include "metadata/segment_desc.h"
#include "mooncake/transfer_engine.h"

namespace mooncake {

namespace submit {  // the steps of Impl::Submit (transfer_submit.cc)
struct Prepared;
struct PeerRoute;
}  // namespace submit

class TransferEngine::Impl {
 public:
  explicit Impl(const EngineOptions& options);
  ~Impl();

  Status Init(const std::string& metadata, const std::string& local_server_name,
              const std::string& transport);
  void Shutdown();

  Status StartTransports(const std::string& transport);

  // Registration (republished to the store, if any).
  Status Register(const std::vector<RegionInfo>& regions);
  Status Unregister(void* addr);
  // `for_store`: the copy published to the metadata store (anyone who can read the store
  // reads it), as opposed to a handshake reply (only to authenticated peers).
  std::string EncodeLocalDesc(bool for_store = false);
  Status PublishLocalDesc();
  Result<void*> AllocateShared(size_t length, const std::string& location, size_t huge_page_size);
  Status FreeShared(void* addr);

  // Segments. ResolveRpc: the handshake address of a segment (P2P: its name; store mode: its
  // rpc_meta entry). With a secret the entry must be signed by its owner; `auth_name` (if
  // given) receives the name to authenticate to (Authenticator::AuthName).
  Result<HostPort> ResolveRpc(const std::string& name, std::string* auth_name = nullptr);
  // With a secret: PermissionDenied unless `desc` is signed by an engine with the secret and
  // names segment `name` (`source`: where it came from, for the message). OK without one.
  Status VerifyDesc(const SegmentDesc& desc, const std::string& name, const std::string& source);
  // The rpc_meta entry this engine publishes (signed with a secret).
  std::string EncodeRpcMeta();
  Result<SegmentCache::DescPtr> FetchDesc(const std::string& name);
  Result<SegmentID> OpenSegment(const std::string& name);
  // The first installed transport that reaches `peer` and moves bytes between local memory
  // on `local_device` (-1: host) and the peer's buffer `remote`; nullptr if none does.
  Transport* PickTransport(const SegmentDesc& peer, const BufferDesc& remote, int local_device);

  // Data path (transfer_submit.cc).
  Status Submit(BatchID id, const std::vector<TransferRequest>& requests);
  Result<TransferStatus> BatchStatus(BatchID id);
  Status TransferSync(const std::vector<TransferRequest>& requests,
                      std::chrono::milliseconds timeout);
  // Frees batches that TransferSync gave up waiting for, once they have finished.
  void ReapOrphans();
  // Submit's steps. PrepareRequest checks request i, pins its memory into *p (the caller
  // unpins it on error) and finds its route (a peer and a transport), adding routes as needed.
  // A local range inside `run` (the previous request's region, pinned) takes no pin of its
  // own: it joins that region's run (Prepared::in_run).
  Status PrepareRequest(size_t i, const TransferRequest& r,
                        std::vector<submit::PeerRoute>& routes, MemoryRegion* run,
                        submit::Prepared* p);
  // The buffer of the route's descriptor holding r's remote range; refetches the descriptor
  // once per submit when none does (*first_route then names the new route). nullptr: none.
  const BufferDesc* FindRemoteBuffer(const TransferRequest& r,
                                     std::vector<submit::PeerRoute>& routes, size_t* first_route);
  Transport* ChooseTransport(submit::PeerRoute* route, const BufferDesc& remote,
                             int local_device);
  // Cuts the requests of route k into slices (in *slices) and hands them to its transport.
  void SubmitRoute(size_t k, const submit::PeerRoute& route,
                   const std::vector<TransferRequest>& requests,
                   const std::vector<submit::Prepared>& prepared, TransferTask* tasks,
                   std::vector<Slice>* slices);

  // Notifies.
  Result<std::string> HandleHandshake(const HandshakeFrame& request);
  Status SendNotifyTo(const std::string& segment_name, const NotifyDesc& notify);
  Status Probe(const std::string& segment_name);

  const EngineOptions options;
  MemoryRegistry registry;
  BatchTable batches;
  SegmentCache segments;
  HandshakeLimits limits;

  std::atomic<bool> initialized{false};
  bool p2p = true;
  std::unique_ptr<MetadataStore> store;  // null under P2PHANDSHAKE
  std::atomic<bool> store_ok{true};
  std::string local_name;  // segment name
  std::string local_host;
  std::string instance;  // with a secret: this engine start's id (Authenticator::NewInstanceId)
  const Authenticator auth;  // options.auth_secret
  std::string requested_protocol;  // Init's `transport`, as given
  uint16_t rpc_port = 0;
  std::vector<std::unique_ptr<Transport>> transports;
  std::unique_ptr<HandshakeServer> handshake;

  // Held around the registry's lock and the transports' Start / DescribeBuffer (never
  // taken inside them).
  Mutex desc_mu;
  SegmentDesc local_desc MC_GUARDED_BY(desc_mu);  // buffers filled at encode time
  // Serializes PublishLocalDesc (encode, then write to the store): two publishers at once (a
  // registration, a transport's own change) could otherwise land the older one last.
  Mutex publish_mu;

  Mutex shared_mu;
  // addr -> (memfd, length)
  std::map<uint64_t, std::pair<int, size_t>> shared MC_GUARDED_BY(shared_mu);

  Mutex chosen_mu;
  // The last transport logged per segment.
  std::map<std::string, Transport*> chosen MC_GUARDED_BY(chosen_mu);

  // Held around batches' locks (ReapOrphans frees batches under it).
  Mutex orphan_mu;
  std::vector<BatchID> orphans MC_GUARDED_BY(orphan_mu);

  // Received notifies, until GetNotifies drains them. Bounded by count and by bytes, so a
  // peer cannot grow this process without limit when the receiver does not drain.
  static constexpr size_t kMaxQueuedNotifies = 65536;
  static constexpr size_t kMaxQueuedNotifyBytes = 64u << 20;
  Mutex notify_mu;
  std::vector<NotifyDesc> notifies MC_GUARDED_BY(notify_mu);
  size_t notify_bytes MC_GUARDED_BY(notify_mu) = 0;  // name + message bytes in `notifies`
};

}  // namespace mooncake

// LeaderStub: the view read from etcd, the switch to a newer leader, and the failover path of
// a failed call (leader_stub.h says when a call is sent again and the bound).
#include "store/client/leader_stub.h"

#include <glog/logging.h>

#include <algorithm>
#include <cctype>

#include "store/ha/master_view.h"
#include "store/rpc/rpc_client.h"

namespace mooncake {
namespace store {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

int64_t MsUntil(Clock::time_point t) {
  return std::chrono::duration_cast<milliseconds>(t - Clock::now()).count();
}

// A failure that says the master is gone or is not the leader (worth a new view).
bool MasterGone(const Status& s) {
  return s.IsUnavailable() || s.IsDeadlineExceeded() || IsNotLeader(s);
}

std::string Trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

}  // namespace

struct LeaderStub::Leader {
  int64_t version = 0;  // master_view's create_revision
  std::string address;  // its value: the leader's ip:port
  std::shared_ptr<MasterStub> stub;
};

// One call: its first attempt goes to the leader of the moment when it starts; Finish takes
// the failover path when that attempt finds the master gone.
template <class Req, class Resp>
class LeaderStub::Call final : public MasterStub::Pending {
 public:
  using StartFn = Reply<Resp> (MasterStub::*)(const Req&);
  Call(LeaderStub* owner, MasterMethod method, StartFn start, const Req* request)
      : owner_(owner),
        method_(method),
        start_fn_(start),
        request_(request),
        begun_(Clock::now()),
        leader_(owner->Current()),
        reply_(((*leader_->stub).*start)(*request)) {}

  Status Finish(google::protobuf::MessageLite* response, int own_calls) override {
    auto* out = static_cast<Resp*>(response);
    Status s = reply_.Finish(out, own_calls);
    if (s.ok()) return s;
    arrived_ = reply_.MayHaveArrived();
    return owner_->Failover(method_, begun_, leader_, std::move(s), arrived_,
                            [this, out](MasterStub* m, bool* arrived) {
                              Reply<Resp> r = (m->*start_fn_)(*request_);
                              Status st = r.Finish(out);
                              *arrived = r.MayHaveArrived();
                              arrived_ = arrived_ || *arrived;
                              return st;
                            });
  }
  bool MayHaveArrived() const override { return arrived_; }

 private:
  LeaderStub* const owner_;
  const MasterMethod method_;
  const StartFn start_fn_;
  const Req* const request_;
  const Clock::time_point begun_;
  const std::shared_ptr<const Leader> leader_;
  Reply<Resp> reply_;
  bool arrived_ = true;
};

#define MC_X(Name, number, Req, Resp, resend)                                          \
  MasterStub::Reply<rpc::Resp> LeaderStub::Start##Name(const rpc::Req& request) {      \
    return Reply<rpc::Resp>(std::make_unique<Call<rpc::Req, rpc::Resp>>(               \
        this, MasterMethod::k##Name, &MasterStub::Start##Name, &request));             \
  }
MC_MASTER_METHODS(MC_X)
#undef MC_X

LeaderStub::LeaderStub(Options options, std::unique_ptr<EtcdKv> etcd)
    : opt_(std::move(options)), key_(MasterViewKey(opt_.cluster_id)), etcd_(std::move(etcd)) {}

Result<std::unique_ptr<LeaderStub>> LeaderStub::Create(Options options) {
  MC_RETURN_IF_ERROR(CheckStoreClusterId(options.cluster_id));
  if (options.etcd.empty()) return Status::InvalidArgument("no etcd endpoints");
  EtcdKv::Options eo;
  eo.connect_timeout_ms = 500;
  eo.request_timeout_ms = 1000;
  eo.max_response_bytes = 1 << 20;
  MC_ASSIGN_OR_RETURN(auto etcd, EtcdKv::Create(options.etcd, eo));
  std::unique_ptr<LeaderStub> stub(new LeaderStub(std::move(options), std::move(etcd)));
  const Options& o = stub->opt_;
  // A cluster just started, or failing over, names its leader within the bound: wait for it.
  const auto deadline = Clock::now() + o.failover_timeout;
  Status s;
  while (true) {
    s = stub->ReadView(Clock::now(), deadline);
    const bool transient = s.IsNotFound() || s.IsUnavailable() || s.IsDeadlineExceeded();
    if (s.ok() || !transient || Clock::now() + o.retry_interval >= deadline) break;
    std::this_thread::sleep_for(o.retry_interval);
  }
  if (!s.ok()) {
    const std::string what = "no Store master leads cluster '" + o.cluster_id + "': etcd key '" +
                             stub->key_ + "' at " + stub->etcd_->Describe() + ": " +
                             s.message() + " (waited " +
                             std::to_string(o.failover_timeout.count()) +
                             " ms; MC_STORE_CLUSTER_ID must match the masters' --cluster_id)";
    if (s.IsInvalidArgument() || s.code() == Status::Code::kUnimplemented) return Status(s.code(), what);
    return Status::Unavailable(what);
  }
  stub->poller_ = std::thread([p = stub.get()] { p->Poll(); });
  return stub;
}

LeaderStub::~LeaderStub() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  changed_.SignalAll();
  if (poller_.joinable()) poller_.join();
}

std::shared_ptr<const LeaderStub::Leader> LeaderStub::Current() const {
  MutexLock lock(&mu_);
  return leader_;
}

int64_t LeaderStub::view_version() const { return Current()->version; }
std::string LeaderStub::leader_address() const { return Current()->address; }

std::string LeaderStub::address() const {
  auto l = Current();
  return l->address + " (leader of view " + std::to_string(l->version) + " in " +
         etcd_->Describe() + ")";
}

Status LeaderStub::ReadView(Clock::time_point asked, Clock::time_point deadline) {
  MutexLock lock(&read_mu_);
  if (last_read_ >= asked) return last_read_status_;  // read since we asked: share it
  last_read_ = Clock::now();
  // Each endpoint tried gets its share of what is left (at least 50 ms, at most 1 s), so a
  // read ends by `deadline` even with every endpoint black-holed.
  const int64_t n = static_cast<int64_t>(opt_.etcd.size());
  const int per = static_cast<int>(std::clamp<int64_t>(MsUntil(deadline) / n, 50, 1000));
  auto range = etcd_->Range(key_, "", 0, /*keys_only=*/false, per);
  Status s;
  if (!range.ok()) {
    s = range.status();
  } else if (range->kvs.empty()) {
    s = Status::NotFound("the key is absent (no leader elected, or its lease lapsed)");
  } else {
    const EtcdKeyValue& kv = range->kvs[0];
    const std::string value = Trim(kv.value);
    auto hp = ParseMasterViewValue(value);
    if (hp.ok()) {
      Adopt(kv.create_revision, value);
    } else {
      s = hp.status();
    }
  }
  last_read_status_ = s;
  return s;
}

void LeaderStub::Adopt(int64_t version, const std::string& address) {
  std::shared_ptr<const Leader> old;
  {
    MutexLock lock(&mu_);
    if (leader_ && (version < leader_->version ||
                    (version == leader_->version && address == leader_->address))) {
      return;  // never back to an older view
    }
    auto next = std::make_shared<Leader>();
    next->version = version;
    next->address = address;
    next->stub = MakeRpcMasterStub(address, opt_.rpc_timeout);
    old = std::move(leader_);
    leader_ = std::move(next);
  }
  changed_.SignalAll();
  if (old) {
    LOG(INFO) << "store client: following the new leader at " << address << " (view "
              << version << " of " << key_ << "; was " << old->address << ", view "
              << old->version << ")";
  } else {
    LOG(INFO) << "store client: the leader is " << address << " (view " << version << " of "
              << key_ << " in " << etcd_->Describe() << ")";
  }
}

template <class Send>
Status LeaderStub::Failover(MasterMethod method, Clock::time_point start,
                            std::shared_ptr<const Leader> tried, Status failed, bool arrived,
                            Send send) {
  if (!MasterGone(failed)) return failed;
  const std::string name = MethodName(static_cast<uint16_t>(method));
  auto harmless = [&](const Status& s, bool a) {
    return MayResend(method) || !a || IsNotLeader(s);
  };
  auto view = [&] {
    auto cur = Current();
    return "following " + cur->address + ", view " + std::to_string(cur->version) + " of " +
           key_ + " in " + etcd_->Describe();
  };
  if (!harmless(failed, arrived)) {
    {
      MutexLock lock(&mu_);
      poke_ = true;  // the next calls find a new leader sooner
    }
    changed_.SignalAll();
    return Status::Unavailable(name + " failed and was not sent again (the master may have "
                               "acted on it; is the leader changing? " + view() + "): " +
                               failed.message());
  }
  const auto deadline = start + opt_.failover_timeout;
  // The same leader is tried again (after kSameLeaderRetry) only when it answered at once
  // that it is not serving, or could not be reached: one that took the request and never
  // answered would only hold the call up again.
  bool same_again = IsNotLeader(failed) || !arrived;
  Status last = std::move(failed);
  Status read;
  auto last_try = Clock::now();
  while (Clock::now() < deadline) {
    read = ReadView(Clock::now(), deadline);
    auto cur = Current();
    const auto now = Clock::now();
    if (now >= deadline) break;
    if (cur != tried || (same_again && now - last_try >= kSameLeaderRetry)) {
      // The resend's RPC timeout is what is left of the bound, at most rpc_timeout.
      const auto left = std::chrono::duration_cast<milliseconds>(deadline - now);
      std::shared_ptr<MasterStub> target =
          left >= opt_.rpc_timeout ? cur->stub
                                   : MakeRpcMasterStub(cur->address, std::max(left, milliseconds(1)));
      bool a = true;
      Status s = send(target.get(), &a);
      last_try = Clock::now();
      tried = cur;
      if (s.ok() || !MasterGone(s)) {
        // Once per view: a failover may resend thousands of calls.
        if (logged_view_.exchange(cur->version) != cur->version) {
          LOG(INFO) << name << " (and maybe other calls) sent again to " << cur->address
                    << " (view " << cur->version << ") after: " << last.message();
        }
        return s;
      }
      same_again = IsNotLeader(s) || !a;
      last = std::move(s);
      if (!harmless(last, a)) {
        return Status::Unavailable(name + " failed and was not sent again (the master may "
                                   "have acted on it; " + view() + "): " + last.message());
      }
      continue;  // re-read the view at once
    }
    MutexLock lock(&mu_);
    if (leader_ == cur && !stopping_) {
      changed_.WaitUntil(&mu_, std::min(now + opt_.retry_interval, deadline));
    }
  }
  return Status::Unavailable(
      name + ": no leader answered within " + std::to_string(opt_.failover_timeout.count()) +
      " ms of the call (" + view() + (read.ok() ? "" : "; etcd: " + read.message()) +
      "); last: " + last.message());
}

void LeaderStub::Poll() {
  bool failing = false;
  while (true) {
    {
      MutexLock lock(&mu_);
      const auto due = Clock::now() + opt_.poll_interval;
      while (!stopping_ && !poke_ && changed_.WaitUntil(&mu_, due)) {
      }
      if (stopping_) return;
      poke_ = false;
    }
    const auto now = Clock::now();
    Status s = ReadView(now, now + std::chrono::seconds(2));
    if (!s.ok() && !failing) {
      LOG(WARNING) << "store client: cannot read the leader from " << key_ << " in "
                   << etcd_->Describe() << ": " << s.message() << " (still following "
                   << leader_address() << ")";
    } else if (s.ok() && failing) {
      LOG(INFO) << "store client: " << key_ << " readable again";
    }
    failing = !s.ok();
  }
}

Result<std::unique_ptr<MasterStub>> MakeMasterStub(const std::string& master_server_addr,
                                                   const std::string& cluster_id,
                                                   std::chrono::milliseconds rpc_timeout,
                                                   std::chrono::milliseconds failover_timeout) {
  const size_t sep = master_server_addr.find("://");
  if (sep == std::string::npos) return MakeRpcMasterStub(master_server_addr, rpc_timeout);
  std::string scheme = master_server_addr.substr(0, sep);
  std::transform(scheme.begin(), scheme.end(), scheme.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (scheme != "etcd") {
    const bool upstream = scheme == "redis" || scheme == "k8s";
    return Status::InvalidArgument(
        "master_server_addr '" + master_server_addr + "': " +
        (upstream ? "upstream's " + scheme + " HA backend is not provided"
                  : "unknown scheme '" + scheme + "'") +
        "; this build follows leaders through etcd only (etcd://h1:2379;h2:2379) or takes "
        "the master's host:port");
  }
  auto endpoints = ParseEtcdEndpoints(master_server_addr.substr(sep + 3));
  if (!endpoints.ok()) {
    return endpoints.status().WithContext("master_server_addr '" + master_server_addr + "'");
  }
  LeaderStub::Options o;
  o.etcd = std::move(endpoints).value();
  o.cluster_id = cluster_id;
  o.rpc_timeout = rpc_timeout;
  o.failover_timeout = failover_timeout;
  auto stub = LeaderStub::Create(std::move(o));
  if (!stub.ok()) return stub.status();
  return std::unique_ptr<MasterStub>(std::move(stub).value());
}

}  // namespace store
}  // namespace mooncake

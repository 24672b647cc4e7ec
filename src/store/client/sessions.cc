#include "store/client/sessions.h"

#include <glog/logging.h>

#include "mooncake/store/error_code.h"

namespace mooncake {
namespace store {

GetSessions::~GetSessions() {
  MutexLock lock(&mu_);
  while (!sessions_.empty()) EndLocked(sessions_.begin(), 0);
}

void GetSessions::EndLocked(Map::iterator it, uint64_t lease_id) {
  reads_->EndOne(it->second.mark, it->second.hash, lease_id);
  sessions_.erase(it);
}

void GetSessions::Start(const std::vector<std::string>& keys, std::vector<KeyPlan>* plans,
                        const std::vector<uint64_t>& lease_ids,
                        const std::vector<ReadTracker::Mark*>& marks) {
  MutexLock lock(&mu_);
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint64_t hash = ReadTracker::Hash(keys[i]);
    KeyPlan& plan = (*plans)[i];
    auto it = sessions_.find(keys[i]);
    if (plan.code != 0 || it != sessions_.end()) {
      reads_->EndOne(marks[i], hash, 0);  // the session keeps its own mark, or there is none
      if (plan.code != 0 && it != sessions_.end()) EndLocked(it, 0);  // a failed restart
      if (plan.code != 0) continue;
    } else {
      it = sessions_.emplace(keys[i], Session()).first;
      it->second.mark = marks[i];
      it->second.hash = hash;
    }
    it->second.plan = std::move(plan);
    it->second.lease_id = lease_ids[i];
  }
}

std::vector<KeyPlan> GetSessions::Find(const std::vector<std::string>& keys) {
  std::vector<KeyPlan> plans(keys.size());
  MutexLock lock(&mu_);
  for (size_t i = 0; i < keys.size(); ++i) {
    auto it = sessions_.find(keys[i]);
    if (it == sessions_.end()) {
      LOG(WARNING) << "batch_get_into_multi_buffer_ranges: " << keys[i]
                   << " has no get session (call batch_get_session_start first)";
      plans[i].code = ToInt(ErrorCode::INVALID_PARAMS);
      continue;
    }
    plans[i] = it->second.plan;
  }
  return plans;
}

void GetSessions::EndWhere(const std::vector<std::string>& keys, const std::vector<char>& end) {
  MutexLock lock(&mu_);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!end[i]) continue;
    auto it = sessions_.find(keys[i]);
    if (it != sessions_.end()) EndLocked(it, 0);
  }
}

void GetSessions::End(const std::vector<std::string>& keys) {
  MutexLock lock(&mu_);
  for (const auto& k : keys) {
    auto it = sessions_.find(k);
    if (it != sessions_.end()) EndLocked(it, it->second.lease_id);
  }
}

std::vector<size_t> PutSessions::Absent(const std::vector<std::string>& keys) {
  std::vector<size_t> idx;
  MutexLock lock(&mu_);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (sessions_.count(keys[i])) {
      LOG(WARNING) << "batch_put_session_start " << keys[i] << ": a put session of the key is "
                   << "open (end or revoke it first)";
      continue;
    }
    idx.push_back(i);
  }
  return idx;
}

void PutSessions::Open(const std::string& key, uint64_t size, std::vector<rpc::Replica> replicas) {
  MutexLock lock(&mu_);
  Session& s = sessions_[key];
  s.size = size;
  s.replicas = std::move(replicas);
}

std::vector<PutSessions::Session*> PutSessions::BeginWrites(const std::vector<std::string>& keys) {
  std::vector<Session*> out(keys.size(), nullptr);
  MutexLock lock(&mu_);
  for (size_t i = 0; i < keys.size(); ++i) {
    auto it = sessions_.find(keys[i]);
    if (it == sessions_.end()) {
      LOG(WARNING) << "batch_put_from_multi_buffer_ranges: " << keys[i]
                   << " has no put session (call batch_put_session_start first)";
      continue;
    }
    out[i] = &it->second;  // stable: Close waits for `writing` to drop
    ++out[i]->writing;
  }
  return out;
}

void PutSessions::EndWrites(const std::vector<Session*>& sessions) {
  {
    MutexLock lock(&mu_);
    for (Session* s : sessions) {
      if (s) --s->writing;
    }
  }
  written_.SignalAll();
}

bool PutSessions::Close(const std::string& key) {
  MutexLock lock(&mu_);
  while (true) {
    auto it = sessions_.find(key);
    if (it == sessions_.end()) return false;
    if (it->second.writing == 0) {
      sessions_.erase(it);
      return true;
    }
    written_.Wait(&mu_);
  }
}

}  // namespace store
}  // namespace mooncake

// RpcServer's waiting requests (rpc_server.h, "Waiting requests"): a request whose handler
// answered kWaitForWake waits on its loop, in Loop::waiting, until WakeWaiting(its topic)
// reruns its handler or its deadline answers "nothing now" (kOk, empty payload).
//
// No wake is lost. A wake that comes between a handler's run and its request's wait may
// find no request waiting and skip the topic (it only counts itself in wakes_); a request
// reruns once if any wake came after the count it read before its handler ran (Job::fresh).
// A wake that finds requests waiting records its topic for every loop and writes their
// eventfds; a loop that then begins a wait sees the topic (Loop::any_woken: it does not sleep
// while a woken topic is unlooked at).
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "store/rpc/rpc_server_internal.h"

namespace mooncake {
namespace store {

namespace {

// AskToWait's words: the wait in ms (8 bytes, little-endian), then the topic.
constexpr size_t kWaitWordsBytes = 8;

bool ReadWait(const char* p, size_t n, std::chrono::milliseconds* wait, std::string* topic) {
  if (n < kWaitWordsBytes) return false;
  uint64_t ms = 0;
  for (size_t i = 0; i < kWaitWordsBytes; ++i) ms |= uint64_t{static_cast<uint8_t>(p[i])} << (8 * i);
  *wait = std::chrono::milliseconds(std::min<uint64_t>(ms, INT32_MAX));
  topic->assign(p + kWaitWordsBytes, n - kWaitWordsBytes);
  return true;
}

// The frame of "nothing now": the method's response with every field at its default.
void NothingFrame(std::string* frame, uint16_t method, uint32_t seq) {
  frame->assign(kFrameHeaderBytes, '\0');
  EncodeHeader(&(*frame)[0], FrameHeader{method, static_cast<uint16_t>(RpcStatus::kOk), seq, 0});
}

}  // namespace

void RpcServer::AskToWait(std::string* out, const std::string& topic,
                          std::chrono::milliseconds wait) {
  const uint64_t ms = static_cast<uint64_t>(std::max<int64_t>(0, wait.count()));
  for (size_t i = 0; i < kWaitWordsBytes; ++i) out->push_back(static_cast<char>(ms >> (8 * i)));
  out->append(topic);
}

bool RpcServer::StartWaiting(Loop* loop, Conn* c, const FrameHeader& h, const char* payload,
                             size_t base, uint64_t wakes_before) {
  const size_t words = base + kFrameHeaderBytes;
  std::chrono::milliseconds wait{0};
  std::string topic;
  const bool asked = ReadWait(c->out.data() + words, c->out.size() - words, &wait, &topic);
  c->out.resize(words);  // AskToWait's words are never sent
  wait = std::min(wait, options_.max_wait);
  if (!asked || wait.count() <= 0) return false;  // "nothing now", at once
  auto job = JobFor(loop, c, h);
  job->payload.assign(payload, h.length);
  job->topic = std::move(topic);
  job->deadline = Clock::now() + wait;
  job->wakes = wakes_before;
  job->fresh = true;
  c->out.resize(base);  // the reply is made when it is answered
  c->busy = true;
  c->waiting = true;
  c->job_bytes = h.length;  // charged until it is answered, as a request on the worker
  loop->waiting.push_back(std::move(job));
  ++waiting_;
  return true;
}

void RpcServer::WakeWaiting(const std::string& topic) {
  ++wakes_;
  if (waiting_.load() == 0) return;  // a request about to wait reruns (wakes_ moved)
  for (auto& l : loops_) {
    {
      MutexLock lock(&l->woken_mu);
      l->woken.insert(topic);
    }
    l->any_woken.store(true);
    uint64_t one = 1;
    (void)!write(l->wake, &one, sizeof(one));
  }
}

int RpcServer::WaitTimeoutMs(Loop* loop, int wait_ms) const {
  if (loop->waiting.empty()) return wait_ms;
  if (loop->any_woken.load()) return 0;
  const auto now = Clock::now();
  for (const auto& j : loop->waiting) {
    if (j->fresh) return 0;
    const auto left =
        std::chrono::ceil<std::chrono::milliseconds>(std::max(j->deadline - now, Clock::duration{0}));
    wait_ms = std::min<int>(wait_ms, static_cast<int>(left.count()));
  }
  return std::max(wait_ms, 0);
}

void RpcServer::RunWaiting(Loop* loop) {
  std::unordered_set<std::string> woken;
  if (loop->any_woken.exchange(false)) {
    MutexLock lock(&loop->woken_mu);
    woken.swap(loop->woken);
  }
  if (loop->waiting.empty()) return;
  const auto now = Clock::now();
  const uint64_t wakes = wakes_.load();
  std::vector<std::unique_ptr<Job>> answered;
  std::vector<std::unique_ptr<Job>> still;
  std::vector<std::unique_ptr<Job>> list;
  list.swap(loop->waiting);
  for (auto& job : list) {
    const bool rerun = woken.count(job->topic) > 0 || (job->fresh && job->wakes != wakes);
    job->fresh = false;
    if (now < job->deadline && !rerun) {
      still.push_back(std::move(job));
      continue;
    }
    RpcStatus st = RpcStatus::kOk;
    if (now >= job->deadline) {
      NothingFrame(&job->reply, job->method, job->seq);
    } else {
      job->reply.assign(kFrameHeaderBytes, '\0');
      job->wakes = wakes;
      st = handler_(job->method, job->payload.data(), job->payload.size(), &job->reply);
      if (st == kWaitForWake) {
        std::chrono::milliseconds ignored{0};
        std::string topic;
        if (ReadWait(job->reply.data() + kFrameHeaderBytes,
                     job->reply.size() - kFrameHeaderBytes, &ignored, &topic)) {
          job->topic = std::move(topic);  // its first deadline stays
          still.push_back(std::move(job));
          continue;
        }
        st = RpcStatus::kOk;
        job->reply.resize(kFrameHeaderBytes);
      }
      EncodeHeader(&job->reply[0],
                   FrameHeader{job->method, static_cast<uint16_t>(st), job->seq,
                               static_cast<uint32_t>(job->reply.size() - kFrameHeaderBytes)});
    }
    --waiting_;
    if (auto it = loop->conns.find(job->fd);
        it != loop->conns.end() && it->second->id == job->conn_id) {
      it->second->waiting = false;  // still busy until its reply goes
    }
    if (options_.hold_position) {
      const uint64_t pos = options_.hold_position(job->method, st);
      if (pos != 0 && Park(pos, &job)) continue;
    }
    answered.push_back(std::move(job));
  }
  // Requests that began to wait meanwhile (a handler's, none here) come after these.
  for (auto& job : loop->waiting) still.push_back(std::move(job));
  loop->waiting.swap(still);
  // Answering serves each connection's next requests, which may begin to wait.
  for (auto& job : answered) Answer(loop, std::move(job));
}

void RpcServer::EndWaiting(Loop* loop, Conn* c) {
  auto& w = loop->waiting;
  auto it = std::find_if(w.begin(), w.end(), [&](const std::unique_ptr<Job>& j) {
    return j->fd == c->fd && j->conn_id == c->id;
  });
  if (it == w.end()) return;
  std::unique_ptr<Job> job = std::move(*it);
  w.erase(it);
  --waiting_;
  NothingFrame(&job->reply, job->method, job->seq);
  Answer(loop, std::move(job));
}

void RpcServer::DropWaiting(Loop* loop, const Conn* c) {
  auto& w = loop->waiting;
  const size_t before = w.size();
  w.erase(std::remove_if(w.begin(), w.end(),
                         [&](const std::unique_ptr<Job>& j) {
                           return j->fd == c->fd && j->conn_id == c->id;
                         }),
          w.end());
  waiting_ -= before - w.size();
}

}  // namespace store
}  // namespace mooncake

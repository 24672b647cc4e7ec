// Compact parts of the master's per-object record (master_service_internal.h), so that ten
// million objects fit in a few GiB:
// - ClientName: a client id shared by every record naming it (an object's writer and its
//   latest lease holder): 8 bytes per record instead of a 32-byte std::string plus a heap copy
//   of the 32-hex-digit id. Interned in the master's ClientNames; an entry goes with its last
//   reference. Not thread safe: used under the master's lock.
// - Replicas: an object's replica placements, the first inline (replica_num 1, the usual case,
//   needs no heap block), more on the heap.
// - RecordList: a list threaded through the records themselves (puts in flight, objects in
//   order of last access), so that keeping the order costs no allocation and eviction or
//   discarding stale puts never walks the whole table.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace mooncake {
namespace store {

class ClientNames;

class ClientName {
 public:
  ClientName() = default;
  ClientName(const ClientName& o) : e_(o.e_) {
    if (e_) ++e_->refs;
  }
  ClientName(ClientName&& o) noexcept : e_(o.e_) { o.e_ = nullptr; }
  ClientName& operator=(ClientName o) noexcept {
    std::swap(e_, o.e_);
    return *this;
  }
  ~ClientName() { Release(); }

  // The id ("" for a default-constructed name).
  const std::string& str() const;
  bool operator==(const std::string& s) const { return str() == s; }
  bool operator!=(const std::string& s) const { return !(*this == s); }

 private:
  friend class ClientNames;
  struct Entry {
    std::string name;
    size_t refs;
    ClientNames* table;
  };
  explicit ClientName(Entry* e) : e_(e) { ++e_->refs; }
  inline void Release();
  Entry* e_ = nullptr;
};

class ClientNames {
 public:
  ClientNames() = default;
  ClientNames(const ClientNames&) = delete;
  ClientNames& operator=(const ClientNames&) = delete;

  ClientName Get(const std::string& name) {
    auto it = entries_.find(name);
    if (it != entries_.end()) return ClientName(it->second.get());
    auto e = std::make_unique<ClientName::Entry>(ClientName::Entry{name, 0, this});
    ClientName::Entry* raw = e.get();
    entries_.emplace(std::string_view(raw->name), std::move(e));
    return ClientName(raw);
  }
  size_t size() const { return entries_.size(); }

 private:
  friend class ClientName;
  void Drop(ClientName::Entry* e) { entries_.erase(std::string_view(e->name)); }
  // Keyed by a view of the entry's own name (entries do not move).
  std::unordered_map<std::string_view, std::unique_ptr<ClientName::Entry>> entries_;
};

inline const std::string& ClientName::str() const {
  static const std::string empty;
  return e_ ? e_->name : empty;
}

inline void ClientName::Release() {
  if (e_ && --e_->refs == 0) e_->table->Drop(e_);
  e_ = nullptr;
}

// Where one replica lies: the segment, the offset in it, and the segment allocator's handle
// (what freeing it needs). 16 bytes: segment ids are below 2^32 (MountSegment refuses more).
struct Placement {
  uint32_t segment_id;
  uint32_t handle;
  uint64_t offset;
};

class Replicas {
 public:
  Replicas() = default;
  Replicas(const Replicas& o) { *this = o; }
  Replicas(Replicas&& o) noexcept { Steal(&o); }
  Replicas& operator=(const Replicas& o) {
    if (this == &o) return *this;
    clear();
    for (const Placement& p : o) push_back(p);
    return *this;
  }
  Replicas& operator=(Replicas&& o) noexcept {
    if (this != &o) {
      FreeHeap();
      Steal(&o);
    }
    return *this;
  }
  ~Replicas() { FreeHeap(); }

  Placement* begin() { return data(); }
  Placement* end() { return data() + n_; }
  const Placement* begin() const { return data(); }
  const Placement* end() const { return data() + n_; }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  void clear() { n_ = 0; }

  void push_back(const Placement& p) {
    if (n_ == cap_) Grow();
    data()[n_++] = p;
  }
  Placement* erase(Placement* first, Placement* last) {
    std::memmove(first, last, static_cast<size_t>(end() - last) * sizeof(Placement));
    n_ -= static_cast<uint32_t>(last - first);
    return first;
  }
  Placement* erase(Placement* pos) { return erase(pos, pos + 1); }

 private:
  Placement* data() { return cap_ == 1 ? &one_ : many_; }
  const Placement* data() const { return cap_ == 1 ? &one_ : many_; }
  void Grow() {
    const uint32_t cap = cap_ * 2;
    Placement* heap = new Placement[cap];
    std::memcpy(heap, data(), n_ * sizeof(Placement));
    FreeHeap();
    many_ = heap;
    cap_ = cap;
  }
  void FreeHeap() {
    if (cap_ > 1) delete[] many_;
    cap_ = 1;
  }
  void Steal(Replicas* o) {
    n_ = o->n_;
    cap_ = o->cap_;
    if (cap_ == 1) {
      one_ = o->one_;
    } else {
      many_ = o->many_;
    }
    o->n_ = 0;
    o->cap_ = 1;
  }

  uint32_t n_ = 0;
  uint32_t cap_ = 1;  // 1: the placement is inline (one_); more: many_ holds cap_ of them
  union {
    Placement one_{0, 0, 0};
    Placement* many_;
  };
};

// A doubly linked list through links in the records: E is a table entry (a key, value pair
// whose node never moves) and E::second has `E* prev, *next` and `uint8_t list` (the id of
// the list holding it, 0 for none). Adding at the back, removing and moving to the back are
// O(1). Not thread safe.
template <class E>
class RecordList {
 public:
  explicit RecordList(uint8_t id) : id_(id) {}
  RecordList(const RecordList&) = delete;
  RecordList& operator=(const RecordList&) = delete;

  uint8_t id() const { return id_; }
  size_t size() const { return size_; }
  E* front() const { return head_; }
  static E* next(const E* e) { return e->second.next; }
  bool contains(const E* e) const { return e->second.list == id_; }

  void push_back(E* e) {
    e->second.list = id_;
    e->second.prev = tail_;
    e->second.next = nullptr;
    (tail_ ? tail_->second.next : head_) = e;
    tail_ = e;
    ++size_;
  }
  // `e` must be in this list.
  void remove(E* e) {
    (e->second.prev ? e->second.prev->second.next : head_) = e->second.next;
    (e->second.next ? e->second.next->second.prev : tail_) = e->second.prev;
    e->second.prev = e->second.next = nullptr;
    e->second.list = 0;
    --size_;
  }

 private:
  const uint8_t id_;
  E* head_ = nullptr;
  E* tail_ = nullptr;
  size_t size_ = 0;
};

}  // namespace store
}  // namespace mooncake

// Reading records of bucket files back (bucket_file.h): through the page cache, with
// O_DIRECT, and several with O_DIRECT with the next read in flight.
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>

#include "common/crc32c.h"
#include "store/disk/bucket_file.h"
#include "store/disk/bucket_io.h"
#include "store/disk/io_helper.h"

namespace mooncake {
namespace store {
namespace disk {
namespace {

// The record's header and key (read into `head`) and its value (at dst) against `ref`.
Status CheckRecord(const char* head, const RecordRef& ref, const void* dst) {
  const size_t key_len = ref.key.size();
  uint32_t key_len_on_disk = 0;
  uint64_t value_len = 0;
  uint64_t put_id = 0;
  uint32_t crc = 0;
  if (!DecodeRecordHeader(head, &key_len_on_disk, &value_len, &put_id, &crc)) {
    return Status::DataLoss("the record header of \"" + ref.key + "\" fails its checksum");
  }
  if (key_len_on_disk != key_len || value_len != ref.value_len || put_id != ref.put_id ||
      crc != ref.data_crc || std::memcmp(head + kRecordHeaderSize, ref.key.data(), key_len) != 0) {
    return Status::DataLoss("the record at offset " + std::to_string(ref.offset) +
                            " is not the one indexed for \"" + ref.key + "\"");
  }
  uint32_t c = Crc32c(0, head + kRecordHeaderSize, key_len);
  c = Crc32c(c, dst, ref.value_len);
  if (c != crc) {
    return Status::DataLoss("the record of \"" + ref.key + "\" fails its CRC32C (" +
                            std::to_string(ref.value_len) + " bytes): the file is corrupted");
  }
  return Status::OK();
}

uint64_t RecordEnd(const RecordRef& ref) {
  return ref.offset + kRecordHeaderSize + ref.key.size() + ref.value_len;
}
uint64_t BlockDown(uint64_t n) { return n / kDirectAlign * kDirectAlign; }
uint64_t BlockUp(uint64_t n) { return (n + kDirectAlign - 1) / kDirectAlign * kDirectAlign; }

Status CutShort(const RecordRef& ref, uint64_t missing) {
  return Status::DataLoss("the record of \"" + ref.key + "\" is cut short: the file ends " +
                          std::to_string(missing) + " bytes early");
}

// What a failed direct read of a record says (errno set): InvalidArgument where the file
// system takes no direct reads.
Status DirectReadFailed() {
  return errno == EINVAL ? Status::InvalidArgument(Errno("cannot read a record directly"))
                         : Status::Internal(Errno("cannot read a record"));
}

// Reads the blocks [at, at + want) of a file opened with O_DIRECT into buf (aligned): the
// bytes read, fewer only where the file ends, or -1 with errno set.
ssize_t PreadDirect(int fd, char* buf, size_t want, uint64_t at) {
  size_t got = 0;
  while (got < want) {
    const ssize_t r = ::pread(fd, buf + got, want - got, static_cast<off_t>(at + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) break;
    got += static_cast<size_t>(r);
    if (got % kDirectAlign != 0) break;  // only the file's end stops a read there
  }
  return static_cast<ssize_t>(got);
}

// Copies what of `ref`'s record the file's bytes [at, got_end) (in buf) hold: its header and
// key into head, its value into dst.
void CopyOut(const char* buf, uint64_t at, uint64_t got_end, const RecordRef& ref, char* head,
             char* dst) {
  const uint64_t head_len = kRecordHeaderSize + ref.key.size();
  const uint64_t begin = ref.offset;
  const uint64_t lo = std::max(at, begin);
  const uint64_t hi = std::min(got_end, RecordEnd(ref));
  for (uint64_t x = lo; x < hi;) {
    const uint64_t rel = x - begin;
    if (rel < head_len) {
      const uint64_t n = std::min(hi - x, head_len - rel);
      std::memcpy(head + rel, buf + (x - at), n);
      x += n;
    } else {
      std::memcpy(dst + (rel - head_len), buf + (x - at), hi - x);
      x = hi;
    }
  }
}

}  // namespace

Status ReadRecord(int fd, const RecordRef& ref, void* dst) {
  char head[kRecordHeaderSize + kMaxKeyLen];
  const size_t key_len = ref.key.size();
  iovec iov[2] = {{head, kRecordHeaderSize + key_len}, {dst, ref.value_len}};
  const size_t want = kRecordHeaderSize + key_len + ref.value_len;
  size_t got = 0;
  int first = 0;
  while (got < want) {
    const ssize_t r = ::preadv(fd, iov + first, 2 - first, static_cast<off_t>(ref.offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Status::Internal(Errno("cannot read a record"));
    if (r == 0) return CutShort(ref, want - got);
    got += static_cast<size_t>(r);
    size_t left = static_cast<size_t>(r);
    while (left > 0) {
      if (left >= iov[first].iov_len) {
        left -= iov[first].iov_len;
        iov[first].iov_len = 0;
        ++first;
      } else {
        iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
        iov[first].iov_len -= left;
        left = 0;
      }
    }
    while (first < 2 && iov[first].iov_len == 0) ++first;
  }
  return CheckRecord(head, ref, dst);
}

namespace {

// ReadRecordDirect through `buf`, an aligned chunk of kDirectChunk bytes.
Status ReadRecordDirectVia(char* buf, int fd, const RecordRef& ref, void* dst) {
  // The blocks covering the record, read a chunk at a time and copied out: the header and
  // key into `head`, the value into dst.
  char head[kRecordHeaderSize + kMaxKeyLen];
  const uint64_t end = RecordEnd(ref);
  for (uint64_t at = BlockDown(ref.offset); at < end;) {
    const size_t want = std::min<uint64_t>(kDirectChunk, BlockUp(end - at));
    const ssize_t r = PreadDirect(fd, buf, want, at);
    if (r < 0) return DirectReadFailed();
    const uint64_t got_end = at + static_cast<uint64_t>(r);
    CopyOut(buf, at, got_end, ref, head, static_cast<char*>(dst));
    if (got_end < end && static_cast<size_t>(r) < want) return CutShort(ref, end - got_end);
    at = got_end;
  }
  return CheckRecord(head, ref, dst);
}

}  // namespace

Status ReadRecordDirect(int fd, const RecordRef& ref, void* dst) {
  char* const buf = ThreadChunks();
  if (buf == nullptr) return Status::ResourceExhausted("no memory for a direct read's chunk");
  return ReadRecordDirectVia(buf, fd, ref, dst);
}

void ReadRecordsDirect(std::vector<DirectRead>* reads) {
  std::vector<DirectRead>& rs = *reads;
  const size_t n = rs.size();
  // A helper thread reads the records one after the other into the calling thread's two
  // chunks (ThreadChunks) while this thread copies each out and checks it: record i goes to
  // chunk i % 2, and record i + 2 waits for record i to be out. A record larger than a chunk
  // is read here, in its turn, through its own chunk i % 2 (free then: the helper's next
  // use of it is record i + 2's).
  char* const mem = n < 2 ? nullptr : ThreadChunks();
  struct Got {
    bool here = false;  // not read by the helper
    ssize_t n = 0;
    int err = 0;
  };
  std::vector<Got> got(n);
  std::mutex mu;
  std::condition_variable cv;
  size_t read = 0, taken = 0;  // records read by the helper; records checked here
  auto io = [&] {
    for (size_t i = 0; i < n; ++i) {
      {
        std::unique_lock<std::mutex> l(mu);
        cv.wait(l, [&] { return i < taken + 2; });
      }
      const RecordRef& ref = *rs[i].ref;
      const uint64_t at = BlockDown(ref.offset);
      const uint64_t len = BlockUp(RecordEnd(ref)) - at;
      if (len > kDirectChunk) {
        got[i].here = true;
      } else {
        got[i].n = PreadDirect(rs[i].fd, mem + (i % 2) * kDirectChunk, len, at);
      }
      if (got[i].n < 0) got[i].err = errno;
      {
        std::lock_guard<std::mutex> l(mu);
        read = i + 1;
      }
      cv.notify_all();
    }
  };
  // A helper of this call's own (a thread per request), not a kept one as the offload
  // worker's bucket writes have: with a kept one (per thread), same-host batch gets of
  // disk-resident 1 MiB objects ran slower end to end in 11 of 12 interleaved pairs
  // (bench/results/2026-12-06-disk-io-helper.md), ReadMany alone the same either way; the
  // cause is not found.
  IoHelper helper;
  if (mem == nullptr || !helper.Post(io)) {  // one at a time
    for (DirectRead& r : rs) r.status = ReadRecordDirect(r.fd, *r.ref, r.dst);
    return;
  }
  char head[kRecordHeaderSize + kMaxKeyLen];
  for (size_t i = 0; i < n; ++i) {
    {
      std::unique_lock<std::mutex> l(mu);
      cv.wait(l, [&] { return read > i; });
    }
    DirectRead& r = rs[i];
    const RecordRef& ref = *r.ref;
    if (got[i].here) {
      r.status = ReadRecordDirectVia(mem + (i % 2) * kDirectChunk, r.fd, ref, r.dst);
    } else if (got[i].n < 0) {
      errno = got[i].err;
      r.status = DirectReadFailed();
    } else {
      const uint64_t at = BlockDown(ref.offset);
      const uint64_t got_end = at + static_cast<uint64_t>(got[i].n);
      CopyOut(mem + (i % 2) * kDirectChunk, at, got_end, ref, head, static_cast<char*>(r.dst));
      r.status = got_end < RecordEnd(ref) ? CutShort(ref, RecordEnd(ref) - got_end)
                                          : CheckRecord(head, ref, r.dst);
    }
    {
      std::lock_guard<std::mutex> l(mu);
      taken = i + 1;
    }
    cv.notify_all();
  }
  helper.Wait();
}

}  // namespace disk
}  // namespace store
}  // namespace mooncake

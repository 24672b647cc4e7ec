#include "store/disk/bucket_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <climits>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>

#include "common/crc32c.h"
#include "store/disk/bucket_io.h"
#include "store/disk/io_helper.h"

namespace mooncake {
namespace store {
namespace disk {

namespace {

constexpr char kFileMagic[8] = {'M', 'C', 'B', 'U', 'C', 'K', 'T', '1'};
constexpr char kTrailerMagic[8] = {'M', 'C', 'B', 'T', 'R', 'A', 'I', 'L'};
constexpr uint32_t kRecordMagic = 0x4452434d;  // "MCRD"
constexpr uint32_t kVersion = 1;
constexpr size_t kIndexEntryFixed = 32;
const char kZeros[8] = {};

uint64_t Align8(uint64_t n) { return (n + 7) & ~uint64_t{7}; }

template <typename T>
void Put(char* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}
template <typename T>
T Get(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

void EncodeRecordHeader(char* h, uint32_t key_len, uint64_t value_len, uint64_t put_id,
                        uint32_t data_crc) {
  Put<uint32_t>(h, kRecordMagic);
  Put<uint32_t>(h + 4, key_len);
  Put<uint64_t>(h + 8, value_len);
  Put<uint64_t>(h + 16, put_id);
  Put<uint32_t>(h + 24, data_crc);
  Put<uint32_t>(h + 28, Crc32c(0, h, 28));
}

// Writes every byte of `iov` (advancing through partial writes, IOV_MAX at a time).
bool WriteAll(int fd, std::vector<iovec> iov) {
  size_t i = 0;
  while (i < iov.size()) {
    const int n = static_cast<int>(std::min<size_t>(iov.size() - i, IOV_MAX));
    const ssize_t w = ::writev(fd, iov.data() + i, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    size_t left = static_cast<size_t>(w);
    while (left > 0 && i < iov.size()) {
      if (left >= iov[i].iov_len) {
        left -= iov[i].iov_len;
        ++i;
      } else {
        iov[i].iov_base = static_cast<char*>(iov[i].iov_base) + left;
        iov[i].iov_len -= left;
        left = 0;
      }
    }
    while (i < iov.size() && iov[i].iov_len == 0) ++i;
  }
  return true;
}

// Writes n bytes at off; 0 or the errno.
int PwriteAll(int fd, const char* p, size_t n, uint64_t off) {
  size_t done = 0;
  while (done < n) {
    const ssize_t w = ::pwrite(fd, p + done, n - done, static_cast<off_t>(off + done));
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (w == 0) return EIO;
    done += static_cast<size_t>(w);
  }
  return 0;
}

// Gathers a file's bytes into aligned chunks written with O_DIRECT: the writing thread's two
// (ThreadChunks); one is filled here while `helper` writes the other, so the copy (and the
// CRC of the next record) overlaps the disk.
class DirectWriter {
 public:
  DirectWriter(int fd, IoHelper* helper) : fd_(fd), helper_(helper) {
    char* const p = ThreadChunks();
    if (p == nullptr) {
      err_ = ENOMEM;
      return;
    }
    bufs_[0] = p;
    bufs_[1] = p + kDirectChunk;
  }
  ~DirectWriter() { (void)Wait(); }  // the chunks are never reused under a write

  void Append(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0 && err_ == 0) {
      const size_t k = std::min(n, kDirectChunk - fill_);
      std::memcpy(bufs_[cur_] + fill_, p, k);
      fill_ += k;
      p += k;
      n -= k;
      if (fill_ == kDirectChunk) Submit(fill_);
    }
  }
  // The last chunk padded to a whole block, every write ended, the file cut to `size`:
  // 0 or the errno.
  int Finish(uint64_t size) {
    if (err_ == 0 && fill_ > 0) {
      const size_t padded = (fill_ + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
      std::memset(bufs_[cur_] + fill_, 0, padded - fill_);
      Submit(padded);
    }
    if (const int e = Wait(); err_ == 0) err_ = e;
    if (err_ == 0 && ::ftruncate(fd_, static_cast<off_t>(size)) != 0) err_ = errno;
    return err_;
  }

 private:
  // The errno of the write in flight (0 if none, or it succeeded), once it has ended.
  int Wait() {
    if (!in_flight_) return 0;
    helper_->Wait();
    in_flight_ = false;
    return written_err_;
  }
  void Submit(size_t n) {
    if (const int e = Wait(); e != 0) {
      err_ = e;
      return;
    }
    written_err_ = 0;
    in_flight_ = helper_->Post(
        [this, p = bufs_[cur_], n, off = off_] { written_err_ = PwriteAll(fd_, p, n, off); });
    if (!in_flight_) {  // no helper thread: written here
      if (const int e = PwriteAll(fd_, bufs_[cur_], n, off_); e != 0) {
        err_ = e;
        return;
      }
    }
    off_ += n;
    cur_ ^= 1;
    fill_ = 0;
  }

  const int fd_;
  IoHelper* const helper_;
  char* bufs_[2] = {nullptr, nullptr};
  bool in_flight_ = false;  // the helper writes bufs_[cur_ ^ 1]
  int written_err_ = 0;     // its errno: set by the helper, read here after Wait
  int cur_ = 0;
  size_t fill_ = 0;
  uint64_t off_ = 0;
  int err_ = 0;
};

bool PreadAll(int fd, void* dst, size_t n, uint64_t off) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(off));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      if (r == 0) errno = 0;
      return false;
    }
    p += r;
    off += static_cast<uint64_t>(r);
    n -= static_cast<size_t>(r);
  }
  return true;
}

Status SyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::Internal(Errno("cannot open " + dir + " to sync it"));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  errno = err;
  if (rc != 0) return Status::Internal(Errno("cannot sync " + dir));
  return Status::OK();
}

// Walks the records after the file header: headers and keys only.
void Walk(int fd, uint64_t size, std::vector<RecordRef>* refs) {
  uint64_t off = kFileHeaderSize;
  char h[kRecordHeaderSize];
  while (off + kRecordHeaderSize <= size) {
    if (!PreadAll(fd, h, sizeof(h), off)) return;
    RecordRef r;
    uint32_t key_len = 0;
    if (!DecodeRecordHeader(h, &key_len, &r.value_len, &r.put_id, &r.data_crc)) return;
    if (key_len == 0 || key_len > kMaxKeyLen || r.value_len > size ||
        off + kRecordHeaderSize + key_len + r.value_len > size) {
      return;
    }
    r.key.resize(key_len);
    if (!PreadAll(fd, r.key.data(), key_len, off + kRecordHeaderSize)) return;
    r.offset = off;
    off += Align8(kRecordHeaderSize + key_len + r.value_len);
    refs->push_back(std::move(r));
  }
}

// Parses the index [idx, idx + n) of a file of `index_off` data bytes; false when any entry
// is out of bounds.
bool ParseIndex(const std::string& idx, uint32_t count, uint64_t index_off,
                std::vector<RecordRef>* refs) {
  size_t p = 0;
  refs->reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    if (p + kIndexEntryFixed > idx.size()) return false;
    RecordRef r;
    r.offset = Get<uint64_t>(idx.data() + p);
    r.value_len = Get<uint64_t>(idx.data() + p + 8);
    r.put_id = Get<uint64_t>(idx.data() + p + 16);
    const uint32_t key_len = Get<uint32_t>(idx.data() + p + 24);
    r.data_crc = Get<uint32_t>(idx.data() + p + 28);
    p += kIndexEntryFixed;
    if (key_len == 0 || key_len > kMaxKeyLen || p + key_len > idx.size()) return false;
    if (r.offset < kFileHeaderSize || r.offset > index_off || r.value_len > index_off ||
        r.offset + kRecordHeaderSize + key_len + r.value_len > index_off) {
      return false;
    }
    r.key.assign(idx.data() + p, key_len);
    p = Align8(p + key_len);
    refs->push_back(std::move(r));
  }
  return p == idx.size();
}

}  // namespace

bool DecodeRecordHeader(const char* h, uint32_t* key_len, uint64_t* value_len, uint64_t* put_id,
                        uint32_t* data_crc) {
  if (Get<uint32_t>(h) != kRecordMagic || Get<uint32_t>(h + 28) != Crc32c(0, h, 28)) {
    return false;
  }
  *key_len = Get<uint32_t>(h + 4);
  *value_len = Get<uint64_t>(h + 8);
  *put_id = Get<uint64_t>(h + 16);
  *data_crc = Get<uint32_t>(h + 24);
  return true;
}

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

char* ThreadChunks() {
  static thread_local std::unique_ptr<char, decltype(&std::free)> chunks{nullptr, &std::free};
  if (!chunks) {
    void* p = nullptr;
    if (::posix_memalign(&p, kDirectAlign, 2 * kDirectChunk) != 0) return nullptr;
    chunks.reset(static_cast<char*>(p));
  }
  return chunks.get();
}

std::string BucketName(uint64_t id) {
  char b[40];
  std::snprintf(b, sizeof(b), "%016" PRIx64 ".bucket", id);
  return b;
}

bool ParseBucketName(const std::string& name, uint64_t* id) {
  if (name.size() != 16 + 7 || name.compare(16, 7, ".bucket") != 0) return false;
  uint64_t v = 0;
  for (int i = 0; i < 16; ++i) {
    const char c = name[i];
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return false;
    }
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  *id = v;
  return true;
}

uint64_t BucketFileSize(const std::vector<BucketItem>& items) {
  uint64_t n = kFileHeaderSize + kTrailerSize;
  for (const auto& it : items) {
    n += Align8(kRecordHeaderSize + it.key.size() + it.size);
    n += Align8(kIndexEntryFixed + it.key.size());
  }
  return n;
}

Status WriteBucket(const std::string& dir, uint64_t id, const std::vector<BucketItem>& items,
                   bool sync, std::vector<RecordRef>* refs, uint64_t* file_size, bool direct,
                   IoHelper* helper) {
  refs->clear();
  if (items.empty()) return Status::InvalidArgument("a bucket of no objects");
  const std::string final_path = dir + "/" + BucketName(id);
  const std::string tmp = final_path + ".tmp";

  char header[kFileHeaderSize] = {};
  std::memcpy(header, kFileMagic, 8);
  Put<uint32_t>(header + 8, kVersion);
  Put<uint32_t>(header + 12, static_cast<uint32_t>(items.size()));
  Put<uint64_t>(header + 16, id);
  Put<uint64_t>(header + 24, static_cast<uint64_t>(
                                 std::chrono::duration_cast<std::chrono::milliseconds>(
                                     std::chrono::system_clock::now().time_since_epoch())
                                     .count()));
  Put<uint32_t>(header + 60, Crc32c(0, header, 60));

  for (const auto& it : items) {
    if (it.key.empty() || it.key.size() > kMaxKeyLen) {
      return Status::InvalidArgument("a key of " + std::to_string(it.key.size()) +
                                     " bytes (1.." + std::to_string(kMaxKeyLen) + ")");
    }
  }
  *file_size = BucketFileSize(items);
  // The file's pieces in order, to `emit` (each record's CRC computed just before its
  // bytes go: a direct write copies a value while it is still in the cache); `rec_headers`
  // and `trailer` hold what the pieces point at until written.
  std::vector<char> rec_headers(items.size() * kRecordHeaderSize);
  std::string index;
  char trailer[kTrailerSize] = {};
  auto lay_out = [&](const std::function<void(const void*, size_t)>& emit) {
    refs->clear();
    refs->reserve(items.size());
    index.clear();
    emit(header, kFileHeaderSize);
    uint64_t off = kFileHeaderSize;
    for (size_t i = 0; i < items.size(); ++i) {
      const auto& it = items[i];
      uint32_t crc = Crc32c(0, it.key.data(), it.key.size());
      crc = Crc32c(crc, it.data, it.size);
      char* h = rec_headers.data() + i * kRecordHeaderSize;
      EncodeRecordHeader(h, static_cast<uint32_t>(it.key.size()), it.size, it.put_id, crc);
      emit(h, kRecordHeaderSize);
      emit(it.key.data(), it.key.size());
      if (it.size > 0) emit(it.data, it.size);
      const uint64_t len = kRecordHeaderSize + it.key.size() + it.size;
      if (Align8(len) != len) emit(kZeros, Align8(len) - len);
      refs->push_back(RecordRef{std::string(it.key), off, it.size, it.put_id, crc});

      char e[kIndexEntryFixed];
      Put<uint64_t>(e, off);
      Put<uint64_t>(e + 8, it.size);
      Put<uint64_t>(e + 16, it.put_id);
      Put<uint32_t>(e + 24, static_cast<uint32_t>(it.key.size()));
      Put<uint32_t>(e + 28, crc);
      index.append(e, sizeof(e));
      index.append(it.key.data(), it.key.size());
      index.append(Align8(index.size()) - index.size(), '\0');
      off += Align8(len);
    }
    std::memcpy(trailer, kTrailerMagic, 8);
    Put<uint64_t>(trailer + 8, off);
    Put<uint32_t>(trailer + 16, static_cast<uint32_t>(items.size()));
    Put<uint32_t>(trailer + 20, Crc32c(0, index.data(), index.size()));
    Put<uint32_t>(trailer + 28, Crc32c(0, trailer, 28));
    emit(index.data(), index.size());
    emit(trailer, kTrailerSize);
  };

  constexpr int kFlags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
  int fd = direct ? ::open(tmp.c_str(), kFlags | O_DIRECT, 0644) : -1;
  bool ok = false;
  if (fd >= 0) {
    int err = 0;
    {
      IoHelper own;  // used only when the caller lends none: a thread for this bucket
      DirectWriter w(fd, helper != nullptr ? helper : &own);
      lay_out([&](const void* p, size_t n) { w.Append(p, n); });
      err = w.Finish(*file_size);
    }
    ok = err == 0;
    errno = err;
    if (err == EINVAL || err == ENOMEM) {  // O_DIRECT opens but not these writes; no chunks
      ::close(fd);
      fd = -1;
    }
  }
  if (fd < 0) {  // not asked, or a file system without O_DIRECT (tmpfs): through the page cache
    fd = ::open(tmp.c_str(), kFlags, 0644);
    if (fd < 0) {
      return errno == ENOSPC ? Status::ResourceExhausted(Errno("cannot create " + tmp))
                             : Status::Internal(Errno("cannot create " + tmp));
    }
    std::vector<iovec> iov;
    iov.reserve(items.size() * 4 + 3);
    lay_out([&](const void* p, size_t n) { iov.push_back({const_cast<void*>(p), n}); });
    ok = WriteAll(fd, std::move(iov));
  }
  if (ok && sync) ok = ::fdatasync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) {
    ::unlink(tmp.c_str());
    errno = err;
    return err == ENOSPC || err == EDQUOT
               ? Status::ResourceExhausted(Errno("cannot write " + tmp))
               : Status::Internal(Errno("cannot write " + tmp));
  }
  if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
    const std::string m = Errno("cannot rename " + tmp);
    ::unlink(tmp.c_str());
    return Status::Internal(m);
  }
  if (sync) {
    if (Status s = SyncDir(dir); !s.ok()) {
      ::unlink(final_path.c_str());
      return s;
    }
  }
  return Status::OK();
}

Status ReadBucketIndex(const std::string& path, uint64_t bucket_id,
                       std::vector<RecordRef>* refs, uint64_t* file_size, bool* walked) {
  refs->clear();
  *walked = false;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::Internal(Errno("cannot open " + path));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Status::Internal(Errno("cannot stat " + path));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  *file_size = size;
  char header[kFileHeaderSize];
  if (size < kFileHeaderSize || !PreadAll(fd, header, sizeof(header), 0) ||
      std::memcmp(header, kFileMagic, 8) != 0 ||
      Get<uint32_t>(header + 60) != Crc32c(0, header, 60) ||
      Get<uint32_t>(header + 8) != kVersion || Get<uint64_t>(header + 16) != bucket_id) {
    return Status::DataLoss(path + " is not a bucket file of this version (its header fails "
                                   "its checks)");
  }
  const uint32_t count = Get<uint32_t>(header + 12);
  char t[kTrailerSize];
  if (size >= kFileHeaderSize + kTrailerSize && PreadAll(fd, t, sizeof(t), size - kTrailerSize) &&
      std::memcmp(t, kTrailerMagic, 8) == 0 && Get<uint32_t>(t + 28) == Crc32c(0, t, 28)) {
    const uint64_t index_off = Get<uint64_t>(t + 8);
    const uint32_t n = Get<uint32_t>(t + 16);
    if (n == count && index_off >= kFileHeaderSize && index_off <= size - kTrailerSize) {
      std::string idx(size - kTrailerSize - index_off, '\0');
      if (PreadAll(fd, idx.data(), idx.size(), index_off) &&
          Get<uint32_t>(t + 20) == Crc32c(0, idx.data(), idx.size()) &&
          ParseIndex(idx, n, index_off, refs)) {
        return Status::OK();
      }
    }
  }
  refs->clear();
  *walked = true;
  Walk(fd, size, refs);
  return Status::OK();
}

}  // namespace disk
}  // namespace store
}  // namespace mooncake

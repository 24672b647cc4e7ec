// One bucket file of the disk tier: many objects written at once, in one sequential write,
// then never changed (removals are recorded elsewhere; a bucket is deleted whole).
//
//   [file header 64 B] [record]... [index] [trailer 32 B]
//   record:  header 32 B {magic "MCRD", key_len, value_len, put_id, data_crc, header_crc},
//            key, value, zeros to the next multiple of 8
//   index:   per record {offset, value_len, put_id, key_len, data_crc, key, zeros to 8}
//   trailer: {magic "MCBTRAIL", index offset, index count, index crc, trailer crc}
//
// data_crc is the CRC32C of the key then the value, checked on every read, so a torn or
// corrupted record is never served. The index lets a restart find every object by reading a
// few KiB per bucket; a bucket whose trailer or index fails its checks is walked record by
// record instead (headers only). All integers little-endian (the hosts this runs on).
//
// A bucket is written as `<id>.bucket.tmp` and renamed to `<id>.bucket` once complete (and,
// with sync, fdatasync'd before and its directory fsync'd after), so a crash leaves either
// the whole file or a .tmp that the next open deletes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "mooncake/status.h"

namespace mooncake {
namespace store {
namespace disk {

class IoHelper;  // io_helper.h

constexpr size_t kFileHeaderSize = 64;
constexpr size_t kRecordHeaderSize = 32;
constexpr size_t kTrailerSize = 32;
constexpr size_t kMaxKeyLen = 4096;  // the Store's key bound (limits.h)

struct BucketItem {
  std::string_view key;
  uint64_t put_id = 0;  // the master's identity of the value (kept, not interpreted here)
  const void* data = nullptr;
  uint64_t size = 0;
};

// Where one object lies in its bucket, and what it must read back as.
struct RecordRef {
  std::string key;
  uint64_t offset = 0;  // of the record's header
  uint64_t value_len = 0;
  uint64_t put_id = 0;
  uint32_t data_crc = 0;
};

std::string BucketName(uint64_t id);  // "%016x.bucket"
// The id of a bucket file name, or false for any other name.
bool ParseBucketName(const std::string& name, uint64_t* id);
// The bytes a bucket of these items takes on disk.
uint64_t BucketFileSize(const std::vector<BucketItem>& items);

// Writes `items` as bucket `id` in `dir`. On success `refs` holds one entry per item, in
// order, and `file_size` the file's size. On failure no `<id>.bucket` exists (the .tmp is
// removed); ENOSPC gives ResourceExhausted, other I/O errors Internal, each naming the file.
// `direct`: with O_DIRECT, the bytes gathered into aligned 8 MiB chunks (a copy, past the
// page cache), falling back to the page cache where the file system refuses O_DIRECT; each
// chunk written on `helper` (io_helper.h) while the next is filled, or on a thread of the
// call's own when null.
Status WriteBucket(const std::string& dir, uint64_t id, const std::vector<BucketItem>& items,
                   bool sync, std::vector<RecordRef>* refs, uint64_t* file_size,
                   bool direct = false, IoHelper* helper = nullptr);

// The records of the bucket file at `path`, from its index, or from walking its records
// when the trailer or index is damaged (`walked` then true; a damaged record ends the walk,
// so the records before it are kept). DataLoss when even the file header is bad.
Status ReadBucketIndex(const std::string& path, uint64_t bucket_id,
                       std::vector<RecordRef>* refs, uint64_t* file_size, bool* walked);

// Reads the value of `ref` from `fd` into dst[0, ref.value_len) and checks the record's
// header, key and CRC32C against `ref`: DataLoss (saying which check failed) when any
// differs or the file ends early, Internal on an I/O error.
Status ReadRecord(int fd, const RecordRef& ref, void* dst);
// ReadRecord from a file opened with O_DIRECT: the blocks covering the record read into an
// aligned chunk of the thread's and copied out; InvalidArgument when the file system takes
// no direct reads (read it with ReadRecord then).
Status ReadRecordDirect(int fd, const RecordRef& ref, void* dst);

// ReadRecordDirect of several records, each status in its entry: the next record's read
// in flight (a helper thread's, into a second chunk) while the one before is copied out and
// checked, so the disk is kept busy through a batch.
struct DirectRead {
  int fd = -1;  // opened with O_DIRECT
  const RecordRef* ref = nullptr;
  void* dst = nullptr;  // ref->value_len bytes
  Status status;
};
void ReadRecordsDirect(std::vector<DirectRead>* reads);

}  // namespace disk
}  // namespace store
}  // namespace mooncake

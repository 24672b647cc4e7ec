// What bucket_file.cc (writing, scanning) and record_read.cc (reading records back) share:
// the record header's decoding and the aligned memory direct I/O needs. Internal to the
// disk folder.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace mooncake {
namespace store {
namespace disk {

// O_DIRECT: offsets, lengths and memory aligned to kDirectAlign; the bytes go through
// chunks of kDirectChunk.
constexpr size_t kDirectAlign = 4096;
constexpr size_t kDirectChunk = 8 << 20;

// The calling thread's two aligned chunks of kDirectChunk bytes for direct I/O (the second
// at the result + kDirectChunk), kept for its next use (chunks per call would fault their
// pages in each time); null when they cannot be had. One pair per thread, shared by a
// bucket's write and the reads of records, which never run inside one another on a thread.
char* ThreadChunks();

// A record header's fields; false when its magic or its own checksum is wrong.
bool DecodeRecordHeader(const char* h, uint32_t* key_len, uint64_t* value_len, uint64_t* put_id,
                        uint32_t* data_crc);

// "what: strerror(errno)".
std::string Errno(const std::string& what);

}  // namespace disk
}  // namespace store
}  // namespace mooncake

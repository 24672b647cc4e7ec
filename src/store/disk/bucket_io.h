// What bucket_file.cc (writing, scanning) and record_read.cc (reading records back) share:
// the record header's decoding and the aligned memory direct I/O needs. Internal to the
// disk folder.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

namespace mooncake {
namespace store {
namespace disk {

// O_DIRECT: offsets, lengths and memory aligned to kDirectAlign; the bytes go through
// chunks of kDirectChunk.
constexpr size_t kDirectAlign = 4096;
constexpr size_t kDirectChunk = 8 << 20;

// Aligned memory for direct I/O, kept in a thread's `slot` for its next use (a chunk per
// call would fault its pages in each time); null when it cannot be had.
using AlignedChunk = std::unique_ptr<char, decltype(&std::free)>;
char* ThreadChunk(AlignedChunk* slot, size_t size);

// A record header's fields; false when its magic or its own checksum is wrong.
bool DecodeRecordHeader(const char* h, uint32_t* key_len, uint64_t* value_len, uint64_t* put_id,
                        uint32_t* data_crc);

// "what: strerror(errno)".
std::string Errno(const std::string& what);

}  // namespace disk
}  // namespace store
}  // namespace mooncake

// CRC32C (Castagnoli, the iSCSI / ext4 / RocksDB checksum): the SSE4.2 instruction where the
// CPU has it (checked once at run time), a table otherwise. Both give the same value.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mooncake {

// Extends `crc` (0 to start) over `n` bytes at `p`.
uint32_t Crc32c(uint32_t crc, const void* p, size_t n);

// The portable form, for the tests (same result as Crc32c).
uint32_t Crc32cPortable(uint32_t crc, const void* p, size_t n);

}  // namespace mooncake

// Huge pages for the Store client's memory, as upstream's MC_STORE_USE_HUGEPAGE asks.
//
// MC_STORE_USE_HUGEPAGE=1 (true, yes, on) puts the global segment (a memfd that same-host
// peers map) and the local buffer on HugeTLB pages of MC_STORE_HUGEPAGE_SIZE (2MB, the
// default, or 1GB; anything else: a warning and 2MB, as upstream). The sizes are rounded up
// to whole pages. The pages come from the host's reserved pool; with too few free, setup
// fails and says so (nothing falls back to 4 KiB pages, as upstream). Unset, 0, false, no,
// off: ordinary pages (the segment prefaulted in the background, the local buffer with
// transparent huge pages where the kernel gives them on request).
#pragma once

#include <cstddef>

namespace mooncake::store {

// 0 (huge pages off) or the huge page size in bytes, from the environment.
size_t HugePageSizeFromEnv();

// `n` rounded up to a multiple of `page` (page 0: n).
size_t RoundUpToPage(size_t n, size_t page);

}  // namespace mooncake::store

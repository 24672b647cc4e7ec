// mooncake_master's disk-tier flags (upstream's names and defaults; src/store/disk/README.md).
#include <glog/logging.h>

#include <cstdint>

#include "store/master/master_flags.h"

DEFINE_bool(enable_offload, false,
            "Let clients offload objects to their local disks (setup's enable_ssd_offload); "
            "without it a client asking for offload fails setup with UNABLE_OFFLOAD (-1300)");
DEFINE_bool(offload_on_evict, false,
            "Write objects to disk only when eviction picks them (else every put is written "
            "soon after it ends)");
DEFINE_bool(offload_force_evict, false,
            "With --offload_on_evict: evict what cannot be offloaded now instead of keeping it "
            "in memory");
DEFINE_uint64(offloading_queue_limit, 50000, "Objects waiting for one disk at most (1..1e8)");
DEFINE_double(offload_cap_ratio, 0.5,
              "Share of --offloading_queue_limit one eviction pass may queue, in [0, 1]");
DEFINE_bool(promotion_on_hit, false,
            "Bring objects read from a disk often back to memory (by the disk's owner)");
DEFINE_uint64(promotion_admission_threshold, 2, "Reads from disk before a promotion (>= 1)");
DEFINE_uint64(promotion_queue_limit, 50000, "Promotions waiting per disk at most");
DEFINE_uint64(promotion_max_per_heartbeat, 1,
              "Promotions handed to a disk's owner per fetch (1..4096)");
// Upstream's legacy DISK replicas (a shared file system whose paths the master hands out):
// accepted so that upstream's command lines start, not built (the disk tier is the clients'
// local disks: --enable_offload).
DEFINE_string(root_fs_dir, "",
              "Upstream's legacy shared-file-system DISK replicas: not built here (accepted and "
              "ignored, with a warning); the disk tier is --enable_offload");
DEFINE_int64(global_file_segment_size, 0, "With --root_fs_dir (not built here)");
DEFINE_bool(enable_disk_eviction, true, "With --root_fs_dir (not built here)");
DEFINE_uint64(quota_bytes, 0, "With --root_fs_dir (not built here)");

namespace mooncake {
namespace store {

Status OffloadSettingsFromFlags(MasterConfig* config) {
  if (FLAGS_offloading_queue_limit == 0 || FLAGS_offloading_queue_limit > 100'000'000) {
    return Status::InvalidArgument("--offloading_queue_limit must be in 1..100000000");
  }
  if (!(FLAGS_offload_cap_ratio >= 0 && FLAGS_offload_cap_ratio <= 1)) {
    return Status::InvalidArgument("--offload_cap_ratio must be in [0, 1]");
  }
  if (!FLAGS_enable_offload && (FLAGS_offload_on_evict || FLAGS_offload_force_evict)) {
    LOG(WARNING) << "--offload_on_evict / --offload_force_evict do nothing without "
                    "--enable_offload";
  }
  if (FLAGS_promotion_admission_threshold == 0 || FLAGS_promotion_admission_threshold > UINT32_MAX ||
      FLAGS_promotion_max_per_heartbeat == 0 || FLAGS_promotion_max_per_heartbeat > 4096) {
    return Status::InvalidArgument(
        "--promotion_admission_threshold must be >= 1 and --promotion_max_per_heartbeat in "
        "1..4096");
  }
  if (!FLAGS_root_fs_dir.empty()) {
    LOG(WARNING) << "--root_fs_dir=" << FLAGS_root_fs_dir
                 << ": upstream's legacy shared-file-system DISK replicas are not built here; "
                    "the flag is ignored (the disk tier is the clients' local disks, "
                    "--enable_offload)";
  }
  config->offload.promotion_on_hit = FLAGS_promotion_on_hit;
  config->offload.promotion_threshold =
      static_cast<uint32_t>(FLAGS_promotion_admission_threshold);
  config->offload.promotion_queue_limit = FLAGS_promotion_queue_limit;
  config->offload.promotion_per_fetch =
      static_cast<uint32_t>(FLAGS_promotion_max_per_heartbeat);
  config->offload.enable = FLAGS_enable_offload;
  config->offload.on_evict = FLAGS_offload_on_evict;
  config->offload.force_evict = FLAGS_offload_force_evict;
  config->offload.queue_limit = FLAGS_offloading_queue_limit;
  config->offload.cap_ratio = FLAGS_offload_cap_ratio;
  return Status::OK();
}

}  // namespace store
}  // namespace mooncake

// mooncake_master's disk-tier flags (upstream's names and defaults; src/store/disk/README.md).
#include <glog/logging.h>

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
            "Bring objects read from disk often back to memory (not built yet: reads are served "
            "from the disk)");
DEFINE_uint64(promotion_admission_threshold, 2, "Disk reads before a promotion (not built yet)");
DEFINE_uint64(promotion_queue_limit, 50000, "Promotions waiting at most (not built yet)");
DEFINE_uint64(promotion_max_per_heartbeat, 1, "Promotions per heartbeat (not built yet)");

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
  if (FLAGS_promotion_on_hit) {
    LOG(WARNING) << "--promotion_on_hit: promotion to memory is not built yet; objects read "
                    "from disk are served from the disk";
  }
  config->offload.enable = FLAGS_enable_offload;
  config->offload.on_evict = FLAGS_offload_on_evict;
  config->offload.force_evict = FLAGS_offload_force_evict;
  config->offload.queue_limit = FLAGS_offloading_queue_limit;
  config->offload.cap_ratio = FLAGS_offload_cap_ratio;
  return Status::OK();
}

}  // namespace store
}  // namespace mooncake

// What the Store's binaries (mooncake_master, mooncake_client) do before they start serving:
// flags parsed and glog sent to stderr (InitBinary), and how they give up (Fail).
#pragma once

#include <gflags/gflags.h>
#include <glog/logging.h>

#include <string>

namespace mooncake {
namespace store {

// Parses the command line (removing the flags it knew from argv) and logs to stderr.
// REQUIRES: called once, first in main().
inline void InitBinary(const char* usage, int* argc, char*** argv) {
  gflags::SetUsageMessage(usage);
  gflags::ParseCommandLineFlags(argc, argv, true);
  google::InitGoogleLogging((*argv)[0]);
  FLAGS_logtostderr = true;
}

// Logs why the binary cannot start; returns its exit status (1).
inline int Fail(const std::string& why) {
  LOG(ERROR) << why;
  return 1;
}

}  // namespace store
}  // namespace mooncake

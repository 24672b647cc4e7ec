// What the StoreClient tests against an in-process master (in_process_master.h) share:
// deterministic random bytes, and a client of that master with the options the tests vary.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "mooncake/store/store_client.h"

namespace mooncake {
namespace store {
namespace testing {

// n pseudo-random bytes, the same for the same seed.
inline std::vector<char> Bytes(size_t n, unsigned seed) {
  std::vector<char> v(n);
  std::mt19937 rng(seed);
  for (auto& c : v) c = static_cast<char>(rng());
  return v;
}

// A client of `master` on 127.0.0.1 lending `segment` bytes, with `local` bytes of staging;
// null (and a test failure naming the code) when setup fails.
inline std::unique_ptr<StoreClient> MakeClient(
    std::shared_ptr<MasterStub> master, uint64_t segment, uint64_t local = 16 << 20,
    std::chrono::milliseconds heartbeat = std::chrono::milliseconds(1000)) {
  StoreClientOptions o;
  o.local_hostname = "127.0.0.1";
  o.global_segment_size = segment;
  o.local_buffer_size = local;
  o.master = std::move(master);
  o.heartbeat_interval = heartbeat;
  int code = 0;
  std::string msg;
  auto c = StoreClient::Create(o, &code, &msg);
  EXPECT_NE(c, nullptr) << code << " " << msg;
  return c;
}

}  // namespace testing
}  // namespace store
}  // namespace mooncake

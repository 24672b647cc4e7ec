// The parameter of the failure suites: the transport the initiator installs, and for ucx the
// UCX lanes both ends may use. "ucx_tcp" is transport ucx with UCX_TLS=tcp, "ucx_sm" with
// UCX_TLS=sm,self; UCX_TLS is set for this process (and so the peers it starts) while the
// test runs. Header-only.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>
#include <vector>

#include "engine/transport.h"

namespace mc_failure {

// The suite's parameters: `base`, plus the ucx ones where this build has the UCX transport
// (MC_WITH_UCX; where it has none, "ucx" answers Unimplemented and its cases are not made).
inline std::vector<std::string> WithUcx(std::vector<std::string> base,
                                        const std::vector<std::string>& ucx) {
  if (mooncake::CreateTransport("ucx").ok()) base.insert(base.end(), ucx.begin(), ucx.end());
  return base;
}

inline std::string TransportOf(const std::string& param) {
  return param.substr(0, param.find('_'));
}

inline const char* UcxTlsOf(const std::string& param) {
  if (param == "ucx_tcp") return "tcp";
  if (param == "ucx_sm") return "sm,self";
  return nullptr;
}

class TransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  TransportTest() {
    if (const char* tls = UcxTlsOf(GetParam())) ::setenv("UCX_TLS", tls, 1);
  }
  ~TransportTest() override { ::unsetenv("UCX_TLS"); }
  std::string transport() const { return TransportOf(GetParam()); }
};

}  // namespace mc_failure

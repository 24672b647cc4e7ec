// Environment switches of the device layer (src/platform). Read in src/common/options.cc,
// where every MC_* variable is read; the device backend is one per process, so these are
// not part of EngineOptions.
#pragma once

namespace mooncake {

struct DeviceEnvironment {
  // MC_DEVICE_SIM=1: use the simulated device backend (tests; see src/platform/device.h).
  // MC_DEVICE_SIM=npu (or ascend): simulated Ascend NPUs (locations npu:N, ACL's IPC rules).
  bool simulate = false;
  bool sim_npu = false;
  // MC_DEVICE_SIM_DEVICES: simulated devices, 1..16, default 2.
  int sim_devices = 2;
  // MC_DEVICE_SIM_DELAY_US: every simulated asynchronous copy first sleeps this long, 0.
  int sim_delay_us = 0;
};

DeviceEnvironment ReadDeviceEnvironment();

}  // namespace mooncake

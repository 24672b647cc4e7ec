#include "metadata/segment_desc.h"

#include <sys/time.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>

#include "metadata/json_util.h"

namespace mooncake {

using nlohmann::json;

namespace {

// mc_location "cuda:N" or "npu:N" gives the device; an IPC handle must be 128 hex digits.
Status DecodeDeviceFields(const json& b, BufferDesc* bd) {
  const bool cuda = bd->location.rfind("cuda:", 0) == 0;
  if (cuda || bd->location.rfind("npu:", 0) == 0) {
    const std::string num = bd->location.substr(cuda ? 5 : 4);
    if (num.empty() || num.size() > 4 ||
        num.find_first_not_of("0123456789") != std::string::npos) {
      return Status::DataLoss("mc_location '" + bd->location + "' is not " +
                              (cuda ? "cuda" : "npu") + ":<device>");
    }
    bd->device = std::stoi(num);
  }
  MC_RETURN_IF_ERROR(GetString(b, "mc_ipc_handle", false, &bd->ipc_handle));
  if (!bd->ipc_handle.empty() &&
      (bd->ipc_handle.size() != 128 ||
       bd->ipc_handle.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)) {
    return Status::DataLoss("mc_ipc_handle is not 128 hex digits");
  }
  return GetUint(b, "mc_ipc_offset", UINT64_MAX, &bd->ipc_offset);
}

// An optional hex field of at most max_bytes bytes (2 * max_bytes digits, an even count).
Status GetHexField(const json& j, const char* key, size_t max_bytes, std::string* out) {
  MC_RETURN_IF_ERROR(GetString(j, key, false, out));
  if (out->empty()) return Status::OK();
  if (out->size() > 2 * max_bytes) {
    const size_t got = out->size();
    out->clear();
    return Status::DataLoss(std::string(key) + " is " + std::to_string(got) +
                            " hex digits long, more than the " + std::to_string(2 * max_bytes) +
                            " allowed");
  }
  if (out->size() % 2 != 0 || out->find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
    out->clear();
    return Status::DataLoss(std::string(key) + " is not an even number of hex digits");
  }
  return Status::OK();
}

}  // namespace

const BufferDesc* SegmentDesc::FindBuffer(uint64_t addr, uint64_t len) const {
  if (len == 0 || addr + len < addr) return nullptr;
  for (const auto& b : buffers) {
    if (addr >= b.addr && addr + len <= b.end()) return &b;
  }
  return nullptr;
}

bool SegmentDesc::SameContent(const SegmentDesc& o) const {
  if (name != o.name || protocol != o.protocol || tcp_data_port != o.tcp_data_port ||
      tcp_data_host != o.tcp_data_host || mc_host_id != o.mc_host_id || mc_pid != o.mc_pid ||
      mc_shm_path != o.mc_shm_path || mc_tcp_fence != o.mc_tcp_fence ||
      mc_ucx_worker != o.mc_ucx_worker || mc_auth_instance != o.mc_auth_instance ||
      tcp_proto_version != o.tcp_proto_version || buffers.size() != o.buffers.size()) {
    return false;
  }
  for (size_t i = 0; i < buffers.size(); ++i) {
    const auto &a = buffers[i], &b = o.buffers[i];
    if (a.name != b.name || a.addr != b.addr || a.length != b.length ||
        a.location != b.location || a.ipc_handle != b.ipc_handle || a.ipc_offset != b.ipc_offset ||
        a.ucx_rkey != b.ucx_rkey) {
      return false;
    }
  }
  return true;
}

std::string EncodeSegmentDesc(const SegmentDesc& d) {
  json j;  // std::map-backed: keys come out sorted, like jsoncpp's FastWriter
  j["name"] = d.name;
  j["protocol"] = d.protocol;
  j["rdma_server_name"] = d.rdma_server_name;
  j["tcp_data_host"] = d.tcp_data_host;
  j["tcp_data_port"] = d.tcp_data_port;
  j["tcp_proto_version"] = d.tcp_proto_version;
  j["timestamp"] = d.timestamp;
  json bufs = json::array();
  for (const auto& b : d.buffers) {
    json jb = {{"name", b.name}, {"addr", b.addr}, {"length", b.length}};
    if (!b.location.empty()) jb["mc_location"] = b.location;
    if (!b.ipc_handle.empty()) {
      jb["mc_ipc_handle"] = b.ipc_handle;
      jb["mc_ipc_offset"] = b.ipc_offset;
    }
    if (!b.ucx_rkey.empty()) jb["mc_ucx_rkey"] = b.ucx_rkey;
    bufs.push_back(std::move(jb));
  }
  j["buffers"] = std::move(bufs);
  if (!d.mc_host_id.empty()) j["mc_host_id"] = d.mc_host_id;
  if (d.mc_pid != 0) j["mc_pid"] = d.mc_pid;
  if (!d.mc_shm_path.empty()) j["mc_shm_path"] = d.mc_shm_path;
  if (d.mc_tcp_fence) j["mc_tcp_fence"] = 1;
  if (!d.mc_ucx_worker.empty()) j["mc_ucx_worker"] = d.mc_ucx_worker;
  if (!d.mc_auth_instance.empty()) j["mc_auth_instance"] = d.mc_auth_instance;
  if (!d.mc_auth_sig.empty()) j["mc_auth_sig"] = d.mc_auth_sig;
  // Invalid UTF-8 (names are bytes from the user) is replaced, never thrown.
  return j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
}

std::string SegmentDescSigningBytes(const SegmentDesc& desc) {
  SegmentDesc d = desc;
  d.mc_auth_sig.clear();
  return EncodeSegmentDesc(d);
}

Result<SegmentDesc> DecodeSegmentDesc(std::string_view text) {
  MC_ASSIGN_OR_RETURN(json j, ParseJsonBounded(text, "segment descriptor"));
  if (!j.is_object()) return Status::DataLoss("segment descriptor is not a JSON object");
  SegmentDesc d;
  MC_RETURN_IF_ERROR(GetString(j, "name", /*required=*/true, &d.name));
  if (d.name.empty()) return Status::DataLoss("segment descriptor: 'name' is empty");
  if (j.contains("protocol") && j["protocol"].is_array()) {
    // Multi-protocol descriptors list several; the first is the one buffers describe.
    const json& arr = j["protocol"];
    if (arr.empty() || !arr[0].is_string()) {
      return Status::DataLoss("segment descriptor: 'protocol' array is empty or not strings");
    }
    d.protocol = arr[0].get<std::string>();
  } else {
    MC_RETURN_IF_ERROR(GetString(j, "protocol", /*required=*/true, &d.protocol));
  }
  MC_RETURN_IF_ERROR(GetString(j, "tcp_data_host", false, &d.tcp_data_host));
  MC_RETURN_IF_ERROR(GetString(j, "rdma_server_name", false, &d.rdma_server_name));
  uint64_t port = 0;
  MC_RETURN_IF_ERROR(GetUint(j, "tcp_data_port", 65535, &port));
  d.tcp_data_port = static_cast<uint16_t>(port);
  uint64_t version = 1;
  MC_RETURN_IF_ERROR(GetUint(j, "tcp_proto_version", 1000, &version));
  d.tcp_proto_version = static_cast<int>(version == 0 ? 1 : version);
  MC_RETURN_IF_ERROR(GetString(j, "timestamp", /*required=*/false, &d.timestamp));
  MC_RETURN_IF_ERROR(GetString(j, "mc_host_id", false, &d.mc_host_id));
  MC_RETURN_IF_ERROR(GetUint(j, "mc_pid", UINT32_MAX, &d.mc_pid));
  MC_RETURN_IF_ERROR(GetString(j, "mc_shm_path", false, &d.mc_shm_path));
  uint64_t fence = 0;
  MC_RETURN_IF_ERROR(GetUint(j, "mc_tcp_fence", UINT32_MAX, &fence));
  d.mc_tcp_fence = fence == 1;
  MC_RETURN_IF_ERROR(GetHexField(j, "mc_ucx_worker", kMaxUcxWorkerAddressBytes, &d.mc_ucx_worker)
                         .WithContext("segment descriptor"));
  MC_RETURN_IF_ERROR(GetHexField(j, "mc_auth_instance", kMaxAuthFieldBytes, &d.mc_auth_instance)
                         .WithContext("segment descriptor"));
  MC_RETURN_IF_ERROR(GetHexField(j, "mc_auth_sig", kMaxAuthFieldBytes, &d.mc_auth_sig)
                         .WithContext("segment descriptor"));
  if (j.contains("buffers")) {
    const json& bufs = j["buffers"];
    if (!bufs.is_array()) return Status::DataLoss("segment descriptor: 'buffers' is not an array");
    if (bufs.size() > kMaxDescriptorBuffers) {
      return Status::DataLoss("segment descriptor: too many buffers");
    }
    d.buffers.reserve(bufs.size());
    for (size_t i = 0; i < bufs.size(); ++i) {
      const json& b = bufs[i];
      std::string where = "segment descriptor buffers[" + std::to_string(i) + "]";
      if (!b.is_object()) return Status::DataLoss(where + " is not an object");
      BufferDesc bd;
      MC_RETURN_IF_ERROR(GetString(b, "name", false, &bd.name).WithContext(where));
      MC_RETURN_IF_ERROR(GetUint(b, "addr", UINT64_MAX, &bd.addr).WithContext(where));
      MC_RETURN_IF_ERROR(GetUint(b, "length", UINT64_MAX, &bd.length).WithContext(where));
      if (bd.addr == 0 || bd.length == 0 || bd.addr + bd.length < bd.addr) {
        return Status::DataLoss(where + ": addr and length must be non-zero and not wrap");
      }
      MC_RETURN_IF_ERROR(GetString(b, "mc_location", false, &bd.location).WithContext(where));
      MC_RETURN_IF_ERROR(DecodeDeviceFields(b, &bd).WithContext(where));
      MC_RETURN_IF_ERROR(
          GetHexField(b, "mc_ucx_rkey", kMaxUcxRkeyBytes, &bd.ucx_rkey).WithContext(where));
      d.buffers.push_back(std::move(bd));
    }
  }
  return d;
}

std::string DescriptorTimestampNow() {
  timeval tv{};
  ::gettimeofday(&tv, nullptr);
  tm local{};
  ::localtime_r(&tv.tv_sec, &local);
  char buf[64];
  size_t n = std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &local);
  std::snprintf(buf + n, sizeof(buf) - n, ".%06ld", static_cast<long>(tv.tv_usec));
  return buf;
}

}  // namespace mooncake

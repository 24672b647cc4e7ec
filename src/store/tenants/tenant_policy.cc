#include "store/tenants/tenant_policy.h"

#include <fcntl.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "metadata/stores/etcd_kv.h"
#include "store/tenants/tenant_id.h"

namespace mooncake {
namespace store {

Result<uint64_t> ParseQuotaBytes(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  if (digits == 0) return Status::InvalidArgument("quota '" + text + "' does not start with an integer");
  uint64_t n = 0;
  for (size_t i = 0; i < digits; ++i) {
    const uint64_t d = static_cast<uint64_t>(text[i] - '0');
    if (n > (UINT64_MAX - d) / 10) return Status::InvalidArgument("quota '" + text + "' overflows");
    n = n * 10 + d;
  }
  if (n == 0) return Status::InvalidArgument("quota '" + text + "' is not positive");
  const std::string unit = text.substr(digits);
  uint64_t mult = 1;
  if (unit == "KB") {
    mult = uint64_t{1} << 10;
  } else if (unit == "MB") {
    mult = uint64_t{1} << 20;
  } else if (unit == "GB") {
    mult = uint64_t{1} << 30;
  } else if (unit == "TB") {
    mult = uint64_t{1} << 40;
  } else if (!unit.empty() && unit != "B") {
    return Status::InvalidArgument("quota '" + text + "': unit '" + unit +
                                   "' is not one of B, KB, MB, GB, TB");
  }
  if (n > TenantLedger::kMaxQuotaBytes / mult) {
    return Status::InvalidArgument("quota '" + text + "' is above 2^63 - 1 bytes");
  }
  return n * mult;
}

Result<TenantPolicies> ParseTenantPolicyYaml(const std::string& yaml) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(std::string("not YAML: ") + e.what());
  }
  TenantPolicies out;
  if (!root || root.IsNull()) return Status::InvalidArgument("empty policy: it needs 'version: 1'");
  if (!root.IsMap()) return Status::InvalidArgument("the policy is not a YAML mapping");
  try {
    const YAML::Node version = root["version"];
    if (!version || !version.IsScalar()) return Status::InvalidArgument("'version' is missing");
    if (version.as<std::string>() != "1") {
      return Status::InvalidArgument("unsupported policy version '" + version.as<std::string>() +
                                     "' (this master reads version 1)");
    }
    const YAML::Node tenants = root["tenants"];
    if (!tenants || tenants.IsNull()) return out;  // no tenant yet
    if (!tenants.IsSequence()) return Status::InvalidArgument("'tenants' is not a YAML sequence");
    for (size_t i = 0; i < tenants.size(); ++i) {
      const YAML::Node t = tenants[i];
      const std::string where = "tenants[" + std::to_string(i) + "]";
      if (!t.IsMap()) return Status::InvalidArgument(where + " is not a mapping");
      if (!t["name"] || !t["name"].IsScalar()) return Status::InvalidArgument(where + ": 'name' is missing");
      if (!t["quota"] || !t["quota"].IsScalar()) return Status::InvalidArgument(where + ": 'quota' is missing");
      const std::string name = t["name"].as<std::string>();
      const std::string problem = TenantIdProblem(name);
      if (!problem.empty()) return Status::InvalidArgument(where + ": " + problem);
      auto bytes = ParseQuotaBytes(t["quota"].as<std::string>());
      if (!bytes.ok()) return Status::InvalidArgument(where + " (" + name + "): " + bytes.status().message());
      if (out.size() >= kMaxTenants) {
        return Status::InvalidArgument("more than " + std::to_string(kMaxTenants) + " tenants");
      }
      if (!out.emplace(name, *bytes).second) {
        return Status::InvalidArgument(where + ": tenant '" + name + "' is listed twice");
      }
    }
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(std::string("bad policy: ") + e.what());
  }
  return out;
}

std::string TenantPolicyYaml(const TenantPolicies& policies) {
  YAML::Emitter e;
  e << YAML::BeginMap << YAML::Key << "version" << YAML::Value << 1;
  e << YAML::Key << "tenants" << YAML::Value << YAML::BeginSeq;
  for (const auto& [name, bytes] : policies) {
    e << YAML::BeginMap << YAML::Key << "name" << YAML::Value << YAML::DoubleQuoted << name
      << YAML::Key << "quota" << YAML::Value << std::to_string(bytes) << YAML::EndMap;
  }
  e << YAML::EndSeq << YAML::EndMap;
  return std::string(e.c_str()) + "\n";
}

namespace {

std::string Errno(const std::string& what, const std::string& path) {
  return what + " " + path + ": " + std::strerror(errno);
}

class FileSource final : public TenantPolicySource {
 public:
  explicit FileSource(std::string path) : path_(std::move(path)) {}

  Result<TenantPolicies> Load() override {
    std::ifstream in(path_, std::ios::binary);
    if (!in) {
      return Status::NotFound(Errno("cannot read the tenant quota policy file", path_) +
                              " (create it with 'version: 1' and a 'tenants' list)");
    }
    std::ostringstream text;
    text << in.rdbuf();
    if (text.str().size() > kMaxPolicyBytes) {
      return Status::InvalidArgument(path_ + " is over " + std::to_string(kMaxPolicyBytes) + " bytes");
    }
    auto parsed = ParseTenantPolicyYaml(text.str());
    if (!parsed.ok()) return Status::InvalidArgument(path_ + ": " + parsed.status().message());
    return parsed;
  }

  Status Save(const TenantPolicies& policies) override {
    const std::string text = TenantPolicyYaml(policies);
    const std::string tmp = path_ + ".tmp";
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return Status::Unavailable(Errno("cannot write", tmp));
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t w = ::write(fd, text.data() + done, text.size() - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        const Status s = Status::Unavailable(Errno("cannot write", tmp));
        ::close(fd);
        ::unlink(tmp.c_str());
        return s;
      }
      done += static_cast<size_t>(w);
    }
    if (::fsync(fd) != 0) {
      const Status s = Status::Unavailable(Errno("cannot fsync", tmp));
      ::close(fd);
      ::unlink(tmp.c_str());
      return s;
    }
    ::close(fd);
    if (::rename(tmp.c_str(), path_.c_str()) != 0) {
      const Status s = Status::Unavailable(Errno("cannot rename " + tmp + " to", path_));
      ::unlink(tmp.c_str());
      return s;
    }
    const size_t slash = path_.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path_.substr(0, slash));
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
    return Status::OK();
  }

  std::string Describe() const override { return "file " + path_; }

 private:
  static constexpr size_t kMaxPolicyBytes = 16 << 20;
  const std::string path_;
};

class EtcdSource final : public TenantPolicySource {
 public:
  EtcdSource(std::unique_ptr<EtcdKv> kv, std::string key) : kv_(std::move(kv)), key_(std::move(key)) {}

  Result<TenantPolicies> Load() override {
    auto got = kv_->Range(key_);
    if (!got.ok()) return Status::Unavailable(Describe() + ": " + got.status().message());
    if (got->kvs.empty()) return TenantPolicies{};
    auto parsed = ParseTenantPolicyYaml(got->kvs.front().value);
    if (!parsed.ok()) return Status::InvalidArgument(Describe() + ": " + parsed.status().message());
    return parsed;
  }

  Status Save(const TenantPolicies& policies) override {
    auto put = kv_->Put(key_, TenantPolicyYaml(policies));
    if (!put.ok()) return Status::Unavailable(Describe() + ": " + put.status().message());
    return Status::OK();
  }

  std::string Describe() const override { return kv_->Describe() + " key " + key_; }

 private:
  std::unique_ptr<EtcdKv> kv_;
  const std::string key_;
};

}  // namespace

Result<std::unique_ptr<TenantPolicySource>> MakeTenantPolicySource(const std::string& type,
                                                                   const std::string& uri,
                                                                   const std::string& cluster_id) {
  if (uri.empty()) {
    return Status::InvalidArgument("--tenant_quota_connector_uri is empty: give the policy file "
                                   "(type file) or the etcd members (type etcd)");
  }
  if (type == "file") {
    return std::unique_ptr<TenantPolicySource>(new FileSource(uri));
  }
  if (type == "etcd") {
    auto endpoints = ParseEtcdEndpoints(uri);
    if (!endpoints.ok()) return endpoints.status();
    auto kv = EtcdKv::Create(std::move(*endpoints), EtcdKv::Options{});
    if (!kv.ok()) return kv.status();
    return std::unique_ptr<TenantPolicySource>(
        new EtcdSource(std::move(*kv), "mooncake-store/" + cluster_id + "/tenant_quota_policy"));
  }
  return Status::InvalidArgument("--tenant_quota_connector_type '" + type +
                                 "' is not one of file, etcd");
}

}  // namespace store
}  // namespace mooncake

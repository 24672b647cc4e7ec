// MooncakeDistributedStore's registered-memory (zero-copy) calls, upserts, ranged reads, get
// and put sessions and batch_replica_clear (store_py.cc binds the rest; store_py.h says what
// they share). Conventions are store_py.cc's.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <glog/logging.h>

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "store_py.h"

namespace mooncake {
namespace pyapi {
namespace store_py {
namespace {

std::vector<int64_t> GetIntoMany(PyStore& s, const char* method,
                                 const std::vector<std::string>& keys,
                                 const std::vector<std::vector<Span>>& parts) {
  auto c = s.Get(method);
  if (!c) return std::vector<int64_t>(keys.size(), kNotReady);
  const bool batch = std::string(method).find("batch") != std::string::npos;
  OpTimer op(c.get(), store::OpKind::kRead, method);
  std::vector<int64_t> rc;
  if (!batch && keys.size() == 1 && parts.size() == 1) {
    rc = {c->Get(keys[0], parts[0])};  // upstream's Get (its get latency)
  } else {
    rc = c->BatchGet(keys, parts);
  }
  op.Done(!rc.empty() && rc[0] >= 0, batch, BytesRead(rc));
  return rc;
}

// The first failure of a batch, or 0 (put_batch / upsert_batch return one code).
int FirstFailure(const std::vector<int>& codes) {
  for (int code : codes) {
    if (code != 0) return code;
  }
  return 0;
}

// Views of Python buffers, kept alive while the spans are used.
struct Views {
  std::vector<std::unique_ptr<PyBufferView>> views;
  Span Add(const py::handle& obj) {
    views.push_back(std::make_unique<PyBufferView>(obj));
    return views.back()->span();
  }
};

std::vector<std::vector<Span>> MultiSpans(const std::vector<Ptrs>& ptrs,
                                          const std::vector<Sizes>& sizes, bool* ok) {
  std::vector<std::vector<Span>> out(ptrs.size());
  *ok = ptrs.size() == sizes.size();
  for (size_t i = 0; *ok && i < ptrs.size(); ++i) {
    if (ptrs[i].size() != sizes[i].size()) {
      *ok = false;
      break;
    }
    for (size_t j = 0; j < ptrs[i].size(); ++j) {
      out[i].push_back({reinterpret_cast<void*>(ptrs[i][j]), sizes[i][j]});
    }
  }
  return out;
}

using Offsets3 = std::vector<std::vector<std::vector<size_t>>>;

// get_into_ranges: buffer i receives, for each key j of all_keys[i], the ranges
// (all_src_offsets[i][j][k] in the object -> all_dst_offsets[i][j][k] in the buffer,
// all_sizes[i][j][k] bytes). The buffer must be registered (its room is its registration's
// end); result[i][j][k] is the bytes read or a negative code.
std::vector<std::vector<std::vector<int64_t>>> GetIntoRanges(
    PyStore& s, const Ptrs& buffers, const std::vector<std::vector<std::string>>& all_keys,
    const Offsets3& dst, const Offsets3& src, const Offsets3& sizes) {
  const int64_t bad = ToInt(ErrorCode::INVALID_PARAMS);
  std::vector<std::vector<std::vector<int64_t>>> out(all_keys.size());
  for (size_t i = 0; i < all_keys.size(); ++i) {
    out[i].resize(all_keys[i].size());
    for (size_t j = 0; j < all_keys[i].size(); ++j) {
      const size_t n = i < dst.size() && j < dst[i].size() ? dst[i][j].size() : 0;
      out[i][j].assign(n, bad);
    }
  }
  auto c = s.Get("get_into_ranges");
  if (!c) return out;
  if (buffers.size() != all_keys.size() || dst.size() != all_keys.size() ||
      src.size() != all_keys.size() || sizes.size() != all_keys.size()) {
    LOG(WARNING) << "get_into_ranges: buffer_ptrs, all_keys, all_dst_offsets, all_src_offsets "
                    "and all_sizes differ in length";
    return out;
  }
  std::vector<std::string> keys;
  std::vector<StoreClient::RangeRead> ranges;
  std::vector<std::tuple<size_t, size_t, size_t>> where;  // range -> (i, j, k)
  for (size_t i = 0; i < buffers.size(); ++i) {
    char* base = reinterpret_cast<char*>(buffers[i]);
    const uint64_t room = c->RegisteredRoom(base);
    if (room == 0) {
      LOG(WARNING) << "get_into_ranges: buffer " << i << " is not registered (register_buffer "
                   << "it first)";
      continue;
    }
    for (size_t j = 0; j < all_keys[i].size(); ++j) {
      if (j >= dst[i].size() || j >= src[i].size() || j >= sizes[i].size() ||
          dst[i][j].size() != src[i][j].size() || dst[i][j].size() != sizes[i][j].size()) {
        LOG(WARNING) << "get_into_ranges: the offsets and sizes of key " << all_keys[i][j]
                     << " differ in shape";
        continue;
      }
      keys.push_back(all_keys[i][j]);
      for (size_t k = 0; k < dst[i][j].size(); ++k) {
        const size_t d = dst[i][j][k], n = sizes[i][j][k];
        if (d > room || n > room - d) {
          LOG(WARNING) << "get_into_ranges: range " << k << " of key " << all_keys[i][j]
                       << " ends past buffer " << i << "'s registered room (" << room
                       << " bytes)";
          continue;
        }
        ranges.push_back({keys.size() - 1, src[i][j][k], {base + d, n}});
        where.emplace_back(i, j, k);
      }
    }
  }
  std::vector<int64_t> got;
  {
    py::gil_scoped_release release;
    OpTimer op(c.get(), store::OpKind::kRead, "get_into_ranges");
    got = c->GetRanges(keys, ranges);
    op.Done(true, true, BytesRead(got));
  }
  for (size_t r = 0; r < ranges.size(); ++r) {
    auto [i, j, k] = where[r];
    out[i][j][k] = got[r];
  }
  return out;
}

// batch_get_into_multi_buffer_ranges / batch_put_from_multi_buffer_ranges: key i's ranges are
// buffers ptrs[i][j] of sizes[i][j] bytes at offsets[i][j] of its object; run(client, ranges)
// does the call (per key the bytes moved or a negative code). A key whose lists differ in
// length gets INVALID_PARAMS; lists of another length than keys, INVALID_PARAMS for every key
// after a log line (`offsets_name`: the argument's name); not set up, an empty list.
template <class Run>
std::vector<int64_t> SessionRangeCall(PyStore& s, const char* method, const char* offsets_name,
                                      const std::vector<std::string>& keys,
                                      const std::vector<Ptrs>& ptrs,
                                      const std::vector<Sizes>& sizes,
                                      const std::vector<Sizes>& offsets, Run run) {
  auto cl = s.Get(method);
  if (!cl) return {};
  if (ptrs.size() != keys.size() || sizes.size() != keys.size() ||
      offsets.size() != keys.size()) {
    LOG(WARNING) << method << ": keys, all_buffer_ptrs, all_sizes and " << offsets_name
                 << " differ in length";
    return std::vector<int64_t>(keys.size(), ToInt(ErrorCode::INVALID_PARAMS));
  }
  std::vector<StoreClient::RangeRead> ranges;
  std::vector<char> bad(keys.size(), 0);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (ptrs[i].size() != sizes[i].size() || ptrs[i].size() != offsets[i].size()) {
      bad[i] = 1;
      continue;
    }
    for (size_t j = 0; j < ptrs[i].size(); ++j) {
      ranges.push_back({i, offsets[i][j], {reinterpret_cast<void*>(ptrs[i][j]), sizes[i][j]}});
    }
  }
  // Both session range calls are upstream interfaces of their own names; the put one writes.
  OpTimer op(cl.get(),
             std::string(method).find("put") != std::string::npos ? store::OpKind::kWrite
                                                                  : store::OpKind::kRead,
             method);
  std::vector<int64_t> out = run(*cl, ranges);
  op.Done(true, true, BytesRead(out));
  for (size_t i = 0; i < keys.size(); ++i) {
    if (bad[i]) out[i] = ToInt(ErrorCode::INVALID_PARAMS);
  }
  return out;
}

void BindZeroCopy(py::class_<PyStore>& c, const PyReplicateConfig& kDefault) {
  // ---- registered memory (zero copy) ----
  c.def(
      "register_buffer",
      [](PyStore& s, uintptr_t ptr, size_t size, bool remote_accessible) {
        auto cl = s.Get("register_buffer");
        return cl ? cl->RegisterBuffer(reinterpret_cast<void*>(ptr), size, remote_accessible)
                  : kNotReady;
      },
      Release(), py::arg("buffer_ptr"), py::arg("size"), py::arg("remote_accessible") = true);
  c.def(
      "unregister_buffer",
      [](PyStore& s, uintptr_t ptr) {
        auto cl = s.Get("unregister_buffer");
        return cl ? cl->UnregisterBuffer(reinterpret_cast<void*>(ptr)) : kNotReady;
      },
      Release(), py::arg("buffer_ptr"));
  c.def(
      "put_from",
      [](PyStore& s, const std::string& key, uintptr_t ptr, size_t size,
         const PyReplicateConfig& config) {
        return PutFromMany(s, "put_from", {key}, {{{reinterpret_cast<void*>(ptr), size}}},
                           config)[0];
      },
      Release(), py::arg("key"), py::arg("buffer_ptr"), py::arg("size"),
      py::arg("config") = kDefault);
  c.def(
      "put_from_with_metadata",
      [](PyStore& s, const std::string& key, uintptr_t ptr, uintptr_t metadata_ptr, size_t size,
         size_t metadata_size, const PyReplicateConfig& config) {
        // One object: the metadata's bytes, then the data's (upstream's layout), both moved
        // from where they are. An empty data part is refused (upstream answers 0 and stores
        // nothing, which a caller cannot tell from a put).
        if (size == 0) {
          LOG(WARNING) << "put_from_with_metadata(" << key << "): size is 0: nothing to store";
          return ToInt(ErrorCode::INVALID_PARAMS);
        }
        std::vector<Span> parts;
        if (metadata_size > 0) parts.push_back({reinterpret_cast<void*>(metadata_ptr), metadata_size});
        parts.push_back({reinterpret_cast<void*>(ptr), size});
        return PutFromMany(s, "put_from_with_metadata", {key}, {parts}, config)[0];
      },
      Release(), py::arg("key"), py::arg("buffer_ptr"), py::arg("metadata_buffer_ptr"),
      py::arg("size"), py::arg("metadata_size"), py::arg("config") = kDefault,
      "Stores the metadata buffer's bytes followed by the data buffer's as one object of "
      "metadata_size + size bytes, from registered (or staged) memory. 0 or a negative code.");
  c.def(
      "get_into",
      [](PyStore& s, const std::string& key, uintptr_t ptr, size_t size) {
        return GetIntoMany(s, "get_into", {key}, {{{reinterpret_cast<void*>(ptr), size}}})[0];
      },
      Release(), py::arg("key"), py::arg("buffer_ptr"), py::arg("size"));
  c.def(
      "batch_put_from",
      [](PyStore& s, const std::vector<std::string>& keys, const Ptrs& ptrs, const Sizes& sizes,
         const PyReplicateConfig& config) {
        if (keys.size() != ptrs.size() || keys.size() != sizes.size()) {
          LOG(WARNING) << "batch_put_from: keys, buffer_ptrs and sizes differ in length";
          return std::vector<int>(keys.size(), ToInt(ErrorCode::INVALID_PARAMS));
        }
        std::vector<std::vector<Span>> parts;
        for (size_t i = 0; i < keys.size(); ++i) {
          parts.push_back({{reinterpret_cast<void*>(ptrs[i]), sizes[i]}});
        }
        return PutFromMany(s, "batch_put_from", keys, parts, config);
      },
      Release(), py::arg("keys"), py::arg("buffer_ptrs"), py::arg("sizes"),
      py::arg("config") = kDefault);
  c.def(
      "batch_get_into",
      [](PyStore& s, const std::vector<std::string>& keys, const Ptrs& ptrs, const Sizes& sizes) {
        if (keys.size() != ptrs.size() || keys.size() != sizes.size()) {
          LOG(WARNING) << "batch_get_into: keys, buffer_ptrs and sizes differ in length";
          return std::vector<int64_t>(keys.size(), ToInt(ErrorCode::INVALID_PARAMS));
        }
        std::vector<std::vector<Span>> parts;
        for (size_t i = 0; i < keys.size(); ++i) {
          parts.push_back({{reinterpret_cast<void*>(ptrs[i]), sizes[i]}});
        }
        return GetIntoMany(s, "batch_get_into", keys, parts);
      },
      Release(), py::arg("keys"), py::arg("buffer_ptrs"), py::arg("sizes"));
  c.def(
      "batch_put_from_multi_buffers",
      [](PyStore& s, const std::vector<std::string>& keys, const std::vector<Ptrs>& ptrs,
         const std::vector<Sizes>& sizes, const PyReplicateConfig& config) {
        bool ok = false;
        auto parts = MultiSpans(ptrs, sizes, &ok);
        if (!ok || parts.size() != keys.size()) {
          LOG(WARNING) << "batch_put_from_multi_buffers: keys, all_buffer_ptrs and all_sizes "
                          "differ in shape";
          return std::vector<int>(keys.size(), ToInt(ErrorCode::INVALID_PARAMS));
        }
        return PutFromMany(s, "batch_put_from_multi_buffers", keys, parts, config);
      },
      Release(), py::arg("keys"), py::arg("all_buffer_ptrs"), py::arg("all_sizes"),
      py::arg("config") = kDefault);
  c.def(
      "batch_get_into_multi_buffers",
      [](PyStore& s, const std::vector<std::string>& keys, const std::vector<Ptrs>& ptrs,
         const std::vector<Sizes>& sizes, bool) {
        bool ok = false;
        auto parts = MultiSpans(ptrs, sizes, &ok);
        if (!ok || parts.size() != keys.size()) {
          LOG(WARNING) << "batch_get_into_multi_buffers: keys, all_buffer_ptrs and all_sizes "
                          "differ in shape";
          return std::vector<int64_t>(keys.size(), ToInt(ErrorCode::INVALID_PARAMS));
        }
        return GetIntoMany(s, "batch_get_into_multi_buffers", keys, parts);
      },
      Release(), py::arg("keys"), py::arg("all_buffer_ptrs"), py::arg("all_sizes"),
      py::arg("prefer_alloc_in_same_node") = false);
}

void BindObjectApi(py::class_<PyStore>& c, const PyReplicateConfig& kDefault) {
  // ---- upsert: put that replaces an existing value ----
  c.def(
      "upsert",
      [](PyStore& s, const std::string& key, const py::buffer& value,
         const PyReplicateConfig& config) {
        Views v;
        std::vector<std::vector<Span>> parts{{v.Add(value)}};
        py::gil_scoped_release release;
        return PutFromMany(s, "upsert", {key}, parts, config, true)[0];
      },
      py::arg("key"), py::arg("value"), py::arg("config") = kDefault,
      "Stores value under key, replacing an existing value. Readers see the old value or the "
      "new one, never a mix. 0 or a negative code.");
  c.def(
      "upsert_parts",
      [](PyStore& s, const std::string& key, const py::args& args,
         const PyReplicateConfig& config) {
        Views v;
        std::vector<std::vector<Span>> parts(1);
        for (const auto& p : args) parts[0].push_back(v.Add(p));
        py::gil_scoped_release release;
        return PutFromMany(s, "upsert_parts", {key}, parts, config, true)[0];
      },
      py::arg("key"), py::arg("config") = kDefault);
  c.def(
      "upsert_batch",
      [](PyStore& s, const std::vector<std::string>& keys, const std::vector<py::buffer>& values,
         const PyReplicateConfig& config) {
        if (keys.size() != values.size()) {
          LOG(WARNING) << "upsert_batch: " << keys.size() << " keys but " << values.size()
                       << " values";
          return ToInt(ErrorCode::INVALID_PARAMS);
        }
        Views v;
        std::vector<std::vector<Span>> parts;
        for (const auto& b : values) parts.push_back({v.Add(b)});
        py::gil_scoped_release release;
        return FirstFailure(PutFromMany(s, "upsert_batch", keys, parts, config, true));
      },
      py::arg("keys"), py::arg("values"), py::arg("config") = kDefault);
  c.def(
      "upsert_from",
      [](PyStore& s, const std::string& key, uintptr_t ptr, size_t size,
         const PyReplicateConfig& config) {
        return PutFromMany(s, "upsert_from", {key}, {{{reinterpret_cast<void*>(ptr), size}}},
                           config, true)[0];
      },
      Release(), py::arg("key"), py::arg("buffer_ptr"), py::arg("size"),
      py::arg("config") = kDefault);
  c.def(
      "batch_upsert_from",
      [](PyStore& s, const std::vector<std::string>& keys, const Ptrs& ptrs, const Sizes& sizes,
         const PyReplicateConfig& config) {
        if (keys.size() != ptrs.size() || keys.size() != sizes.size()) {
          LOG(WARNING) << "batch_upsert_from: keys, buffer_ptrs and sizes differ in length";
          return std::vector<int>(keys.size(), ToInt(ErrorCode::INVALID_PARAMS));
        }
        std::vector<std::vector<Span>> parts;
        for (size_t i = 0; i < keys.size(); ++i) {
          parts.push_back({{reinterpret_cast<void*>(ptrs[i]), sizes[i]}});
        }
        return PutFromMany(s, "batch_upsert_from", keys, parts, config, true);
      },
      Release(), py::arg("keys"), py::arg("buffer_ptrs"), py::arg("sizes"),
      py::arg("config") = kDefault);

  // ---- ranged reads and get sessions ----
  c.def("get_into_ranges", &GetIntoRanges, py::arg("buffer_ptrs"), py::arg("all_keys"),
        py::arg("all_dst_offsets"), py::arg("all_src_offsets"), py::arg("all_sizes"),
        "Reads byte ranges of objects into registered buffers: result[i][j][k] is the bytes "
        "read for range k of key all_keys[i][j] into buffer_ptrs[i], or a negative code.");
  c.def(
      "batch_get_session_start",
      [](PyStore& s, const std::vector<std::string>& keys) {
        auto cl = s.Get("batch_get_session_start");
        return cl ? cl->GetSessionStart(keys) : std::vector<int>{};
      },
      Release(), py::arg("keys"),
      "Looks the keys up once and holds their leases: per key 0 or a negative code.");
  c.def(
      "batch_get_into_multi_buffer_ranges",
      [](PyStore& s, const std::vector<std::string>& keys, const std::vector<Ptrs>& ptrs,
         const std::vector<Sizes>& sizes, const std::vector<Sizes>& src_offsets) {
        return SessionRangeCall(
            s, "batch_get_into_multi_buffer_ranges", "all_src_offsets", keys, ptrs, sizes,
            src_offsets, [&](StoreClient& cl, const std::vector<StoreClient::RangeRead>& ranges) {
              return cl.GetSessionRanges(keys, ranges);
            });
      },
      Release(), py::arg("keys"), py::arg("all_buffer_ptrs"), py::arg("all_sizes"),
      py::arg("all_src_offsets"),
      "Reads ranges of session keys (no master round trip): per key the bytes read or a "
      "negative code.");
  c.def(
      "batch_get_session_end",
      [](PyStore& s, const std::vector<std::string>& keys) {
        auto cl = s.Get("batch_get_session_end");
        return cl ? cl->GetSessionEnd(keys) : kNotReady;
      },
      Release(), py::arg("keys"));

  c.def(
      "batch_put_session_start",
      [](PyStore& s, const std::vector<std::string>& keys, const std::vector<uint64_t>& sizes,
         const PyReplicateConfig& config) {
        if (int rc = config.Check("batch_put_session_start", keys.size()); rc != 0) {
          return std::vector<int>(keys.size(), rc);
        }
        auto cl = s.Get("batch_put_session_start");
        return cl ? cl->PutSessionStart(keys, sizes, config.ToCpp()) : std::vector<int>{};
      },
      Release(), py::arg("keys"), py::arg("sizes"), py::arg("config") = kDefault,
      "Reserves each object (invisible to readers until batch_put_session_end): per key 0 or a "
      "negative code.");
  c.def(
      "batch_put_from_multi_buffer_ranges",
      [](PyStore& s, const std::vector<std::string>& keys, const std::vector<Ptrs>& ptrs,
         const std::vector<Sizes>& sizes, const std::vector<Sizes>& dst_offsets) {
        return SessionRangeCall(
            s, "batch_put_from_multi_buffer_ranges", "all_dst_offsets", keys, ptrs, sizes,
            dst_offsets, [&](StoreClient& cl, const std::vector<StoreClient::RangeRead>& ranges) {
              return cl.PutSessionRanges(keys, ranges);
            });
      },
      Release(), py::arg("keys"), py::arg("all_buffer_ptrs"), py::arg("all_sizes"),
      py::arg("all_dst_offsets"),
      "Writes ranges of put-session objects: per key the bytes written or a negative code.");
  c.def(
      "batch_put_session_end",
      [](PyStore& s, const std::vector<std::string>& keys) {
        auto cl = s.Get("batch_put_session_end");
        return cl ? cl->PutSessionEnd(keys) : std::vector<int>{};
      },
      Release(), py::arg("keys"), "Makes the session objects readable: per key 0 or a code.");
  c.def(
      "batch_put_session_revoke",
      [](PyStore& s, const std::vector<std::string>& keys) {
        auto cl = s.Get("batch_put_session_revoke");
        return cl ? cl->PutSessionRevoke(keys) : std::vector<int>{};
      },
      Release(), py::arg("keys"), "Drops the session objects: per key 0 or a code.");

  c.def(
      "batch_replica_clear",
      [](PyStore& s, const std::vector<std::string>& keys, const std::string& segment_name) {
        auto cl = s.Get("batch_replica_clear");
        return cl ? cl->BatchReplicaClear(keys, segment_name) : std::vector<std::string>{};
      },
      Release(), py::arg("keys"), py::arg("segment_name") = "",
      "Of the keys this client put, complete and with no lease, drops the replicas on "
      "segment_name ('' : the whole object). Returns the keys cleared.");
}

}  // namespace

void BindBatchApi(py::class_<PyStore>& c, const PyReplicateConfig& kDefault) {
  BindZeroCopy(c, kDefault);
  BindObjectApi(c, kDefault);
}

}  // namespace store_py
}  // namespace pyapi
}  // namespace mooncake

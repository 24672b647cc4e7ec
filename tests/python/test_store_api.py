"""mooncake.store against a real mooncake_master: the client in this process contributes no
memory (global_segment_size 0), so every object lies in the segment of a holder client in
another process and every put / get crosses the transfer engine. Return conventions are
upstream's (docs/store_upstream.md)."""
import ctypes
import threading
import time

import pytest

from mc_helpers import HostBuffer, engine, make_engine, require_torch, segment_of
from store_helpers import Master, buf, data, new_store, ptr, store_fixtures, wait_until

from mooncake.store import MooncakeDistributedStore, ReplicateConfig  # noqa: E402

np = pytest.importorskip("numpy")

LEASE_MS = 1000

master, holder, store = store_fixtures(lease_ms=LEASE_MS, holder_segment=96 << 20)


def test_seed_import_line():
    from mooncake.store import MooncakeDistributedStore  # noqa: F401
    from mooncake.engine import TransferEngine  # noqa: F401
    assert MooncakeDistributedStore().health_check() == 1  # not set up


def test_put_get_and_existing_key_keeps_value(store, holder):
    assert store.put("k", b"v1") == 0
    assert store.put("k", b"other") == 0         # exists: 0, value kept
    assert store.get("k") == b"v1"
    assert store.get_size("k") == 2
    assert store.is_exist("k") == 1 and store.is_exist("nope") == 0
    assert store.get("nope") == b""
    assert store.get_size("nope") == -704
    assert store.remove("nope") == -704
    assert store.put_parts("parts", b"ab", bytearray(b"cd"), memoryview(b"ef")) == 0
    assert store.get("parts") == b"abcdef"
    # the other process sees it too
    assert holder.call("result = store.get('k')") == b"v1"
    assert store.remove("k", force=True) == 0
    assert store.get("k") == b"" and store.is_exist("k") == 0


def test_zero_copy_put_from_get_into(store):
    n = (1 << 20) + 3
    src, dst = buf(n, seed=7), buf(n + 64)
    assert store.register_buffer(ptr(src), src.nbytes) == 0
    assert store.register_buffer(ptr(dst), dst.nbytes) == 0
    assert store.put_from("zc", ptr(src), n) == 0
    assert store.get_into("zc", ptr(dst, 5), n) == n
    assert dst[5:5 + n].tobytes() == src.tobytes()
    assert store.get_into("zc", ptr(dst), n - 1) == -600        # buffer too small
    assert store.get_into("zc", ptr(dst), n + 64) == n          # larger: the object's size
    assert store.get_into("missing", ptr(dst), n) == -704
    # unregistered memory works as well (staged through the local buffer)
    plain = buf(n)
    assert store.get_into("zc", ptr(plain), n) == n
    assert plain.tobytes() == src.tobytes()
    assert store.put_from("zc-plain", ptr(plain, 1), 4096) == 0
    assert store.get("zc-plain") == src[1:4097].tobytes()
    assert store.unregister_buffer(ptr(src)) == 0
    assert store.unregister_buffer(ptr(src)) == -600             # twice
    assert store.unregister_buffer(ptr(dst)) == 0
    assert store.unregister_buffer(12345) == -600                # never registered


def test_put_batch_get_batch(store):
    keys = [f"b{i}" for i in range(5)]
    values = [data(i, 100 + i * 1000) for i in range(5)]
    assert store.put_batch(keys, values) == 0
    got = store.get_batch(keys[:2] + ["missing"] + keys[2:])
    assert got == values[:2] + [b""] + values[2:]
    assert store.batch_is_exist([keys[0], "missing"]) == [1, 0]
    assert store.put_batch(["x", "y"], [b"1"]) == -600           # mismatched lengths
    assert store.batch_is_exist(["x", "y"]) == [0, 0]
    assert store.batch_remove([keys[0], "missing"], force=True) == [0, -704]
    assert store.get_batch([]) == [] and store.batch_is_exist([]) == []


def test_batch_put_from_get_into(store):
    n, k = 64 << 10, 4
    src, dst = buf(n * k, seed=3), buf(n * k)
    assert store.register_buffer(ptr(src), src.nbytes) == 0
    assert store.register_buffer(ptr(dst), dst.nbytes) == 0
    keys = [f"bp{i}" for i in range(k)]
    assert store.batch_put_from(keys, [ptr(src, i * n) for i in range(k)], [n] * k) == [0] * k
    rc = store.batch_get_into([keys[0], "missing", keys[2]],
                              [ptr(dst, 0), ptr(dst, n), ptr(dst, 2 * n)], [n, n, n])
    assert rc == [n, -704, n]
    assert dst[:n].tobytes() == src[:n].tobytes()
    assert not dst[n:2 * n].any()
    assert dst[2 * n:3 * n].tobytes() == src[2 * n:3 * n].tobytes()
    # a buffer too small in one slot fails that slot only
    assert store.batch_get_into(keys[:2], [ptr(dst), ptr(dst, n)], [n, n - 1]) == [n, -600]
    # mismatched list lengths: every slot -600, nothing stored
    assert store.batch_put_from(["m1", "m2", "m3"], [ptr(src)] * 2, [n] * 3) == [-600] * 3
    assert store.batch_put_from(["m1", "m2"], [ptr(src)] * 2, [n]) == [-600] * 2
    assert store.batch_get_into(keys[:3], [ptr(dst)] * 3, [n] * 2) == [-600] * 3
    assert store.batch_is_exist(["m1", "m2", "m3"]) == [0, 0, 0]
    assert store.batch_put_from_multi_buffers(["m1", "m2"], [[ptr(src)]], [[n]]) == [-600] * 2
    assert store.batch_put_from_multi_buffers(["m1"], [[ptr(src), ptr(src)]], [[n]]) == [-600]
    assert store.batch_get_into_multi_buffers(keys[:2], [[ptr(dst)], [ptr(dst)]],
                                              [[n], [n, n]]) == [-600] * 2
    assert store.unregister_buffer(ptr(src)) == 0 and store.unregister_buffer(ptr(dst)) == 0


def test_large_batches_in_overlapped_rounds_keep_every_slot(store):
    # Same-host copies end within their Submit, so batches of 64 keys or more go in two (or,
    # past 4096 keys, more) rounds whose master calls overlap the copies (GetMany /
    # PutRound): every slot must still get its own bytes and its own code.
    n, k = 1024, 5000
    src, dst = buf(n * k, seed=11), buf(n * k)
    assert store.register_buffer(ptr(src), src.nbytes) == 0
    assert store.register_buffer(ptr(dst), dst.nbytes) == 0
    sizes = [n - (i % 7) for i in range(k)]
    assert store.batch_put_from(["warm"], [ptr(src)], [n]) == [0]  # a first, inline copy
    keys = [f"big{i}" for i in range(k)]
    ptrs = [ptr(src, i * n) for i in range(k)]
    assert store.batch_put_from(keys[:200], ptrs[:200], sizes[:200]) == [0] * 200
    assert store.batch_put_from(keys, ptrs, sizes) == [0] * k  # the first 200 exist: kept
    # missing keys and a too-small buffer in both halves of a 128-key batch
    ask = keys[:128]
    ask[5], ask[100] = "absent-a", "absent-b"
    lens = sizes[:128]
    lens[30], lens[120] = 1, 1
    rc = store.batch_get_into(ask, [ptr(dst, i * n) for i in range(128)], lens)
    for i in range(128):
        if i in (5, 100):
            assert rc[i] == -704, i
        elif i in (30, 120):
            assert rc[i] == -600, i
        else:
            assert rc[i] == sizes[i], i
            assert dst[i * n:i * n + sizes[i]].tobytes() == src[i * n:i * n + sizes[i]].tobytes()
    dst[:] = 0
    rc = store.batch_get_into(keys, [ptr(dst, i * n) for i in range(k)], sizes)
    assert rc == sizes
    for i in range(k):
        assert dst[i * n:i * n + sizes[i]].tobytes() == src[i * n:i * n + sizes[i]].tobytes(), i
    assert store.unregister_buffer(ptr(src)) == 0 and store.unregister_buffer(ptr(dst)) == 0


def test_multi_buffers_round_trip(store):
    # each object is three scattered parts; it is read back split differently
    parts = [[5000, 1, 70000], [1 << 20, 3, 17], [4096, 4096, 4096]]
    src = buf(4 << 20, seed=11)
    keys, ptrs, off = [], [], 0
    for i, sizes in enumerate(parts):
        keys.append(f"mb{i}")
        row = []
        for s in sizes:
            row.append(ptr(src, off))
            off += s + 123
        ptrs.append(row)
    assert store.batch_put_from_multi_buffers(keys, ptrs, parts) == [0, 0, 0]
    expected = [b"".join(src[p - ptr(src):p - ptr(src) + s].tobytes() for p, s in zip(row, sizes))
                for row, sizes in zip(ptrs, parts)]
    dst = buf(4 << 20)
    totals = [sum(s) for s in parts]
    out_sizes = [[t // 2, t - t // 2] for t in totals]
    out_ptrs, off = [], 0
    for sizes in out_sizes:
        out_ptrs.append([ptr(dst, off), ptr(dst, off + sizes[0] + 7)])
        off += sum(sizes) + 64
    rc = store.batch_get_into_multi_buffers(keys + ["missing"], out_ptrs + [[ptr(dst)]],
                                            out_sizes + [[16]])
    assert rc == totals + [-704]
    for row, sizes, exp in zip(out_ptrs, out_sizes, expected):
        got = b"".join(ctypes.string_at(p, s) for p, s in zip(row, sizes))
        assert got == exp
    assert store.get_batch(keys) == expected


def test_get_buffer(store):
    value = data(5, 300_001)
    assert store.put("gb", value) == 0
    assert store.put("gb-empty-ish", b"z") == 0
    h = store.get_buffer("gb")
    assert h is not None
    assert len(h) == h.size() == len(value)
    assert bytes(memoryview(h)) == value
    assert ctypes.string_at(h.ptr(), h.size()) == value
    assert store.get_buffer("missing") is None
    hs = store.batch_get_buffer(["gb", "missing", "gb-empty-ish"])
    assert hs[1] is None
    assert bytes(memoryview(hs[0])) == value and bytes(hs[2]) == b"z"
    assert memoryview(hs[0]).readonly
    store.close()
    assert bytes(memoryview(h)) == value   # the handle owns its memory


def test_lease_blocks_remove_until_it_ends(store):
    assert store.put("lk", b"leased") == 0
    assert store.remove("lk") != -706           # never read: no lease
    assert store.put("lk", b"leased") == 0
    t0 = time.monotonic()
    assert store.get("lk") == b"leased"         # takes a lease of LEASE_MS
    assert store.remove("lk") == -706
    wait_until(lambda: store.remove("lk") == 0, 10, interval=0.05, what="the lease to end")
    elapsed = time.monotonic() - t0
    assert elapsed >= LEASE_MS / 1000 * 0.8, elapsed
    assert store.is_exist("lk") == 0
    # force removes at once
    assert store.put("lf", b"x") == 0 and store.get("lf") == b"x"
    assert store.remove("lf") == -706
    assert store.remove("lf", force=True) == 0
    assert store.is_exist("lf") == 0


def test_remove_by_regex_and_remove_all_return_counts(store):
    for k in ["rx_a1", "rx_a2", "rx_b1", "other"]:
        assert store.put(k, k.encode()) == 0
    assert store.remove_by_regex("^rx_a") == 2
    assert store.batch_is_exist(["rx_a1", "rx_a2", "rx_b1"]) == [0, 0, 1]
    assert store.get("rx_b1") == b"rx_b1"       # leased now
    assert store.remove_by_regex("^rx_") == 0
    assert store.remove_by_regex("^rx_", force=True) == 1
    assert store.remove_by_regex("(unclosed") < 0
    for k in ["ra1", "ra2", "ra3"]:
        assert store.put(k, b"v") == 0
    assert store.get("ra1") == b"v"
    assert store.remove_all() == 3              # "other", ra2, ra3; ra1 is leased
    assert store.remove_all(force=True) == 1
    assert store.remove_all(force=True) == 0


def test_bounds_and_re2_syntax(store):
    """Issue 14: keys over 4 KiB are refused (-400) at every call, remove_by_regex takes RE2
    syntax (backreferences are refused, -600) and runs in linear time, and batches over the
    master's 4096-item bound are split by the client."""
    big = "k" * 4097
    assert store.put(big, b"x") == -400
    assert store.get(big) == b""
    assert store.get_size(big) == -400
    assert store.remove(big) == -400
    assert store.put("a" * 4096, b"x") == 0              # the longest key allowed
    assert store.put("a" * 33 + "b", b"y") == 0
    t0 = time.monotonic()
    assert store.remove_by_regex("^(a|a)*$") == 1        # std::regex: exponential time
    assert store.remove_by_regex("^(a|a)*b$") == 1
    assert time.monotonic() - t0 < 2
    assert store.remove_by_regex(r"(a)\1") == -600       # not RE2: refused, not run
    assert store.remove_by_regex("a" * 5000) == -600     # pattern over 4 KiB
    keys = [f"many{i}" for i in range(5000)]
    assert store.put_batch(keys, [b"v"] * len(keys)) == 0
    assert store.batch_is_exist(keys) == [1] * len(keys)
    assert store.batch_remove(keys, force=True) == [0] * len(keys)


def test_tensors(store):
    torch = require_torch()
    for dtype in (torch.float32, torch.bfloat16):
        t = torch.randn(3, 5, 7).to(dtype)
        key = f"t-{dtype}"
        assert store.put_tensor(key, t) == 0
        back = store.get_tensor(key)
        assert back.dtype == dtype and back.shape == t.shape
        assert torch.equal(back, t)
    big = torch.arange(1 << 20, dtype=torch.float32).reshape(256, -1)
    assert store.put_tensor("t-big", big) == 0
    assert torch.equal(store.get_tensor("t-big"), big)
    assert store.get_tensor("missing") is None
    assert store.put_tensor("not-a-tensor", [1, 2]) == -600


def test_sglang_pattern(store):
    """Pages of one big registered buffer are stored by key (batch_is_exist first, then
    batch_put_from at offsets) and read into another registered buffer."""
    page, pages = 64 << 10, 32
    kv = buf(page * pages, seed=21)
    dst = buf(page * pages)
    assert store.register_buffer(ptr(kv), kv.nbytes) == 0
    assert store.register_buffer(ptr(dst), dst.nbytes) == 0
    keys = [f"sgl_page_{i}" for i in range(pages)]
    assert store.batch_is_exist(keys) == [0] * pages
    first = keys[:pages // 2]
    assert store.batch_put_from(first, [ptr(kv, i * page) for i in range(pages // 2)],
                                [page] * len(first)) == [0] * len(first)
    exist = store.batch_is_exist(keys)
    assert exist == [1] * (pages // 2) + [0] * (pages // 2)
    todo = [i for i, e in enumerate(exist) if not e]
    assert store.batch_put_from([keys[i] for i in todo], [ptr(kv, i * page) for i in todo],
                                [page] * len(todo)) == [0] * len(todo)
    # read back in reverse page order
    rc = store.batch_get_into(keys, [ptr(dst, (pages - 1 - i) * page) for i in range(pages)],
                              [page] * pages)
    assert rc == [page] * pages
    for i in range(pages):
        assert dst[(pages - 1 - i) * page:(pages - i) * page].tobytes() == \
            kv[i * page:(i + 1) * page].tobytes()
    assert store.unregister_buffer(ptr(kv)) == 0 and store.unregister_buffer(ptr(dst)) == 0


def test_threads_put_get_and_metrics(store, master):
    threads, ops, size = 8, 100, 1 << 20
    errors = []
    before = master.metrics()

    def worker(t):
        try:
            a = buf(size, seed=100 + t)
            for i in range(ops):
                a[:8] = np.frombuffer(np.int64(t * 1000 + i).tobytes(), dtype=np.uint8)
                key = f"thr{t}_{i}"
                rc = store.put(key, a)
                assert rc == 0, (key, rc)
                got = store.get(key)
                assert got == a.tobytes(), key
                assert store.remove(key, force=True) == 0
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=150)
    assert not any(t.is_alive() for t in ts)
    assert not errors, errors[:3]
    m = master.metrics()
    for name in ("master_key_count", "master_total_capacity_bytes", "master_allocated_bytes",
                 "master_mounted_segments", "master_active_clients",
                 "master_put_start_requests_total", "master_get_replica_list_requests_total"):
        assert name in m, name
    assert m["master_total_capacity_bytes"] == 96 << 20
    assert m["master_mounted_segments"] == 1
    n = threads * ops  # single-key calls: upstream's single-call counters
    assert m["master_put_start_requests_total"] - before["master_put_start_requests_total"] == n
    assert m["master_put_end_requests_total"] - before["master_put_end_requests_total"] == n
    assert (m["master_get_replica_list_requests_total"] -
            before["master_get_replica_list_requests_total"]) == n
    assert m["master_remove_requests_total"] - before["master_remove_requests_total"] == n


def test_engine_sharing(master, holder):
    te = engine.TransferEngine()
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 8 << 20, 8 << 20, "tcp", "", master.addr,
                   engine=te) == -600                  # not initialized yet
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 8 << 20, 8 << 20, "tcp", "", master.addr,
                   engine="not an engine") == -600
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 8 << 20, 8 << 20, "tcp", "", master.addr,
                   engine=te) == 0
    try:
        assert s.get_hostname() == segment_of(te)
        value = data(9, 3 << 20)
        assert s.put("shared", value) == 0
        assert s.get("shared") == value
        assert holder.call("result = store.get('shared') == data(9, 3 << 20)") is True

        def te_transfers():
            target = make_engine()
            src, dst = HostBuffer(1 << 16), HostBuffer(1 << 16)
            src.write(b"engine still works")
            assert te.register_memory(src.addr, src.size) == 0
            assert target.register_memory(dst.addr, dst.size) == 0
            assert te.transfer_sync_write(segment_of(target), src.addr, dst.addr, 18) == 0
            assert dst.read(0, 18) == b"engine still works"
            assert te.unregister_memory(src.addr) == 0
            return target, src, dst

        keep = te_transfers()
        assert s.remove("shared", force=True) == 0
        assert s.close() == 0
        keep2 = te_transfers()                 # and after the store is closed
        del keep, keep2
    finally:
        s.close()


def test_setup_errors_and_lifecycle():
    with Master() as m:
        # master not running: a negative code, quickly
        dead = Master()
        dead_addr = dead.addr
        dead.stop()
        s = MooncakeDistributedStore()
        t0 = time.monotonic()
        rc = s.setup("127.0.0.1", "P2PHANDSHAKE", 1 << 20, 1 << 20, "tcp", "", dead_addr)
        assert rc < 0
        assert time.monotonic() - t0 < 15
        assert s.health_check() == 1

        # dict form with human-readable sizes
        base = {"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
                "protocol": "tcp", "master_server_addr": m.addr}
        assert s.setup({**base, "global_segment_size": "16MB", "local_buffer_size": "4mb"}) == 0
        assert m.metric("master_total_capacity_bytes") == 16 << 20
        s2 = MooncakeDistributedStore()
        assert s2.setup({**base, "global_segment_size": "1gb", "local_buffer_size": 1 << 20}) == 0
        assert m.metric("master_total_capacity_bytes") == (16 << 20) + (1 << 30)
        assert s2.close() == 0
        assert m.metric("master_total_capacity_bytes") == 16 << 20   # unmounted on close

        s3 = MooncakeDistributedStore()
        no_host = {k: v for k, v in base.items() if k != "local_hostname"}
        assert s3.setup(no_host) == -600
        assert s3.setup({**base, "global_segment_size": "abc"}) == -600
        assert s3.setup({**base, "local_buffer_size": "12XB"}) == -600
        assert s3.setup({**base, "global_segment_size": -1}) == -600
        assert s3.health_check() == 1

        # a second setup of a running store fails, the first one keeps working
        assert s.setup({**base, "global_segment_size": "1MB"}) < 0
        assert s.health_check() == 0
        assert s.put("life", b"cycle") == 0 and s.get("life") == b"cycle"
        assert m.metric("master_total_capacity_bytes") == 16 << 20

        # after close
        assert s.close() == 0
        assert s.health_check() == 1
        assert s.get("life") == b""
        assert s.put("life2", b"x") < 0
        assert s.is_exist("life") < 0
        assert s.get_size("life") < 0
        assert s.remove("life") < 0
        assert s.get_buffer("life") is None
        assert all(r < 0 for r in s.batch_get_into(["life"], [0], [1]))
        assert s.get_batch(["life"]) == [b""]
        assert s.close() == 0                  # twice
        assert m.metric("master_mounted_segments") == 0

        # master gone while set up: health_check says 2
        s4 = MooncakeDistributedStore()
        assert s4.setup("127.0.0.1", "P2PHANDSHAKE", 0, 1 << 20, "tcp", "", m.addr) == 0
        assert s4.health_check() == 0
    t0 = time.monotonic()
    assert s4.health_check() == 2
    assert time.monotonic() - t0 < 15
    assert s4.close() == 0


@pytest.mark.parametrize("lbuf", [4097, 4096 + 1000, (1 << 20) + 1])
def test_local_buffer_size_not_a_multiple_of_64(master, holder, lbuf):
    """Staging chunks once were local_buffer_size bytes, more than the (64-aligned) staging
    allocator holds: every staged transfer waited out the 30 s timeout and failed."""
    s = new_store(master, local_buffer_size=lbuf)
    try:
        value = data(lbuf, 3 * lbuf + 5)
        t0 = time.monotonic()
        assert s.put(f"lb{lbuf}", value) == 0
        assert s.get(f"lb{lbuf}") == value
        assert time.monotonic() - t0 < 10
        assert s.remove(f"lb{lbuf}", force=True) == 0
    finally:
        s.close()


def test_local_buffer_too_small_is_refused(master):
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 1000, "tcp", "", master.addr) == -600
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 4095, "tcp", "", master.addr) == -600
    assert s.health_check() == 1

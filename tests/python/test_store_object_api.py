"""The rest of MooncakeDistributedStore's object API against a real mooncake_master, with
upstream's signatures and return conventions: setup's engine / local_buffer_size=0 / keyword
arguments, upsert*, get_into_ranges and get sessions, batch_replica_clear, ReplicateConfig's
newer fields, ObjectDataType. Objects lie in a holder client in another process, so every
transfer crosses the engine."""
import tempfile
import time

import pytest

from mc_helpers import engine, segment_of
from store_helpers import Master, StoreProc, buf, data, new_store, ptr, store_fixtures

from mooncake.store import MooncakeDistributedStore, ReplicateConfig  # noqa: E402

np = pytest.importorskip("numpy")

master, holder, store = store_fixtures(lease_ms=500, holder_segment=64 << 20)


# ---- setup ----

def test_setup_accepts_get_engine_result(master, holder):
    """SGLang's HiCache passes TransferEngine.get_engine() (an InnerTransferEngine)."""
    te = engine.TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    inner = te.get_engine()
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 4 << 20, 4 << 20, "tcp", "", master.addr,
                   engine=inner) == 0
    try:
        assert s.put("ge", b"via get_engine") == 0
        assert holder.call("result = store.get('ge')") == b"via get_engine"
        assert s.get_hostname() == segment_of(te)
    finally:
        assert s.remove("ge", force=True) == 0
        assert s.close() == 0
    # the engine outlives the store
    assert te.get_engine() is not None


def test_setup_local_buffer_size_zero(master, holder):
    s = new_store(master, local_buffer_size=0)
    try:
        # unregistered bytes: refused with INVALID_PARAMS, not staged, not crashed
        assert s.put("z0", b"abc") == -600
        assert s.is_exist("z0") == 0
        # registered memory moves zero copy
        a = buf(1 << 20, seed=5)
        assert s.register_buffer(ptr(a), a.nbytes) == 0
        assert s.put_from("z1", ptr(a), a.nbytes) == 0
        b = buf(1 << 20)
        assert s.register_buffer(ptr(b), b.nbytes) == 0
        assert s.get_into("z1", ptr(b), b.nbytes) == a.nbytes
        assert bytes(b) == bytes(a)
        # get() needs staging (fresh bytes): a miss-like b"" with a log line
        assert s.get("z1") == b""
        assert holder.call("result = store.get('z1') == data(5, 1 << 20)") is True
        assert s.unregister_buffer(ptr(a)) == 0 and s.unregister_buffer(ptr(b)) == 0
        assert s.remove("z1", force=True) == 0
    finally:
        s.close()


def test_setup_keyword_arguments(master):
    s = MooncakeDistributedStore()
    args = ("127.0.0.1", "P2PHANDSHAKE", 0, 1 << 20, "tcp", "", master.addr)
    # The disk tier (tests/python/test_disk_tier.py): a directory that is not there is
    # INVALID_PARAMS; a master without --enable_offload refuses it (UNABLE_OFFLOAD).
    assert s.setup(*args, enable_ssd_offload=True,
                   ssd_offload_path="/nonexistent/mooncake-offload") == -600
    with tempfile.TemporaryDirectory() as d:
        assert s.setup(*args, enable_ssd_offload=True, ssd_offload_path=d) == -1300
    # A tenant id is this client's (tests/python/test_tenants.py); a bad one fails setup.
    for bad in ("_reserved", "a\nb", "x" * 129):
        assert s.setup(*args, tenant_id=bad) == -600
    assert s.setup(*args, tenant_id="team-a") == 0
    assert s.close() == 0
    # The client HTTP port (tests/python/test_client_metrics.py): a port that is none fails.
    assert s.setup(*args, enable_client_http_server=True, client_http_port=0) == -600
    assert s.health_check() == 1
    assert s.setup(*args, engine=None, enable_ssd_offload=False, ssd_offload_path="",
                   tenant_id="default", enable_client_http_server=False,
                   client_http_port=9300) == 0
    assert s.close() == 0
    base = {"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
            "master_server_addr": master.addr, "global_segment_size": 0}
    assert s.setup({**base, "enable_ssd_offload": "true",
                    "ssd_offload_path": "relative/dir"}) == -600
    assert s.setup({**base, "tenant_id": "_t1"}) == -600
    assert s.setup({**base, "enable_client_http_server": "maybe"}) == -600
    assert s.setup({**base, "tenant_id": "default", "enable_ssd_offload": "false"}) == 0
    assert s.close() == 0


def test_object_data_type_and_replicate_config_fields(store):
    from mooncake.store import ObjectDataType
    assert [e.name for e in ObjectDataType.__members__.values()] == [
        "UNKNOWN", "KVCACHE", "TENSOR", "WEIGHT", "SAMPLE", "ACTIVATION", "GRADIENT",
        "OPTIMIZER_STATE", "METADATA", "GENERAL"]
    assert int(ObjectDataType.KVCACHE) == 1 and int(ObjectDataType.GENERAL) == 9
    cfg = ReplicateConfig()
    assert (cfg.nof_replica_num, cfg.dfs_replica_num, cfg.preferred_nof_segments,
            cfg.data_type, cfg.group_ids) == (0, 0, [], ObjectDataType.UNKNOWN, None)
    cfg.data_type = ObjectDataType.KVCACHE         # a label: honoured as one
    assert store.put("dt", b"kv", cfg) == 0 and store.get("dt") == b"kv"
    for field, value in [("nof_replica_num", 1), ("dfs_replica_num", 1),
                         ("preferred_nof_segments", ["nof0"])]:
        bad = ReplicateConfig()
        setattr(bad, field, value)
        assert store.put("nof", b"x", bad) == -600, field
        assert store.upsert("nof", b"x", bad) == -600, field
        assert store.is_exist("nof") == 0
    from mooncake.store import SoftPinAction
    ttl = ReplicateConfig()
    ttl.soft_pin_ttl_ms = 1000                     # a TTL needs ENABLE (upstream's rule)
    assert store.put("ttl", b"x", ttl) == -600 and store.upsert("ttl", b"x", ttl) == -600
    ttl.soft_pin_action = SoftPinAction.DISABLE
    assert store.upsert("ttl", b"x", ttl) == -600
    ttl.soft_pin_action = SoftPinAction.ENABLE
    assert store.put("ttl", b"x", ttl) == 0
    ttl.soft_pin_action, ttl.with_soft_pin = SoftPinAction.PRESERVE, True   # the older spelling
    assert store.upsert("ttl", b"y", ttl) == 0 and store.get("ttl") == b"y"
    g = ReplicateConfig()
    g.group_ids = ["g1", ""]                       # one per key
    a = buf(64, seed=1)
    assert store.register_buffer(ptr(a), a.nbytes) == 0
    try:
        assert store.batch_put_from(["g1", "g2"], [ptr(a), ptr(a, 32)], [32, 32], g) == [0, 0]
        assert store.batch_put_from(["g3"], [ptr(a)], [32], g) == [-600]
    finally:
        store.unregister_buffer(ptr(a))
    assert "nof_replica_num: 0" in str(ReplicateConfig())


def test_upsert_family(master, store, holder):
    assert MooncakeDistributedStore().upsert("u", b"x") == -600   # not set up (upstream: -600)
    assert store.upsert("u", b"first") == 0                       # new key: a put
    assert store.get("u") == b"first"
    assert store.put("u", b"ignored") == 0 and store.get("u") == b"first"
    big = data(3, 3 << 20)
    assert store.upsert("u", big) == 0                            # another size
    assert store.get("u") == big
    assert holder.call("result = store.get('u') == data(3, 3 << 20)") is True
    assert store.upsert_parts("u", b"ab", memoryview(b"cd"), bytearray(b"ef")) == 0
    assert store.get("u") == b"abcdef"
    assert store.upsert_batch(["u", "u2"], [b"one", b"two"]) == 0
    assert store.get_batch(["u", "u2"]) == [b"one", b"two"]
    assert store.upsert_batch(["u"], [b"1", b"2"]) == -600
    a = buf(1 << 20, seed=4)
    assert store.register_buffer(ptr(a), a.nbytes) == 0
    try:
        assert store.upsert_from("u", ptr(a), 1000) == 0
        assert store.get("u") == bytes(a[:1000])
        assert store.batch_upsert_from(["u", "u2", "u3"], [ptr(a), ptr(a, 10), ptr(a, 20)],
                                       [10, 20, 30]) == [0, 0, 0]
        assert store.get_batch(["u", "u2", "u3"]) == [bytes(a[:10]), bytes(a[10:30]),
                                                      bytes(a[20:50])]
        assert store.batch_upsert_from(["u"], [ptr(a)], [1, 2]) == [-600]
    finally:
        store.unregister_buffer(ptr(a))
    # the old value's space is not reused while a reader's lease lasts: the master's deferred
    # bytes count it after an upsert of a just-read key
    assert store.get("u") == bytes(a[:10])
    assert store.upsert("u", b"after read") == 0
    assert master.metric("master_deferred_free_bytes") > 0
    assert store.get("u") == b"after read"
    z = new_store(master, local_buffer_size=0)
    try:
        assert z.upsert("u", b"unregistered") == -600
        assert store.get("u") == b"after read"
    finally:
        z.close()


def test_get_into_ranges(store, holder):
    v1, v2 = data(11, 65536), data(12, 10000)
    assert holder.call("result = [store.put('r1', data(11, 65536)), store.put('r2', data(12, 10000))]") == [0, 0]
    a, b = buf(1 << 16), buf(1 << 12)
    for x in (a, b):
        assert store.register_buffer(ptr(x), x.nbytes) == 0
    try:
        res = store.get_into_ranges(
            [ptr(a), ptr(b)], [["r1", "r2"], ["r1", "missing"]],
            [[[0, 1000], [5000]], [[0, 100], [0]]],          # dst offsets
            [[[100, 60000], [9000]], [[65000, 65531], [0]]],  # src offsets
            [[[500, 1536], [1000]], [[100, 6], [10]]])        # sizes
        assert res == [[[500, 1536], [1000]], [[100, -600], [-704]]]  # 65531 + 6 > 65536
        assert bytes(a[:500]) == v1[100:600]
        assert bytes(a[1000:2536]) == v1[60000:61536]
        assert bytes(a[5000:6000]) == v2[9000:10000]
        assert bytes(b[:100]) == v1[65000:65100]
        # past the registered buffer's end; an unregistered buffer; shape mismatch
        assert store.get_into_ranges([ptr(b)], [["r1"]], [[[4000]]], [[[0]]], [[[200]]]) == [[[-600]]]
        c = buf(4096)
        assert store.get_into_ranges([ptr(c)], [["r1"]], [[[0]]], [[[0]]], [[[10]]]) == [[[-600]]]
        assert store.get_into_ranges([ptr(a)], [["r1"]], [[[0, 1]]], [[[0]]], [[[1, 1]]]) == [[[-600, -600]]]
    finally:
        for x in (a, b):
            store.unregister_buffer(ptr(x))


def test_get_sessions(store, holder):
    v1 = data(21, 1 << 20)
    assert holder.call("result = store.put('s1', data(21, 1 << 20))") == 0
    a = buf(1 << 20)
    assert store.register_buffer(ptr(a), a.nbytes) == 0
    try:
        assert store.batch_get_session_start(["s1", "nope"]) == [0, -704]
        got = store.batch_get_into_multi_buffer_ranges(
            ["s1", "nope"], [[ptr(a), ptr(a, 4096)], [ptr(a)]], [[100, 2000], [1]],
            [[0, (1 << 20) - 2000], [0]])
        assert got == [2100, -600]                     # "nope" has no session
        assert bytes(a[:100]) == v1[:100]
        assert bytes(a[4096:6096]) == v1[-2000:]
        assert store.batch_get_into_multi_buffer_ranges(["s1"], [[ptr(a)]], [[10]],
                                                        [[(1 << 20) - 5]]) == [-600]
        assert store.batch_get_into_multi_buffer_ranges(["s1"], [[ptr(a)]], [[10, 1]],
                                                        [[0]]) == [-600]
        # while the session holds the lease, remove without force is refused
        assert store.remove("s1") == -706
        assert store.batch_get_session_end(["s1", "never-started"]) == 0
        assert store.batch_get_into_multi_buffer_ranges(["s1"], [[ptr(a)]], [[10]], [[0]]) == [-600]
        # a session outlives its lease: LEASE_EXPIRED, and the session ends
        assert store.batch_get_session_start(["s1"]) == [0]
        time.sleep(0.6)                                # the module master's lease is 500 ms
        assert store.batch_get_into_multi_buffer_ranges(["s1"], [[ptr(a)]], [[10]], [[0]]) == [-707]
        assert store.batch_get_into_multi_buffer_ranges(["s1"], [[ptr(a)]], [[10]], [[0]]) == [-600]
        assert MooncakeDistributedStore().batch_get_session_start(["s1"]) == []
    finally:
        store.unregister_buffer(ptr(a))


def test_put_sessions(store, holder):
    a = buf(1 << 16, seed=31)
    assert store.register_buffer(ptr(a), a.nbytes) == 0
    try:
        assert store.batch_put_session_start(["p1", "p2"], [3000, 100]) == [0, 0]
        assert store.batch_put_session_start(["p1"], [10]) == [-600]      # already open
        assert store.is_exist("p1") == 0                                   # invisible until end
        # p1 in two calls, p2 in one; a range past p2's end and a key without a session
        assert store.batch_put_from_multi_buffer_ranges(
            ["p1", "p2", "none"], [[ptr(a), ptr(a, 1000)], [ptr(a)], [ptr(a)]],
            [[1000, 1000], [101], [1]], [[0, 1000], [0], [0]]) == [2000, -600, -600]
        assert store.batch_put_from_multi_buffer_ranges(
            ["p1", "p2"], [[ptr(a, 2000)], [ptr(a, 5)]], [[1000], [100]], [[2000], [0]]) == [1000, 100]
        assert holder.call("result = store.is_exist('p1')") == 0
        assert store.batch_put_session_end(["p1", "none"]) == [0, -600]
        assert store.batch_put_session_revoke(["p2"]) == [0]
        assert store.get("p1") == bytes(a[:3000])
        assert holder.call("result = store.get('p1')") == bytes(a[:3000])
        assert store.is_exist("p2") == 0
        assert store.batch_put_session_start(["p1"], [10]) == [-705]       # exists now
        assert store.batch_put_session_end(["p1"]) == [-600]                # session is over
        assert MooncakeDistributedStore().batch_put_session_start(["x"], [1]) == []
    finally:
        store.unregister_buffer(ptr(a))


def test_batch_replica_clear(master, store, holder):
    assert store.put("c1", b"1") == 0 and store.put("c2", b"2") == 0 and store.put("c3", b"3") == 0
    assert holder.call("result = store.put('theirs', b'h')") == 0
    assert store.batch_replica_clear(["c1"]) == []    # a fresh write counts as leased (upstream)
    time.sleep(0.6)
    assert store.get("c2") == b"2"                     # leased for 500 ms
    assert store.batch_replica_clear(["c1", "c2", "theirs", "absent"]) == ["c1"]
    assert store.is_exist("c1") == 0 and store.is_exist("c2") == 1
    assert holder.call("result = store.get('theirs')") == b"h"
    time.sleep(0.6)
    assert store.batch_replica_clear(["c2"], "some-other-segment") == []
    assert store.batch_replica_clear(["c2", "c3"], holder.hostname) == ["c2", "c3"]
    assert store.is_exist("c2") == 0 and store.is_exist("c3") == 0
    assert MooncakeDistributedStore().batch_replica_clear(["c1"]) == []


_WRITER = """
def mk(w, v):
    n = 1024 + (v * 7919) % (32 * 1024)
    return b"%08d:%08d:%08d:" % (w, v, n) + data(w * 1000003 + v, n)
t_end = time.monotonic() + dur
v, bad = 0, []
while time.monotonic() < t_end:
    rc = store.upsert("hot", mk(W, v))
    if rc != 0:
        bad.append(rc)
    v += 1
result = [v, bad]
"""

_READER = """
def check(b):
    if len(b) < 27:
        return False
    w, v, n = int(b[0:8]), int(b[9:17]), int(b[18:26])
    return len(b) == 27 + n and b[27:] == data(w * 1000003 + v, n)
rbuf = np.zeros(64 << 10, dtype=np.uint8)
assert store.register_buffer(rbuf.ctypes.data, rbuf.nbytes) == 0
t_end = time.monotonic() + dur
gets, bad, seen = 0, [], set()
while time.monotonic() < t_end:
    n = store.get_into("hot", rbuf.ctypes.data, rbuf.nbytes)   # the size, or the error code
    gets += 1
    b = rbuf[:n].tobytes() if n > 0 else b""
    if not check(b):
        bad.append(n)
    else:
        seen.add(b[:17])
store.unregister_buffer(rbuf.ctypes.data)
result = [gets, bad[:5], len(bad), len(seen)]
"""


def _start(proc, code, **variables):
    import json
    proc.proc.stdin.write(json.dumps({"code": code, "vars": variables}) + "\n")
    proc.proc.stdin.flush()


def _finish(proc, timeout=120):
    import json
    from store_helpers import _decode, _readline
    line = _readline(proc.proc.stdout, timeout)
    assert line, "worker did not answer"
    reply = json.loads(line)
    assert "error" not in reply, reply.get("error")
    return _decode(reply["result"])


def test_concurrent_upserts_every_get_is_one_complete_version():
    """Two writer processes upsert one key with self-describing values of changing sizes while
    two reader processes get it: every get returns one writer's complete version."""
    # Each replaced version that was read keeps its space for one lease TTL (the readers may
    # still copy it), and a pool held that way refuses upserts (NO_AVAILABLE_HANDLE), as it
    # should. So the pool must outlast the rate: on a 2-core machine same-host upserts reach
    # ~3k versions/s per writer (1-33 KiB each, most of them read), ~100 MB held per second
    # of lease: a 1 s lease and 1 GiB (sparse until written) leave a 10x margin.
    with Master(default_kv_lease_ttl=1000) as m:
        holder = StoreProc(m, global_segment_size=1 << 30)
        writers = [StoreProc(m, global_segment_size=32 << 20) for _ in range(2)]
        readers = [StoreProc(m, global_segment_size=0) for _ in range(2)]
        try:
            assert writers[0].call("result = store.upsert('hot', b'%08d:%08d:%08d:' % (9, 0, 1) + data(9 * 1000003, 1))") == 0
            for w, p in enumerate(writers):
                _start(p, _WRITER, W=w, dur=4.0)
            for p in readers:
                _start(p, _READER, dur=4.0)
            wres = [_finish(p) for p in writers]
            rres = [_finish(p) for p in readers]
            for versions, bad in wres:
                assert versions > 5 and bad == [], wres
            # (a cache may evict the key: then gets miss; the pool is sized so that it does not)
            assert m.metric("master_evicted_key_count") == 0, "evicted: pool too small"
            for gets, bad, nbad, seen in rres:
                assert gets > 5 and nbad == 0, rres   # bad: get_into's codes, or sizes
            assert sum(r[3] for r in rres) > 2       # readers saw several versions
        finally:
            for p in writers + readers + [holder]:
                p.close()


def test_forced_remove_by_the_only_reader_frees_at_once(master, store, holder):
    """A get then remove(force) in one client frees the space at once (the client passes the
    lease of its own completed read); a lease of another client's, or a read session still
    open, keeps the space in the graveyard until the lease lapses."""
    time.sleep(0.8)  # earlier tests' graves are reaped (lease 500 ms)
    assert master.metric("master_deferred_free_bytes") == 0
    value = b"r" * 4096
    assert store.put("solo", value) == 0
    assert store.get("solo") == value
    assert store.remove("solo", True) == 0
    assert master.metric("master_deferred_free_bytes") == 0
    # a session's completed read: freed at once too, once the session ended
    assert store.put("solo2", value) == 0
    assert store.batch_get_session_start(["solo2"]) == [0]
    assert store.batch_get_session_end(["solo2"]) == 0
    assert store.remove("solo2", True) == 0
    assert master.metric("master_deferred_free_bytes") == 0
    # an open session is a read in flight: the space waits
    assert store.put("solo3", value) == 0
    assert store.batch_get_session_start(["solo3"]) == [0]
    assert store.remove("solo3", True) == 0
    assert master.metric("master_deferred_free_bytes") >= 4096
    assert store.batch_get_session_end(["solo3"]) == 0
    time.sleep(0.8)
    # another client's lease: the space waits for it
    assert store.put("shared", value) == 0
    assert holder.call("result = store.get('shared')") == value
    assert store.get("shared") == value
    assert store.remove("shared", True) == 0
    assert master.metric("master_deferred_free_bytes") >= 4096

"""The Store across processes: a real mooncake_master and several client processes (writers,
readers, segment holders); a holder killed with SIGKILL; eviction of a small pool."""
import time

import pytest

from mc_helpers import engine  # noqa: F401  (skips the module without the package)
from store_helpers import Master, StoreProc, data, wait_until

from mooncake.store import MooncakeDistributedStore, ReplicateConfig  # noqa: E402

np = pytest.importorskip("numpy")


@pytest.fixture
def procs():
    """Makes StoreProcs that are all ended at teardown."""
    made = []

    def make(*args, **kw):
        p = StoreProc(*args, **kw)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


# ---- round trips between processes --------------------------------------------------------

@pytest.fixture(scope="module")
def trio():
    """A master, a holder of 160 MiB, and a writer and a reader that contribute nothing and
    stage through 4 MiB local buffers."""
    m = Master()
    made = []
    try:
        holder = StoreProc(m, global_segment_size=160 << 20)
        made.append(holder)
        writer = StoreProc(m, global_segment_size=0, local_buffer_size=4 << 20)
        made.append(writer)
        reader = StoreProc(m, global_segment_size=0, local_buffer_size=4 << 20)
        made.append(reader)
        yield m, holder, writer, reader
    finally:
        for p in made:
            p.close()
        m.stop()


READ = """
expected = data(seed, n)
got = store.get(key)
ok_get = got == expected
del got
plain = np.zeros(n + 16, dtype=np.uint8)           # unregistered: staged
rc_plain = store.get_into(key, plain.ctypes.data + 3, n)
ok_plain = plain[3:3 + n].tobytes() == expected and not plain[:3].any() and not plain[3 + n:].any()
reg = np.zeros(n, dtype=np.uint8)                   # registered: direct
assert store.register_buffer(reg.ctypes.data, n) == 0
rc_reg = store.get_into(key, reg.ctypes.data, n)
ok_reg = reg.tobytes() == expected
assert store.unregister_buffer(reg.ctypes.data) == 0
h = store.get_buffer(key)
ok_buf = h is not None and bytes(memoryview(h)) == expected
result = [store.get_size(key), ok_get, rc_plain, ok_plain, rc_reg, ok_reg, ok_buf]
"""


@pytest.mark.parametrize("n", [1, 4096, (1 << 20) + 3, 64 << 20])
def test_round_trip_between_processes(trio, n):
    m, holder, writer, reader = trio
    key, seed = f"rt{n}", n % 1000
    assert writer.call("result = store.put(key, data(seed, n))", key=key, seed=seed, n=n) == 0
    assert reader.call(READ, key=key, seed=seed, n=n) == [n, True, n, True, n, True, True]
    # put_from of unregistered memory in the writer, read by the reader
    key2 = key + "-from"
    assert writer.call("a = np.frombuffer(data(seed + 1, n), dtype=np.uint8).copy()\n"
                       "result = store.put_from(key, a.ctypes.data, n)",
                       key=key2, seed=seed, n=n) == 0
    assert reader.call("result = store.get(key) == data(seed + 1, n)",
                       key=key2, seed=seed, n=n) is True
    assert m.metric("master_allocated_bytes") >= 2 * n
    assert writer.call("result = store.batch_remove(keys, force=True)",
                       keys=[key, key2]) == [0, 0]


# ---- replicas and a killed client ---------------------------------------------------------

def test_replicas_survive_a_killed_holder(procs):
    with Master(client_ttl=2) as m:
        a = procs(m, global_segment_size=0, local_buffer_size=4 << 20)
        b = procs(m, global_segment_size=32 << 20)
        c = procs(m, global_segment_size=32 << 20)
        assert b.hostname != c.hostname
        n, k = 256 << 10, 4
        # replica_num=2: one replica on each of B and C
        put2 = """
cfg = ReplicateConfig()
cfg.replica_num = 2
result = [store.put(f"r2_{i}", data(i, n), cfg) for i in range(k)]
"""
        assert a.call(put2, n=n, k=k) == [0] * k
        assert m.metric("master_allocated_bytes") == 2 * k * n
        # replica_num=1, placed on B
        put1 = """
cfg = ReplicateConfig()
cfg.preferred_segment = seg
result = [store.put(f"r1_{i}", data(100 + i, n), cfg) for i in range(k)]
"""
        assert a.call(put1, n=n, k=k, seg=b.hostname) == [0] * k
        assert m.metric("master_allocated_bytes") == 3 * k * n
        # B holds the r1 objects (a local read there), C does not have them in its segment
        check = "result = [store.get(f'r1_{i}') == data(100 + i, n) for i in range(k)]"
        assert b.call(check, n=n, k=k) == [True] * k

        b.kill()  # SIGKILL: no unmount, no goodbye
        get2 = "result = [store.get(f'r2_{i}') == data(i, n) for i in range(k)]"
        # before the master notices: reads fall back to the replica on C
        assert a.call(get2, n=n, k=k) == [True] * k
        # past --client_ttl the master drops B's segment and its replicas
        wait_until(lambda: m.metric("master_mounted_segments") == 1, 15,
                   what="the master to expire the killed client")
        assert m.metric("master_expired_clients_total") == 1
        assert m.metric("master_total_capacity_bytes") == 32 << 20
        assert a.call(get2, n=n, k=k) == [True] * k
        lost = """
buf = np.zeros(n, dtype=np.uint8)
result = [[store.get(f"r1_{i}"), store.is_exist(f"r1_{i}"),
           store.get_into(f"r1_{i}", buf.ctypes.data, n)] for i in range(k)]
"""
        assert a.call(lost, n=n, k=k) == [[b"", 0, -704]] * k
        # the survivors are on C alone now
        assert m.metric("master_allocated_bytes") == k * n
        assert c.call(get2, n=n, k=k) == [True] * k
        # new puts still work, with as many replicas as there are segments
        assert a.call(put2.replace("r2_", "r3_"), n=n, k=1) == [0]
        assert a.call("result = store.get('r3_0') == data(0, n)", n=n) is True


# ---- eviction -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_pool():
    """A master with long leases and a 32 MiB pool in a holder process."""
    m = Master(default_kv_lease_ttl=60000)
    holder = None
    try:
        holder = StoreProc(m, global_segment_size=32 << 20)
        yield m, holder
    finally:
        if holder is not None:
            holder.close()
        m.stop()


@pytest.fixture
def pool_client(small_pool):
    m, _ = small_pool
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 4 << 20, "tcp", "", m.addr) == 0
    yield s
    s.remove_all(force=True)
    s.close()


MiB = 1 << 20


def test_eviction_keeps_puts_succeeding(small_pool, pool_client):
    m, _ = small_pool
    s = pool_client
    keys = [f"ev{i}" for i in range(96)]   # 3x the pool
    for i, k in enumerate(keys):
        assert s.put(k, data(i, MiB)) == 0, k
    assert s.get(keys[-1]) == data(95, MiB)
    exist = s.batch_is_exist(keys)
    assert exist[-1] == 1 and exist[0] == 0
    assert sum(exist) <= 32
    mt = m.metrics()
    assert mt["master_evicted_key_count"] >= 96 - 32
    assert mt["master_allocated_bytes"] <= mt["master_total_capacity_bytes"] == 32 * MiB
    # whatever is still there is intact
    for i, (k, e) in enumerate(zip(keys, exist)):
        if e:
            assert s.get(k) == data(i, MiB), k


def test_soft_pinned_objects_outlive_eviction(small_pool, pool_client):
    from mooncake.store import ReplicateConfig, SoftPinAction
    s = pool_client
    pin = ReplicateConfig()
    pin.soft_pin_action = SoftPinAction.ENABLE        # upstream 0.3.13's spelling
    assert "soft_pin_action: ENABLE" in str(pin)
    old_pin = ReplicateConfig()
    old_pin.with_soft_pin = True                      # the older spelling
    assert s.put("pinned-a", data(7, MiB), pin) == 0  # the oldest objects of the pool
    assert s.put("pinned-b", data(8, MiB), old_pin) == 0
    for i in range(64):                               # 2x the pool of plain objects after them
        assert s.put(f"plain{i}", data(100 + i, MiB)) == 0
    assert s.batch_is_exist(["pinned-a", "pinned-b", "plain0", "plain63"]) == [1, 1, 0, 1]
    assert s.get("pinned-a") == data(7, MiB) and s.get("pinned-b") == data(8, MiB)
    # A pin with a short TTL of its own lapses: then it is evicted like the rest.
    short = ReplicateConfig()
    short.soft_pin_action = SoftPinAction.ENABLE
    short.soft_pin_ttl_ms = 200
    assert s.put("short-pin", data(9, MiB), short) == 0
    time.sleep(0.4)
    for i in range(40):
        assert s.put(f"more{i}", data(300 + i, MiB)) == 0
    assert s.is_exist("short-pin") == 0
    assert s.batch_is_exist(["pinned-a", "pinned-b"]) == [1, 1]


def fill_until_refused(s, prefix, config=None, read=False, limit=100):
    """Puts 1 MiB objects until a put fails; returns (number stored, the failing code)."""
    for i in range(limit):
        v = data(1000 + i, MiB)
        rc = s.put(f"{prefix}{i}", v) if config is None else s.put(f"{prefix}{i}", v, config)
        if rc != 0:
            return i, rc
        if read:
            assert s.get(f"{prefix}{i}") == v
    return limit, 0


def test_put_fails_when_every_object_is_leased(small_pool, pool_client):
    s = pool_client
    stored, rc = fill_until_refused(s, "lease", read=True)
    assert rc == -200
    assert 24 <= stored <= 32, stored
    assert s.put("one-more", data(1, MiB)) == -200
    assert s.batch_is_exist([f"lease{i}" for i in range(stored)]) == [1] * stored
    assert s.remove_all() == 0                  # all leased
    assert s.remove_all(force=True) == stored
    assert s.put("one-more", data(1, MiB)) == 0


def test_put_fails_when_every_object_is_hard_pinned(small_pool, pool_client):
    s = pool_client
    cfg = ReplicateConfig()
    cfg.with_hard_pin = True
    stored, rc = fill_until_refused(s, "pin", config=cfg)
    assert rc == -200
    assert 24 <= stored <= 32, stored
    assert s.put("plain", data(2, MiB)) == -200  # nothing evictable for it either
    assert s.batch_is_exist([f"pin{i}" for i in range(stored)]) == [1] * stored
    assert s.get("pin0") == data(1000, MiB)
    assert s.remove_all(force=True) == stored
    assert s.put("plain", data(2, MiB)) == 0


# ---- a master restart, and close() under traffic -------------------------------------------

def test_master_restart_remounts_segments(procs):
    lease_ms = 3000
    m = Master(client_ttl=2, default_kv_lease_ttl=lease_ms)
    try:
        holder = procs(m, global_segment_size=16 << 20)
        client = procs(m, global_segment_size=0, local_buffer_size=1 << 20)
        assert client.call("result = store.put('before', b'x' * 1000)") == 0
        rpc_port, metrics_port = m.rpc_port, m.metrics_port
        m.proc.kill()                       # a crash: no goodbye to the clients
        m.proc.wait()
        m.stop()
        assert client.call("result = store.health_check()") == 2
        assert client.call("result = store.put('during', b'y')") < 0
        assert client.call("result = store.get('before')") == b""
        restarted = time.monotonic()
        m = Master(rpc_port=rpc_port, metrics_port=metrics_port, client_ttl=2,
                   default_kv_lease_ttl=lease_ms)
        # the holder's heartbeat finds itself unknown and mounts its segment again
        wait_until(lambda: m.metric("master_mounted_segments") == 1, 30,
                   what="the holder to remount its segment")
        assert m.metric("master_total_capacity_bytes") == 16 << 20
        wait_until(lambda: client.call("result = store.health_check()") == 0, 30,
                   interval=0.2, what="the client to reach the new master")
        # the old master's objects are gone; new ones work
        assert client.call("result = store.get('before')") == b""
        # The remounted segment takes new objects one lease after its remount (readers may
        # still hold addresses in it from the old master's leases): puts fail until then.
        wait_until(lambda: client.call("result = store.put('after', data(1, 300000))") == 0,
                   30, interval=0.1, what="a put into the remounted segment")
        assert time.monotonic() - restarted >= lease_ms / 1000 - 0.1
        assert client.call("result = store.get('after') == data(1, 300000)") is True
        assert holder.call("result = store.get('after') == data(1, 300000)") is True
    finally:
        m.stop()


CLOSE_UNDER_TRAFFIC = """
import threading
stop = False
codes = []
def run(t):
    a = np.frombuffer(data(t, 256 << 10), dtype=np.uint8).copy()
    i = 0
    while not stop:
        k = f"c{t}_{i}"
        rc = store.put(k, a)
        g = store.get(k)
        if rc == 0 and g:
            assert g == a.tobytes()
            store.remove(k, force=True)
        codes.append(rc)
        i += 1
ts = [threading.Thread(target=run, args=(t,)) for t in range(6)]
[t.start() for t in ts]
time.sleep(0.5)
rc_close = store.close()
time.sleep(0.2)
stop = True
[t.join() for t in ts]
result = [rc_close, codes.count(0) > 0, min(codes) < 0, store.health_check(), store.close(),
          store.get("c0_0")]
"""


def test_close_while_threads_are_busy(procs):
    """close() while six threads put and get: no crash, the calls after it fail cleanly, and
    the segment leaves the pool once the calls in flight are done."""
    with Master() as m:
        holder = procs(m, global_segment_size=64 << 20)
        client = procs(m, global_segment_size=16 << 20, local_buffer_size=1 << 20)
        assert m.metric("master_mounted_segments") == 2
        assert client.call(CLOSE_UNDER_TRAFFIC, timeout=60) == [0, True, True, 1, 0, b""]
        wait_until(lambda: m.metric("master_mounted_segments") == 1, 10,
                   what="the closed client's segment to be unmounted")
        assert holder.call("result = store.health_check()") == 0

"""The rest of MooncakeDistributedStore's object API against a real mooncake_master, with
upstream's signatures and return conventions: setup's engine / local_buffer_size=0 / keyword
arguments, upsert*, get_into_ranges and get sessions, batch_replica_clear, ReplicateConfig's
newer fields, ObjectDataType. Objects lie in a holder client in another process, so every
transfer crosses the engine."""
import pytest

from mc_helpers import engine, segment_of
from store_helpers import Master, StoreProc, data

from mooncake.store import MooncakeDistributedStore, ReplicateConfig  # noqa: E402

np = pytest.importorskip("numpy")


@pytest.fixture(scope="module")
def master():
    m = Master(default_kv_lease_ttl=500)
    yield m
    m.stop()


@pytest.fixture(scope="module")
def holder(master):
    h = StoreProc(master, global_segment_size=64 << 20)
    yield h
    h.close()


def new_store(master, global_segment_size=0, local_buffer_size=16 << 20, **kw):
    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", "P2PHANDSHAKE", global_segment_size, local_buffer_size, "tcp", "",
                 master.addr, **kw)
    assert rc == 0
    return s


@pytest.fixture
def store(master, holder):
    s = new_store(master)
    yield s
    s.remove_all(force=True)
    s.close()


def buf(n, seed=None):
    a = np.zeros(n, dtype=np.uint8)
    if seed is not None:
        a[:] = np.frombuffer(data(seed, n), dtype=np.uint8)
    return a


def ptr(a, off=0):
    return a.ctypes.data + off


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
    assert s.setup(*args, enable_ssd_offload=True, ssd_offload_path="/tmp/x") == -600
    assert s.setup(*args, tenant_id="team-a") == -600
    assert s.setup(*args, enable_client_http_server=True, client_http_port=9301) == -600
    assert s.health_check() == 1
    assert s.setup(*args, engine=None, enable_ssd_offload=False, ssd_offload_path="",
                   tenant_id="default", enable_client_http_server=False,
                   client_http_port=9300) == 0
    assert s.close() == 0
    base = {"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
            "master_server_addr": master.addr, "global_segment_size": 0}
    assert s.setup({**base, "enable_ssd_offload": "true"}) == -600
    assert s.setup({**base, "tenant_id": "t1"}) == -600
    assert s.setup({**base, "enable_client_http_server": "maybe"}) == -600
    assert s.setup({**base, "tenant_id": "default", "enable_ssd_offload": "false"}) == 0
    assert s.close() == 0
